#include "server/blocking.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <utility>

#include "kj/debug.h"

namespace refit::server {

// One call: its function, and the eventfd its thread writes when the function returned.
struct BlockingThreads::Job {
  std::function<void()> fn;
  int efd = -1;
  std::atomic<bool> returned{false};
  absl::Mutex mu;
  bool written ABSL_GUARDED_BY(mu) = false;  // the eventfd written: the thread is done with the job
};

// The loop's side of one call, owned by its promise. Its eventfd closes (with `stream`) only once
// the thread wrote it.
struct BlockingThreads::Waiter {
  std::shared_ptr<Job> job;
  std::function<void()> cancel;
  kj::Own<kj::AsyncInputStream> stream;
  uint64_t buf = 0;
  ~Waiter() {
    if (!job->returned.load() && cancel) cancel();
    absl::MutexLock lock(&job->mu);
    job->mu.Await(absl::Condition(&job->written));
  }
};

BlockingThreads::~BlockingThreads() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

kj::Promise<void> BlockingThreads::Run(std::function<void()> fn, std::function<void()> cancel) {
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  KJ_SYSCALL(efd);
  kj::Own<kj::AsyncInputStream> stream = io_.wrapInputFd(efd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
  auto job = std::make_shared<Job>();
  job->fn = std::move(fn);
  job->efd = efd;
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(job);
    // Every queued job needs a waiting thread of its own. A thread that cannot start (std::thread
    // throws) leaves nothing queued: the call fails as a whole, its eventfd closed with `stream`.
    if (idle_ < queue_.size()) {
      try {
        threads_.emplace_back([this] { Serve(); });
      } catch (...) {
        queue_.pop_back();
        throw;
      }
    }
  }
  auto waiter = kj::heap<Waiter>();
  waiter->job = std::move(job);
  waiter->cancel = std::move(cancel);
  waiter->stream = kj::mv(stream);
  Waiter& ref = *waiter;
  return ref.stream->tryRead(&ref.buf, sizeof(ref.buf), sizeof(ref.buf)).ignoreResult().attach(kj::mv(waiter));
}

size_t BlockingThreads::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

void BlockingThreads::Serve() {
  mu_.Lock();
  while (true) {
    ++idle_;
    mu_.Await(absl::Condition(this, &BlockingThreads::Wanted));
    --idle_;
    if (queue_.empty()) break;  // stopping, with nothing left to run
    std::shared_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    job->fn();
    job->fn = nullptr;  // what it holds goes now, not with the next job
    job->returned = true;
    uint64_t one = 1;
    ssize_t n = write(job->efd, &one, sizeof(one));
    (void)n;
    {
      absl::MutexLock lock(&job->mu);
      job->written = true;
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace refit::server
