#include "refit/engine_pause.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "refit/manifest_check.h"

namespace refit {
namespace {

EnginePause::From FromNow(const EngineRecord& engine) {
  return {engine.version, engine.tag, engine.dirty, engine.generation};
}

}  // namespace

absl::Status EngineStaleError(const std::vector<std::string>& stale) {
  std::vector<std::string> names;
  for (const std::string& n : stale) names.push_back(PrintableName(n));
  return storage::StaleError(names, "the engine reports they are no longer where it registered them");
}

EnginePause::EnginePause(std::shared_ptr<EngineRecord> engine, absl::Duration pause_timeout,
                         absl::Duration resume_timeout)
    : engine_(std::move(engine)),
      pause_timeout_(pause_timeout),
      resume_timeout_(resume_timeout),
      from_(FromNow(*engine_)) {}

bool EnginePause::Request() {
  if (state_ != State::kIdle || !AuditMappings().ok()) return false;
  engine_->control->StartPause(pause_timeout_);
  state_ = State::kRequested;
  return true;
}

void EnginePause::WhenAnswered(std::function<void()> then) { engine_->control->WhenPauseAnswered(std::move(then)); }

bool EnginePause::TakeAnswered() {
  if (state_ != State::kRequested || !engine_->control->TakeAnsweredPause()) return false;
  paused_at_ = absl::Now();
  state_ = State::kPaused;
  return true;
}

absl::Status EnginePause::AuditMappings() const {
  if (engine_->generation != from_.generation || engine_->asleep) {
    // Sleep and wake are refused while a commit or a direct session runs; this guards the invariant.
    return absl::FailedPreconditionError(absl::StrCat("stale registration: the engine's storage changed (generation ",
                                                      from_.generation, " -> ", engine_->generation,
                                                      engine_->asleep ? ", asleep" : "", ") since the refit began"));
  }
  return engine_->storage->Audit();
}

absl::Status EnginePause::Pause() {
  if (state_ == State::kPaused) return absl::OkStatus();
  absl::Status paused = engine_->control->Pause(pause_timeout_);
  if (!paused.ok()) {
    state_ = State::kFailed;
    timed_out_ = paused.code() == absl::StatusCode::kDeadlineExceeded;
    if (timed_out_ && !from_.dirty) {
      // It may pause later: the resume queued behind the pause lets it serve what it has, which
      // nothing touched. Sent, not awaited: the engine stays unresponsive until it answers.
      (void)engine_->control->Resume(from_.version, from_.tag, absl::ZeroDuration());
    }
    return paused;
  }
  paused_at_ = absl::Now();
  // The registration audit, part 2: the engine's, answered with its pause. Nothing is written.
  if (std::vector<std::string> stale = engine_->control->PausedStale(); !stale.empty()) {
    state_ = State::kRefused;
    stale_error_ = EngineStaleError(stale);
    if (!from_.dirty) resume_status_ = engine_->control->Resume(from_.version, from_.tag, resume_timeout_);
    return absl::OkStatus();
  }
  state_ = State::kPaused;
  return absl::OkStatus();
}

absl::Status EnginePause::Resume(uint64_t version, const std::string& tag) {
  resume_status_ = engine_->control->Resume(version, tag, resume_timeout_);
  state_ = State::kResumed;
  return resume_status_;
}

bool EnginePause::StartResume(uint64_t version, const std::string& tag, std::function<void(absl::Status)> done) {
  return engine_->control->StartResume(version, tag, resume_timeout_,
                                       [this, done = std::move(done)](absl::Status resumed) {
                                         resume_status_ = resumed;
                                         state_ = State::kResumed;
                                         done(std::move(resumed));
                                       });
}

void EnginePause::Undo(bool await) {
  if (state_ != State::kPaused) return;  // a pause that failed or was refused settled the engine already
  if (from_.dirty) return;
  if (await) {
    (void)Resume(from_.version, from_.tag);
    return;
  }
  (void)engine_->control->Resume(from_.version, from_.tag, absl::ZeroDuration());
  state_ = State::kResumed;
}

void DirectPause::Run() {
  if (pause_.state() == EnginePause::State::kIdle) {
    // refitd's own mappings first (the registration audit's part 1): nothing is paused if stale.
    // An early pause was audited before its request went out (EnginePause::Request).
    if (absl::Status audited = pause_.AuditMappings(); !audited.ok()) {
      refused_ = true;
      status_ = absl::FailedPreconditionError(absl::StrCat("refit refused: ", audited.message(), "; the engine is untouched"));
      return;
    }
  }
  if (absl::Status paused = pause_.Pause(); !paused.ok()) {
    status_ = absl::UnavailableError(absl::StrCat("staging: direct: the engine did not pause: ", paused.message(),
                                                  "; its weights are untouched"));
    return;
  }
  if (pause_.state() == EnginePause::State::kRefused) {
    refused_ = true;
    status_ = absl::FailedPreconditionError(absl::StrCat("refit refused: ", pause_.stale_error().message(),
                                                         "; nothing was written"));
  }
}

}  // namespace refit
