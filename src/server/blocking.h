// Runs a blocking function on its own thread and resolves a KJ promise on the event loop when
// it returns, via an eventfd the loop watches. The worker never calls into the loop, so
// destroying the promise (e.g. at shutdown) only has to join the thread.
#ifndef REFIT_SERVER_BLOCKING_H_
#define REFIT_SERVER_BLOCKING_H_

#include <functional>

#include "kj/async-io.h"

namespace refit::server {

// REQUIRES: called on the event loop thread that owns `io`. The returned promise owns the
// thread: destroying it before `fn` returned calls `cancel` (which must make `fn` return, e.g. by
// aborting a session) and then joins.
kj::Promise<void> RunBlocking(kj::LowLevelAsyncIoProvider& io, std::function<void()> fn,
                              std::function<void()> cancel = nullptr);

}  // namespace refit::server

#endif  // REFIT_SERVER_BLOCKING_H_
