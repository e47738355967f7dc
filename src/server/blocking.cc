#include "server/blocking.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "kj/debug.h"

namespace refit::server {
namespace {

// Owns the worker thread and the eventfd; joins before closing.
struct Worker {
  int efd;
  std::thread thread;
  std::atomic<bool> done{false};
  std::function<void()> cancel;
  kj::Own<kj::AsyncInputStream> stream;
  uint64_t buf = 0;
  ~Worker() {
    if (!done.load() && cancel) cancel();
    if (thread.joinable()) thread.join();
    stream = nullptr;
  }
};

}  // namespace

kj::Promise<void> RunBlocking(kj::LowLevelAsyncIoProvider& io, std::function<void()> fn,
                              std::function<void()> cancel) {
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  KJ_SYSCALL(efd);
  auto worker = kj::heap<Worker>();
  worker->efd = efd;
  worker->cancel = std::move(cancel);
  Worker* w = worker.get();
  worker->stream = io.wrapInputFd(efd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
  worker->thread = std::thread([efd, w, fn = std::move(fn)]() {
    fn();
    w->done = true;
    uint64_t one = 1;
    ssize_t n = write(efd, &one, sizeof(one));
    (void)n;
  });
  auto& ref = *worker;
  return ref.stream->tryRead(&ref.buf, sizeof(ref.buf), sizeof(ref.buf)).ignoreResult().attach(kj::mv(worker));
}

}  // namespace refit::server
