// Blocking steps of the event loop's work (a commit, an engine pause taken by a worker, an early
// pause undone) run on a few threads kept for the daemon's life, and resolve a KJ promise on the
// loop when they return. The threads are kept because starting one per step, and joining it
// when its promise resolves, put a thread's start and exit on the refit's path: the join of the
// commit's thread came between the commit's last step and the engine's resume (docs/benchmarks.md
// runs 29-31).
//
// Threading: Run and the destructor on the event loop thread that owns `io`; each function runs
// on one of the kept threads, never on the loop, and never calls into the loop itself.
#ifndef REFIT_SERVER_BLOCKING_H_
#define REFIT_SERVER_BLOCKING_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kj/async-io.h"

namespace refit::server {

class BlockingThreads {
 public:
  explicit BlockingThreads(kj::LowLevelAsyncIoProvider& io) : io_(io) {}
  // Joins every thread, each once the functions queued before have returned.
  ~BlockingThreads();
  BlockingThreads(const BlockingThreads&) = delete;
  BlockingThreads& operator=(const BlockingThreads&) = delete;

  // Runs `fn` on an idle kept thread, or on a new one when none is idle (calls in flight at once
  // each have their own). The promise resolves on the loop once `fn` returned. Destroying it
  // before then calls `cancel` (which must make `fn` return, e.g. by aborting a session) and waits
  // for `fn` to return.
  kj::Promise<void> Run(std::function<void()> fn, std::function<void()> cancel = nullptr);

  // Threads started so far (none exits before the destructor).
  size_t threads() const;

 private:
  struct Job;
  struct Waiter;
  void Serve();
  bool Wanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }

  kj::LowLevelAsyncIoProvider& io_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting for a job
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace refit::server

#endif  // REFIT_SERVER_BLOCKING_H_
