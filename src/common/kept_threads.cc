#include "common/kept_threads.h"

#include <atomic>
#include <utility>

namespace refit {

struct KeptThreads::Run::State {
  std::function<void()> fn;
  std::function<void()> then;
  std::atomic<bool> returned{false};
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;  // `fn` and `then` returned
};

bool KeptThreads::Run::Returned() const { return state_ == nullptr || state_->returned.load(); }

void KeptThreads::Run::Wait() const {
  if (state_ == nullptr) return;
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(&state_->done));
}

KeptThreads::~KeptThreads() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

KeptThreads::Run KeptThreads::Start(std::function<void()> fn, std::function<void()> then) {
  Run run;
  run.state_ = std::make_shared<Run::State>();
  run.state_->fn = std::move(fn);
  run.state_->then = std::move(then);
  absl::MutexLock lock(&mu_);
  queue_.push_back(run.state_);
  // Every queued function needs a waiting thread of its own.
  if (idle_ < queue_.size()) {
    try {
      threads_.emplace_back([this] { Serve(); });
    } catch (...) {
      queue_.pop_back();
      throw;
    }
  }
  return run;
}

size_t KeptThreads::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

void KeptThreads::Serve() {
  mu_.Lock();
  ++idle_;
  while (true) {
    mu_.Await(absl::Condition(this, &KeptThreads::Wanted));
    if (queue_.empty()) break;  // stopping, with nothing left to run
    std::shared_ptr<Run::State> run = std::move(queue_.front());
    queue_.pop_front();
    --idle_;
    mu_.Unlock();
    run->fn();
    run->fn = nullptr;  // what it holds goes now, not with the next function
    run->returned = true;
    if (run->then) {
      run->then();
      run->then = nullptr;
    }
    // Idle again before the function's Wait returns: a Start right after it takes this thread.
    mu_.Lock();
    ++idle_;
    mu_.Unlock();
    {
      absl::MutexLock lock(&run->mu);
      run->done = true;
    }
    mu_.Lock();
  }
  --idle_;
  mu_.Unlock();
}

}  // namespace refit
