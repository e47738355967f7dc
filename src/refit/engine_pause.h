// EnginePause: one pause of a registered engine, as a state machine, from its request to its
// resume or undo. Every way refitd pauses an engine goes through it: a commit's window (pause,
// copy, resume), staging: direct's pause at begin (the session converts into the paused engine),
// and the early pause sent as a begin arrives, adopted by the session or undone. It owns the
// rules they share:
//   - refitd's own mappings are audited before anything is sent (a stale registration is refused
//     with the engine untouched);
//   - a pause that times out queues a resume of the version the engine holds behind it (calls
//     reach the engine in order, so if it pauses late it serves what it has), unless the engine
//     was dirty: a dirty engine stays paused until a full refit lands;
//   - what the engine's own audit (answered with its pause) finds stale refuses the refit, and
//     the engine is resumed at the version it holds (a dirty one stays paused);
//   - an undo resumes at the version the engine held when the pause began, unless it was dirty.
//
//   kIdle ──Request──► kRequested ──TakeAnswered──► kPaused ──Resume/Undo──► kResumed
//     │                    │                          ▲
//     └────────Pause───────┴────────Pause─────────────┘ (or kRefused / kFailed)
//
// Threading: Request, WhenAnswered, TakeAnswered and StartResume on the server's event loop (the
// engine control's thread); AuditMappings, Pause, Resume and Undo block and run on a worker
// thread. One call at a time; the caller orders them (the loop hands the pause to a worker and
// takes it back).
#ifndef REFIT_REFIT_ENGINE_PAUSE_H_
#define REFIT_REFIT_ENGINE_PAUSE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "refit/engine_record.h"

namespace refit {

class EnginePause {
 public:
  enum class State {
    kIdle,       // nothing sent
    kRequested,  // Request sent the pause; its answer is to be taken (TakeAnswered or Pause)
    kPaused,     // the engine is paused and its registration current
    kRefused,    // a stale registration: refused, nothing written, the engine resumed or never paused
    kFailed,     // the engine did not pause (an error, or no answer in time); its weights untouched
    kResumed,    // resumed (Resume, or Undo) at a version, or its resume failed (resume_status)
  };

  // What the engine held when the pause was made: an undo, a timeout and a refusal resume this.
  struct From {
    uint64_t version = 0;
    std::string tag;
    bool dirty = false;
    uint64_t generation = 0;  // the registration's storage generation (EngineRecord::generation)
  };

  EnginePause(std::shared_ptr<EngineRecord> engine, absl::Duration pause_timeout, absl::Duration resume_timeout);

  // Loop thread. The early pause: refitd's mappings audited, then the request sent without
  // waiting (EngineControl::StartPause). False, sending nothing, when the audit found them stale.
  bool Request();
  // Loop thread, after Request: `then` runs there once the request has an outcome.
  void WhenAnswered(std::function<void()> then);
  // Loop thread, after WhenAnswered's `then`: the engine paused in time with nothing stale (true,
  // kPaused); false otherwise, and Pause (worker) takes the outcome.
  bool TakeAnswered();

  // Worker thread. Before a pause: the registration is the one the pause was made for (the same
  // storage generation, awake) and refitd's own mappings are not stale (EngineStorage::Audit).
  absl::Status AuditMappings() const;
  // Worker thread: pauses the engine (or takes Request's outcome) and reads its own audit.
  // kPaused (OK), kFailed (the engine's error; timed_out() when it did not answer in time) or
  // kRefused (the engine's audit named stale parameters: stale_error()). Returns the engine's
  // error, OK when paused or refused. A paused pause returns OK at once.
  absl::Status Pause();
  // Worker thread: resumes a paused engine at `version` (`tag`), waiting for its answer up to the
  // resume timeout (zero: sent, not awaited). kResumed; resume_status() says how it went.
  absl::Status Resume(uint64_t version, const std::string& tag);
  // Loop thread: Resume without blocking, `done` on the loop with its status (then kResumed).
  // False, nothing sent, when the engine's control cannot: Resume from a worker thread then.
  bool StartResume(uint64_t version, const std::string& tag, std::function<void(absl::Status)> done);
  // Worker thread: a pause not taken (its session never began, or wrote nothing) is given back:
  // resumed at from().version unless it was dirty, awaiting the answer (`await`) or only sending
  // it (the loop thread may send without awaiting). Nothing to do unless paused.
  void Undo(bool await = true);

  State state() const { return state_; }
  bool paused() const { return state_ == State::kPaused; }
  bool timed_out() const { return timed_out_; }
  // kRefused by the engine's audit: the refusal naming its stale parameters.
  const absl::Status& stale_error() const { return stale_error_; }
  // kRefused: whether the engine's resume at from().version worked (a dirty engine is not resumed).
  const absl::Status& resume_status() const { return resume_status_; }
  absl::Time paused_at() const { return paused_at_; }
  const From& from() const { return from_; }
  const std::shared_ptr<EngineRecord>& engine() const { return engine_; }
  absl::Duration pause_timeout() const { return pause_timeout_; }
  absl::Duration resume_timeout() const { return resume_timeout_; }

 private:
  const std::shared_ptr<EngineRecord> engine_;
  const absl::Duration pause_timeout_, resume_timeout_;
  const From from_;
  State state_ = State::kIdle;
  bool timed_out_ = false;
  absl::Status stale_error_;
  absl::Status resume_status_;
  absl::Time paused_at_;
};

// staging: direct: the pause that opens a session's window, before its trainer is answered: an
// EnginePause with the session it was taken for and the begin's answer when it did not pause.
// Made by Node::StartEarlyPause (requested as the begin arrives) or Node::StartDirectPause, run
// by Run on a worker thread (it blocks), settled by Node::FinishDirectPause on the loop thread.
class DirectPause {
 public:
  explicit DirectPause(EnginePause pause) : pause_(std::move(pause)) {}
  EnginePause& pause() { return pause_; }
  const EnginePause& pause() const { return pause_; }
  uint64_t session_id() const { return session_id_; }
  void set_session_id(uint64_t id) { session_id_ = id; }
  // Worker thread: refitd's audit of its mappings (unless the early request was audited), the
  // pause and the engine's own audit. status(): OK once paused; otherwise why the begin fails
  // (refused(): a stale registration, the engine untouched and resumed).
  void Run();
  // Loop thread, after WhenAnswered's `then`: the early pause's answer taken without a worker.
  bool TakeAnswered() { return pause_.TakeAnswered(); }
  const absl::Status& status() const { return status_; }
  bool refused() const { return refused_; }

 private:
  EnginePause pause_;
  uint64_t session_id_ = 0;
  absl::Status status_;
  bool refused_ = false;
};

// The refusal for what the engine's own audit (answered with its pause) found stale.
absl::Status EngineStaleError(const std::vector<std::string>& stale);

}  // namespace refit

#endif  // REFIT_REFIT_ENGINE_PAUSE_H_
