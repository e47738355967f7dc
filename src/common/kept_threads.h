// Functions run on threads kept for their owner's life: a thread that finished one function waits
// for the next instead of exiting, so starting a function costs a wake-up, not a thread's start,
// and waiting for it costs no thread's exit. refitd's session loops (Session, through
// Node) and the blocking steps of its event loop (server/blocking.h) run this way: a thread
// started and joined per session or per step put those costs on every refit's path
// (docs/benchmarks.md runs 29-31).
//
// Threading: any thread may Start and Wait; a function must not Wait for itself.
#ifndef REFIT_COMMON_KEPT_THREADS_H_
#define REFIT_COMMON_KEPT_THREADS_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace refit {

class KeptThreads {
 public:
  KeptThreads() = default;
  // Joins every thread, each once the functions started before have returned.
  ~KeptThreads();
  KeptThreads(const KeptThreads&) = delete;
  KeptThreads& operator=(const KeptThreads&) = delete;

  // One started function. Default-constructed: none (Wait returns at once).
  class Run {
   public:
    Run() = default;
    // Whether the function returned (its `then` may still be running).
    bool Returned() const;
    // Returns once the function and its `then` returned.
    void Wait() const;

   private:
    friend class KeptThreads;
    struct State;
    std::shared_ptr<State> state_;
  };

  // Runs `fn`, then `then` (if any) on an idle kept thread, or on a new one when none is idle:
  // functions started and not returned each have a thread of their own, so one may wait for
  // another. Throws std::system_error, starting nothing, if a needed thread cannot start.
  Run Start(std::function<void()> fn, std::function<void()> then = nullptr);

  // Threads started so far (none exits before the destructor).
  size_t threads() const;

 private:
  void Serve();
  bool Wanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Run::State>> queue_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting for a function
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace refit

#endif  // REFIT_COMMON_KEPT_THREADS_H_
