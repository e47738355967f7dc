#include "server/blocking.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

#include "kj/debug.h"

namespace refit::server {
namespace {

// The loop's side of one step, owned by its promise. Its eventfd closes (with `stream`) only once
// the step's thread is done with it.
struct Waiter {
  KeptThreads::Run run;
  std::function<void()> cancel;
  kj::Own<kj::AsyncInputStream> stream;
  uint64_t buf = 0;
  ~Waiter() {
    if (!run.Returned() && cancel) cancel();
    run.Wait();
  }
};

}  // namespace

kj::Promise<void> BlockingThreads::Run(std::function<void()> fn, std::function<void()> cancel) {
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  KJ_SYSCALL(efd);
  auto waiter = kj::heap<Waiter>();
  waiter->cancel = std::move(cancel);
  waiter->stream = io_.wrapInputFd(efd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
  // Throws (std::system_error) with nothing started if no thread can start; `waiter` then closes
  // the eventfd and waits for nothing.
  waiter->run = threads_.Start(std::move(fn), [efd] {
    uint64_t one = 1;
    ssize_t n = write(efd, &one, sizeof(one));
    (void)n;
  });
  Waiter& ref = *waiter;
  return ref.stream->tryRead(&ref.buf, sizeof(ref.buf), sizeof(ref.buf)).ignoreResult().attach(kj::mv(waiter));
}

}  // namespace refit::server
