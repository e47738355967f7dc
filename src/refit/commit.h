// Commit: one commit of a version into a registered engine, as a run of phases, each one method:
//
//   Gather     the live session's tensors validated (complete before commit) once every bucket is
//              in, or a version staged earlier (held, rolled back to, staged for the wake);
//              stage-only and asleep sessions end here (staged)
//   Prepare    every engine parameter built (assembly, layout steps, derived state), before the pause
//   Audit      refitd's own mappings are the registration the commit started with
//   Checksum   verify_after_commit: the staged bytes' checksums
//   Pause      the engine paused (EnginePause: timeouts, the engine's audit); staging: direct
//              paused it when its session began
//   Copy       staging → the engine's registered memory, in place
//   Verify     verify_after_commit: the engine's bytes against the staged ones, inside the window
//   Resume     the engine resumes with the new version (from the worker, or from the loop:
//              resume_pending())
//
// Each phase either passes or ends the commit with one typed outcome (End), which Node applies
// to its engine record and reports (Node::FinishCommit). Node makes commits (StartCommit, Wake,
// StartVersionCommit, StartRollback); nothing here touches the node.
//
// Threading: made and finished on the loop thread; Run (and RunResume) on one worker thread,
// touching only this commit, its session and its engine record (planner, storage, control);
// StartLoopResume on the loop thread.
#ifndef REFIT_REFIT_COMMIT_H_
#define REFIT_REFIT_COMMIT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/failpoint.h"
#include "refit/committer.h"
#include "refit/engine_pause.h"
#include "refit/engine_record.h"
#include "refit/session.h"
#include "refit/staged_version.h"
#include "refit/types.h"

namespace refit {

// The reason of a refit validated while the engine sleeps (outcome staged): it commits at the wake.
inline constexpr char kStagedForWake[] =
    "the engine is asleep: the refit is validated and staged, and commits when the engine wakes";

// What a commit is made of (Node fills it).
struct CommitSetup {
  uint64_t session_id = 0;
  Session* session = nullptr;              // the live session's; null for a kept version's commit
  std::shared_ptr<StagedVersion> held;     // a kept version's commit (by tag, rollback)
  bool rollback = false;
  std::shared_ptr<EngineRecord> engine;
  const FailpointSet* failpoints = nullptr;
  // A commit enters a phase ("pausing", "copying", "resuming"); on the worker thread.
  std::function<void(uint64_t session_id, const char* phase)> on_phase;
  absl::Duration pause_timeout, resume_timeout;
  std::string to_tag;
  bool verify = false;         // verify_after_commit
  bool stage_only = false;     // validate, then hold
  bool keep = false;           // hold > 0 and a full refit: its staging is kept after the session
  bool asleep = false;         // the engine slept when the commit started: validate, then wait for the wake
  bool refuse_asleep = false;  // ... or refuse (engine.asleep_refits: refuse)
  bool woken = false;          // the commit of a refit staged while the engine slept: from Prepare on
  // staging: direct: the session's engine paused since it began (no pause here), by this pause.
  std::shared_ptr<DirectPause> direct;
  bool resume_on_loop = false;  // NodeOptions::resume_on_loop
  // An engine group's commit (Node::StartGroupCommit): Run ends with the engine paused and copied
  // (resume_pending()); the coordinator's resume sends it, its abort runs RunRestore.
  bool group = false;
  PhaseTimes times;             // carried over (a refit staged for the wake)
  uint64_t staged_checksum = 0;
};

// How a commit ended, for Node::FinishCommit.
struct CommitResult {
  Outcome outcome = Outcome::kFailed;
  EndCause cause = EndCause::kInternal;
  std::string reason;
  bool engine_dirty = false;        // the copy started and did not finish: the engine stays paused
  bool engine_version_set = false;  // the engine holds to_version's bytes
  bool verify_mismatch = false;     // verify_after_commit found engine bytes unlike the staged ones
  uint64_t staged_checksum = 0;     // the version's checksum (hold > 0)
  PhaseTimes times;
};

class Commit {
 public:
  explicit Commit(CommitSetup setup);

  uint64_t session_id() const { return setup_.session_id; }
  const CommitSetup& setup() const { return setup_; }
  const CommitResult& result() const { return result_; }
  // The engine's version, tag and dirty flag when the commit started.
  const EnginePause::From& from() const { return pause_.from(); }
  // NodeOptions::resume_on_loop: Run returned with the engine's memory written and its resume
  // still to send (StartLoopResume, or RunResume on a worker thread).
  bool resume_pending() const { return resume_pending_; }

  // Worker thread: the phases above, in order, to the commit's outcome (or to resume_pending()).
  void Run();
  // Worker thread, after a Run that left the resume pending: sends it and waits for the answer.
  void RunResume();
  // Loop thread, after a Run that left the resume pending: sends the resume through the engine's
  // EngineControl::StartResume and runs `done` there once the commit has its outcome; false,
  // sending nothing, when the control cannot resume from this thread (RunResume then).
  static bool StartLoopResume(const std::shared_ptr<Commit>& commit, std::function<void()> done);
  // Worker thread, after a group Run that left the engine paused and copied: writes `before` (the
  // version the engine held when the commit started, kept in staging) back into the engine and
  // resumes it at that version and tag (outcome aborted, `reason`). Without `before` (not kept)
  // the engine stays paused and dirty (outcome failed) until a full refit lands.
  void RunRestore(const StagedVersion* before, const std::string& reason);

 private:
  // The staged tensors the commit writes, and the live session's prepare made early.
  struct Staged {
    const Staging* staging = nullptr;
    std::vector<size_t> produced;
    std::optional<PreparedCommit> prepared_early;
  };
  // Each phase returns false once it ended the commit.
  bool Gather(Staged& staged);
  bool DrainAndValidate(Session& s, Staged& staged);
  bool Prepare(Staged& staged, std::optional<PreparedCommit>& prepared);
  bool Audit();
  bool Checksum(const Staged& staged, const PreparedCommit& prepared, std::vector<uint64_t>& expected);
  bool Pause();
  bool Copy(const PreparedCommit& prepared);
  bool Verify(const PreparedCommit& prepared, const std::vector<uint64_t>& expected);
  // The commit's outcome once the engine answered its resume (or did not).
  void FinishResume(const absl::Status& resumed);
  // Ends the commit; a staging: direct session's engine is settled first (resumed if nothing was
  // written in place, else left paused and dirty).
  void End(Outcome outcome, EndCause cause, std::string reason);
  void Phase(const char* name) const;
  uint64_t to_version() const { return pause_.from().version + 1; }
  bool direct() const { return setup_.direct != nullptr; }

  const CommitSetup setup_;
  EnginePause pause_;  // the window's pause (staging: direct: the session's, taken at begin)
  absl::Time pause_start_;
  bool resume_pending_ = false;
  CommitResult result_;
};

// staging: direct, a session ended before its commit settled the engine (paused since begin).
// Once nothing of the session runs, the engine holds a mix of versions (it stays paused and
// dirty: `dirty` set) or nothing new (resumed at `version`, when `may_resume`, within
// `resume_timeout`; zero: sent, not awaited). Returns what the session's reason adds.
std::string SettleDirectSession(Session& session, EngineControl& control, bool may_resume, uint64_t version,
                                const std::string& tag, absl::Duration resume_timeout, bool& dirty);

}  // namespace refit

#endif  // REFIT_REFIT_COMMIT_H_
