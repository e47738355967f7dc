// Blocking steps of the event loop's work (a commit, an engine pause taken by a worker, an early
// pause undone) run on threads kept for the daemon's life (common/kept_threads.h), and resolve a
// KJ promise on the loop when they return, through an eventfd the loop watches.
//
// Threading: Run and the destructor on the event loop thread that owns `io`; each function runs
// on one of the kept threads, never on the loop, and never calls into the loop itself.
#ifndef REFIT_SERVER_BLOCKING_H_
#define REFIT_SERVER_BLOCKING_H_

#include <cstddef>
#include <functional>

#include "common/kept_threads.h"
#include "kj/async-io.h"

namespace refit::server {

class BlockingThreads {
 public:
  explicit BlockingThreads(kj::LowLevelAsyncIoProvider& io) : io_(io) {}

  // Runs `fn` on a kept thread (KeptThreads::Start: steps in flight at once each have their own).
  // The promise resolves on the loop once `fn` returned. Destroying it before then calls `cancel`
  // (which must make `fn` return, e.g. by aborting a session) and waits for `fn` to return.
  kj::Promise<void> Run(std::function<void()> fn, std::function<void()> cancel = nullptr);

  size_t threads() const { return threads_.threads(); }

 private:
  kj::LowLevelAsyncIoProvider& io_;
  KeptThreads threads_;  // joined at destruction, once the steps in flight returned
};

}  // namespace refit::server

#endif  // REFIT_SERVER_BLOCKING_H_
