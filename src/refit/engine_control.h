// EngineControl: the engine's pause/resume capability, as the commit protocol sees it. The server
// implements it over the control plane (Cap'n Proto calls issued on its event loop); tests
// implement it in-process.
//
// Threading: Pause and Resume are called from the commit's worker thread and block until the
// engine answered, the call failed or `timeout` passed. Responsive may be called from any thread;
// StartPause, WhenPauseAnswered, TakeAnsweredPause and StartResume from the server's event loop
// only.
#ifndef REFIT_REFIT_ENGINE_CONTROL_H_
#define REFIT_REFIT_ENGINE_CONTROL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace refit {

class EngineControl {
 public:
  virtual ~EngineControl() = default;
  // Returns once the engine runs nothing that reads its parameters. DeadlineExceeded when the
  // engine did not answer within `timeout` (the request stays pending at the engine: it may pause
  // later); Unavailable when the engine is gone; other codes for an error the engine returned.
  virtual absl::Status Pause(absl::Duration timeout) = 0;
  // The parameters hold `version` (the trainer's tag for it: `tag`, "" when none); the engine may
  // serve again. Codes as for Pause.
  virtual absl::Status Resume(uint64_t version, const std::string& tag, absl::Duration timeout) = 0;
  // False while a call that timed out is still unanswered: the engine's state is unknown until it
  // answers (or re-registers), and no commit may start.
  virtual bool Responsive() const = 0;
  // After a Pause that returned OK: the engine's registration audit, answered with the pause
  // (no further call): the parameters no longer where it registered them (each still at the
  // address, in the allocation, it registered). An engine that has no such check answers none.
  virtual std::vector<std::string> PausedStale() { return {}; }
  // Sends the pause request now without waiting for its answer, on the thread the control's calls
  // run on (the server's event loop), so that it travels while that thread does other work (the
  // early pause of staging: direct); the next Pause takes this request's outcome (answered,
  // failed, or not answered within `timeout`) instead of sending another. Default: nothing (Pause
  // sends it).
  virtual void StartPause(absl::Duration timeout) { (void)timeout; }
  // On the thread StartPause ran on: `then` runs there once StartPause's request has an outcome
  // (at once without one).
  virtual void WhenPauseAnswered(std::function<void()> then) { then(); }
  // On that thread, once WhenPauseAnswered's `then` ran: takes StartPause's outcome as Pause would,
  // without blocking, when the engine paused in time with nothing stale (true; PausedStale then
  // answers none). Otherwise false: Pause (from a worker thread) takes the outcome. Default: false.
  virtual bool TakeAnsweredPause() { return false; }
  // Resume without blocking, from the thread the control's calls run on (the server's event
  // loop): sends the request now and calls `done` there with what Resume would return. False
  // (nothing sent, `done` never called) when this control cannot: the caller uses Resume from a
  // worker thread. Default: false.
  virtual bool StartResume(uint64_t version, const std::string& tag, absl::Duration timeout,
                           std::function<void(absl::Status)> done) {
    (void)version, (void)tag, (void)timeout, (void)done;
    return false;
  }
};

}  // namespace refit

#endif  // REFIT_REFIT_ENGINE_CONTROL_H_
