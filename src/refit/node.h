// Node: the refit state of one rollout node — the registered engine, the version it serves, the
// one active session — and the protocol that takes a session from begin to its outcome: receive,
// validate, prepare, pause, copy, resume. The server adapts RPCs to these calls; nothing here
// knows the wire, and every way a session ends goes through one place (End), which produces one
// report with a typed outcome and cause.
//
// An engine of several ranks (spec tensor_parallel.size > 1 without a rank: TP/EP workers, one
// process per GPU) registers rank by rank; once every rank is in, the node's one engine record is
// built over all of them (node_ranks.cc), so everything below runs as for a single engine.
//
// Engine records are shared: the node holds the registered one, and the active session (and a
// commit in flight) hold theirs, so an engine that unregisters or is replaced during a commit
// leaves its mappings alive until that commit has finished with them. A commit in flight is an
// outcome for the engine that left (never a write through an unmapped address).
//
// Threading: every method runs on one thread (the server's event loop), except RunCommit, which
// runs on a worker thread for the commit StartCommit handed out and touches only that Commit, its
// session and its engine record (planner, storage and control; never the node).
#ifndef REFIT_REFIT_NODE_H_
#define REFIT_REFIT_NODE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/failpoint.h"
#include "common/kept_threads.h"
#include "refit/bucket_ring.h"
#include "refit/converter.h"
#include "refit/engine_control.h"
#include "refit/placement.h"
#include "refit/planner.h"
#include "refit/rank_group_control.h"
#include "refit/session.h"
#include "refit/wire_plan.h"
#include "refit/staged_version.h"
#include "refit/staging.h"
#include "refit/types.h"
#include "storage/engine_storage.h"
#include "transport/transport.h"

namespace refit {

// Where a registering engine rank sits in the node's engine (proto registerEngine's tpRank...).
struct RankPlacement {
  int tp_rank = 0;
  int tp_size = 0;  // 0: not given (a single engine, as registered before engine ranks)
  int ep_rank = 0;
  int ep_size = 0;  // 0: not given (no expert parallelism)
  int device = -1;  // the CUDA device of its parameters; -1: not given (host engines)
  std::string model;  // the model it serves; "": not given
};

// One registered rank of an engine of several ranks (spec tensor_parallel.size > 1 without a
// rank). Shared by the node, the group engine built over it and a commit in flight.
struct RankRecord {
  uint64_t id = 0;  // its registration
  RankPlacement placement;
  std::shared_ptr<storage::EngineStorage> storage;
  std::shared_ptr<EngineControl> control;
  uint64_t bytes = 0;
  // Loop thread only.
  uint64_t version = 0;
  std::string tag;
  bool dirty = false;
  bool gone = false;
};

// What a registering engine brings: its mapped storage, the planner over its parameters, the
// staging memory and converter that fit it, its pause/resume control, and what it holds now.
struct EngineSetup {
  std::unique_ptr<Planner> planner;
  std::unique_ptr<storage::EngineStorage> storage;
  std::unique_ptr<StagingPool> pool;
  // A new, empty pool of the same memory kind: with hold > 0 every session stages into its own
  // pool, which a held or retained version keeps. Required when NodeOptions::hold > 0.
  std::function<std::unique_ptr<StagingPool>()> new_pool;
  std::unique_ptr<Converter> converter;
  std::unique_ptr<EngineControl> control;
  uint64_t version = 0;  // the version the engine serves (0: fresh)
  std::string tag;       // the trainer's tag of that version ("" when none)
  bool dirty = false;    // it lost refitd inside a commit window: its weights may be mixed
  // Where it sits (engine ranks). With NodeOptions::spec declaring ranks, only storage, control,
  // version, tag, dirty and placement are given: the node builds the rest once every rank is in.
  RankPlacement placement;
};

// A registered engine. Shared by the node, the session that uses it and a commit in flight.
struct EngineRecord {
  uint64_t id = 0;
  std::unique_ptr<Planner> planner;
  std::unique_ptr<storage::EngineStorage> storage;
  std::unique_ptr<StagingPool> pool;
  std::function<std::unique_ptr<StagingPool>()> new_pool;
  std::unique_ptr<Converter> converter;
  std::unique_ptr<EngineControl> control;
  uint64_t bytes = 0;
  // Loop thread only.
  uint64_t version = 0;
  std::string tag;     // the trainer's tag of `version`
  bool dirty = false;  // a commit failed mid-copy: only a full refit may land
  bool gone = false;   // unregistered (disconnected); a commit in flight still holds the record
  // An engine of several ranks: its ranks, in rank order (empty for a single engine), and their
  // pause/resume (which knows the ranks that failed).
  std::vector<std::shared_ptr<RankRecord>> ranks;
  const RankGroupControl* group_control = nullptr;
  // Sleep and wake (Node::Sleep, Node::Wake): asleep, the storage is a ReleasedEngineStorage (the
  // parameter list without mappings). `generation` counts registrations of storage: 1 at
  // register, +1 at each sleep and each wake; a commit writes only into the generation it started
  // with.
  bool asleep = false;
  uint64_t generation = 1;
  // staging: direct: the last placement planned (Node::Begin) and what it was planned from: the
  // manifest's plans (the planner's shared plans, held here so that none is freed and its address
  // reused) and the storage generation. An RL loop's next begin, planned to the same plans in the
  // same generation, takes it again rather than planning it anew; in a later generation (the
  // engine slept and woke with the same parameters), it takes the same places rebased to the new
  // mappings (RebasePlacement).
  struct PlacementMemo {
    uint64_t generation = 0;
    std::vector<std::shared_ptr<const TensorPlan>> plans;
    std::shared_ptr<const Placement> placement;
  };
  PlacementMemo placement_memo;
  // The last manifest's tensor list this engine's planner accepted, by its key (Node::Begin's
  // `tensors_key`), with its plans: an RL loop's next begin with the same list takes them rather
  // than checking and planning each tensor again.
  struct BeginMemo {
    uint64_t tensors_key = 0;
    std::vector<std::shared_ptr<const TensorPlan>> plans;
  };
  BeginMemo begin_memo;
};

// What status shows of each declared engine rank.
struct RankStatus {
  int tp_rank = 0;
  bool registered = false;
  RankPlacement placement;  // as registered
  uint64_t version = 0;
  std::string tag;
  bool dirty = false;         // registered dirty, or its last commit failed on it
  bool left_dirty = false;    // not registered: it left while a commit failed on it
  bool responsive = true;
  uint32_t params = 0;
  uint64_t bytes = 0;
};

struct NodeHooks {
  std::function<void(const RefitReport&)> on_report;
  std::function<void(bool registered)> on_engine;
  // A rank registered or left, or a commit ended (Ranks(): every declared rank, or the one engine).
  std::function<void(const std::vector<RankStatus>& ranks)> on_ranks;
  std::function<void(uint64_t staging_bytes, bool active)> on_session;
  // Per bucket, on the session's threads (see Session::Options): a bucket arrived; a bucket was
  // converted (bytes staged per format, and the session's staged bytes now).
  std::function<void(uint64_t bytes)> on_received;
  std::function<void(const std::map<std::string, uint64_t>& bytes_by_format, uint64_t staged_bytes)> on_converted;
  // The versions kept in staging changed (hold: K): how many are held, current, previous.
  std::function<void(uint32_t held, uint32_t current, uint32_t previous)> on_versions;
  std::function<void(const RefitReport&)> on_log;  // one line per ended session
  // A commit enters a phase ("pausing", "copying", "resuming"). Called on the commit's worker
  // thread.
  std::function<void(uint64_t session_id, const char* phase)> on_commit_phase;
};

struct NodeOptions {
  std::string model;  // the spec's model name; manifests must name it
  SessionLimits limits;
  absl::Duration pause_timeout = absl::Seconds(10);
  absl::Duration resume_timeout = absl::Seconds(10);
  // After the copy, before the resume: checksum every written parameter in the engine's storage
  // (on the GPU for device storage) against the checksum of the staged bytes it was copied from.
  // A mismatch fails the commit (cause kVerifyMismatch) and leaves the engine paused and dirty.
  bool verify_after_commit = false;
  // hold: K (docs/versions.md): up to K stage-only refits kept in staging under their tags, and
  // the current and previous committed full refits kept for rollback while staging has room.
  // 0: none (every session reuses the engine's one pool).
  uint32_t hold = 0;
  // engine.asleep_refits: refuse (true) or stage (false, the default) a refit while the engine
  // sleeps. Staged, it is received, converted and validated, and commits when the engine wakes.
  bool refuse_while_asleep = false;
  // staging: direct (docs/architecture.md "staging: direct"): a session of an awake engine
  // pauses it before its trainer is answered (BeginResult::pause_first) and converts every tensor
  // the manifest lets it place (PlanPlacement) straight into the engine's memory; only the rest is
  // staged and copied at commit, which resumes the engine. A session that ends without its commit
  // after writing in place leaves the engine paused and dirty until a full refit lands (as a
  // commit that fails mid-copy does); one that wrote nothing resumes it. Not with hold > 0 or
  // engine ranks (the server refuses those configurations).
  bool direct = false;
  // A commit's last step, the engine's resume, is sent by the thread that starts and finishes
  // commits (the server's event loop, where the engine's capability lives) rather than from the
  // worker thread: RunCommit returns with resume_pending() and the caller sends it
  // (StartLoopResume), saving the worker's wake-up and its hop back. Off: RunCommit resumes.
  bool resume_on_loop = false;
  const FailpointSet* failpoints = nullptr;  // test builds only
  // What session deadlines are computed and checked against; the system clock when null.
  const Clock* clock = nullptr;
  // Engine ranks: the node's spec. When it declares tensor_parallel.size > 1 without a rank, the
  // engine is that many rank processes, each registering its rank (RegisterEngine), and the node
  // builds the engine over all of them once every rank is in, with `make_staging` (which fills
  // pool, new_pool and converter for the group's storage). Null: a single engine.
  const spec::ModelSpec* spec = nullptr;
  std::function<absl::Status(EngineSetup&)> make_staging;
};

// The reason of a refit validated while the engine sleeps (outcome staged): it commits at the wake.
inline constexpr char kStagedForWake[] =
    "the engine is asleep: the refit is validated and staged, and commits when the engine wakes";

struct BeginResult {
  uint64_t session_id = 0;
  uint32_t deadline_ms = 0;
  // Wire format checkpoint: the tensors the trainer converts (empty plan otherwise).
  std::shared_ptr<const WireTable> wire;
  // staging: direct: the engine must be paused (StartDirectPause, RunDirectPause,
  // FinishDirectPause) before the trainer is answered.
  bool pause_first = false;
};

// staging: direct: the pause that opens a session's window, before its trainer is answered.
// Handed out by StartDirectPause, run by RunDirectPause on a worker thread (Pause blocks),
// finished by FinishDirectPause on the loop thread.
class DirectPause {
 private:
  friend class Node;
  uint64_t session_id_ = 0;
  std::shared_ptr<EngineRecord> engine_;
  absl::Duration pause_timeout_, resume_timeout_;
  uint64_t from_version_ = 0;
  std::string from_tag_;
  bool dirty_at_start_ = false;
  uint64_t generation_ = 0;
  bool pause_sent_ = false;  // an early pause: its request went out already (EngineControl::StartPause)
  // Set by RunDirectPause.
  absl::Status status_;        // OK: the engine is paused and its registration current
  bool refused_ = false;       // stale registration: refused, the engine resumed (or never paused)
  absl::Time paused_at_;
};

// One commit: handed out by StartCommit, run by RunCommit on a worker thread, ended by
// FinishCommit on the loop thread.
class Commit {
 public:
  uint64_t session_id() const { return session_id_; }
  // NodeOptions::resume_on_loop: RunCommit returned with the engine's memory written and its
  // resume still to send (Node::StartLoopResume, or Node::RunResume on a worker thread).
  bool resume_pending() const { return resume_pending_; }

 private:
  friend class Node;
  uint64_t session_id_ = 0;
  Session* session_ = nullptr;
  std::shared_ptr<EngineRecord> engine_;
  const FailpointSet* failpoints_ = nullptr;
  const NodeHooks* hooks_ = nullptr;
  absl::Duration pause_timeout_, resume_timeout_;
  uint64_t from_version_ = 0;
  std::string from_tag_, to_tag_;
  bool dirty_at_start_ = false;
  bool verify_ = false;
  uint64_t generation_ = 0;    // the engine's storage generation the commit writes into
  bool asleep_ = false;        // the engine slept when the commit started: validate, then wait for wake
  bool refuse_asleep_ = false; // ... or refuse (engine.asleep_refits: refuse)
  bool woken_ = false;         // the commit of a refit staged while the engine slept: from prepare on
  bool direct_ = false;        // staging: direct: the engine is paused since direct_since_ (no pause here)
  absl::Time direct_since_;
  bool resume_on_loop_ = false;  // NodeOptions::resume_on_loop
  bool resume_pending_ = false;  // RunCommit left the resume (of to_version) to its caller
  absl::Time pause_start_;       // the window's start (pause_ms)

  // Set by RunCommit.
  Outcome outcome_ = Outcome::kFailed;
  EndCause cause_ = EndCause::kInternal;
  std::string reason_;
  bool engine_dirty_ = false;      // the copy started and did not finish: the engine stays paused
  bool engine_version_set_ = false;  // the engine holds to_version's bytes
  bool verify_mismatch_ = false;     // verify_after_commit found engine bytes unlike the staged ones
  bool stage_only_ = false;          // a stage-only session: validate, then hold
  bool keep_ = false;                // hold > 0 and a full refit: its staging is kept after the session
  uint64_t staged_checksum_ = 0;     // stage-only: the version's checksum
  // A commit of a version kept in staging (commit by tag, rollback): no session.
  std::shared_ptr<StagedVersion> held_;
  bool rollback_ = false;
  PhaseTimes times_;
};

class Node {
 public:
  Node(NodeOptions options, transport::Receiver& receiver, BucketRing& ring, NodeHooks hooks);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Registers an engine. Refused (Unavailable) while another engine is registered and has not
  // gone: only the holder of a registration can end it (by dropping it or disconnecting), so a
  // client cannot take over a live engine. Ends an active session of an engine that is gone.
  //
  // Engine ranks (ranked()): registers one rank. Refused naming the field: a model other than the
  // daemon's (model), a size other than the spec's (tp_size, ep_size), a rank outside it or not
  // the spec's for it (tp_rank, ep_rank), a rank already registered and live (tp_rank), a device
  // another rank holds or unlike its parameters' (device), parameters unlike another rank's
  // (params). A rank that left is replaced by its next registration; the others stay. Once every
  // declared rank is in, the node's engine is built over them.
  absl::StatusOr<uint64_t> RegisterEngine(EngineSetup setup);
  // The engine's (or an engine rank's) registration was dropped. A session not committing is
  // aborted; a commit in flight keeps the record and ends as an engine error. False when
  // `engine_id` is no registration the node holds.
  bool UnregisterEngine(uint64_t engine_id);

  // The spec declares engine ranks (NodeOptions::spec).
  bool ranked() const { return ranked_; }
  // Every declared rank (ranked()), in rank order; a single engine is one rank (its spec's
  // tensor_parallel.rank, 0 without one).
  std::vector<RankStatus> Ranks() const;

  // A new session for `manifest`; every refusal names the field or tensor (InvalidArgument),
  // the missing engine (Unavailable), the busy node (Unavailable) or the dirty engine
  // (FailedPrecondition). `tensors_key`: a hash of every field of the manifest's tensor list
  // (the daemon's manifest key; 0: none). A list of the key the engine's planner accepted last
  // is not checked and planned again (EngineRecord::BeginMemo).
  // `session_id`: the trainer's choice of the session's id (nonzero; 0: the node chooses), so
  // that it knows its data-plane tags before the answer. Refused (InvalidArgument) at or above
  // 2^32 or when one of the node's recent sessions had it.
  absl::StatusOr<BeginResult> Begin(const Manifest& manifest, absl::Time requested, uint64_t tensors_key = 0,
                                    uint64_t session_id = 0);
  // Another trainer rank joins the active session; it counts as open until it detaches. Returns
  // the rank's number in the session (1, 2, ...; the rank that began it is 0), which picks its
  // range of bucket numbers (Session::SeqBase).
  absl::StatusOr<uint32_t> Join(uint64_t session_id);
  // A joined rank is done pushing (Detach after Join). A joined rank that leaves without
  // detaching ends the session through EndByTrainer instead.
  absl::Status Detach(uint64_t session_id);
  // Joined ranks of the active session that have not detached (0 without a session). The
  // beginning rank's commit waits for this to reach 0.
  uint32_t open_members() const { return active_ ? active_->open_members : 0; }
  // The active session's wire plan (what a joining rank converts), or nullptr without a session.
  std::shared_ptr<const WireTable> wire() const { return active_ ? active_->wire : nullptr; }
  // Queues a bucket of trainer rank `rank` (Join); an invalid header ends the session
  // (InvalidArgument naming the field).
  absl::StatusOr<uint32_t> Announce(uint64_t session_id, BucketHeader header, uint32_t rank = 0);
  // A trainer aborted (kClientAbort) or disconnected (kDisconnected) with `reason`. During a
  // commit, the commit runs on and this is ignored.
  void EndByTrainer(uint64_t session_id, EndCause cause, const std::string& reason);
  // An operator aborts the active session; false when there is none.
  bool AbortActive(const std::string& reason);
  // Ends the session if it failed on its own threads or passed its deadline (by the options'
  // clock). Returns false once `session_id` is no longer active (the caller stops polling).
  bool Poll(uint64_t session_id);
  // Tears down the last committed session (End keeps it for this: its threads, staging and ledger
  // are freed after the commit is answered). Every other entry point that needs it gone calls it.
  void ReleaseEnded() { ended_.reset(); }
  // Shutting down: ends a session that is not committing. Returns true while a commit runs.
  bool Shutdown();

  // The commit of the active session: StartCommit (loop) → RunCommit (worker) → FinishCommit
  // (loop). A session has at most one commit.
  absl::StatusOr<std::shared_ptr<Commit>> StartCommit(uint64_t session_id);
  // staging: direct (BeginResult::pause_first): the pause of session `session_id`'s engine,
  // StartDirectPause (loop) → RunDirectPause (worker: refitd's audit of its mappings, the pause
  // and the engine's own audit) → FinishDirectPause (loop): OK once the engine is paused and the
  // session converts in place; otherwise the session has ended (the engine untouched) and the
  // status says why (the begin's answer).
  // `early`: the pause StartEarlyPause began for this begin request (RunDirectPause already
  // started on it), adopted by the session instead of a new one.
  absl::StatusOr<std::shared_ptr<DirectPause>> StartDirectPause(uint64_t session_id,
                                                                std::shared_ptr<DirectPause> early = nullptr);
  static void RunDirectPause(DirectPause& pause);
  absl::Status FinishDirectPause(DirectPause& pause);
  // staging: direct: the engine's pause begun as a begin request arrives, before its manifest is
  // decoded and planned, which it then overlaps (a Llama-8B manifest: ~0.9 ms of decode and
  // planning against a ~0.7 ms pause). Only for a manifest like the last one that converted in
  // place into this engine registration (`manifest_key`: a hash of what placement depends on,
  // NotePlacing), as in an RL loop's steady state: the first refit, and any other manifest, pause
  // after planning as before. nullptr otherwise, or when no session could convert in place now (a
  // session or a kept version's commit active, the engine asleep or unresponsive). The caller
  // waits for its answer (WhenEarlyPauseAnswered) and takes it on the loop (TakeAnsweredEarlyPause)
  // or, when that refuses, runs RunDirectPause on it; then either Begin's session adopts it
  // (StartDirectPause) or, when
  // the begin failed or placed nothing, it is undone before the begin is answered:
  // StartUndoEarlyPause (loop), RunUndoEarlyPause (worker: the engine resumed at the version it
  // holds, unless it was dirty), FinishUndoEarlyPause (loop). Begins are refused as busy while an
  // undo runs.
  std::shared_ptr<DirectPause> StartEarlyPause(uint64_t manifest_key);
  // A begin arrived: the engine's converter wakes its GPU (Converter::Warm) while the begin is
  // decoded and planned and the engine pauses. Loop thread.
  void WarmConverter();
  // Loop thread: `then` runs once an early pause's request has an outcome (answered, failed or
  // timed out: EngineControl::WhenPauseAnswered).
  static void WhenEarlyPauseAnswered(DirectPause& pause, std::function<void()> then);
  // Loop thread, after WhenEarlyPauseAnswered's `then`: settles the early pause as RunDirectPause
  // would, without blocking, when the engine paused in time with nothing stale (true); false
  // otherwise, and RunDirectPause (worker) settles it.
  static bool TakeAnsweredEarlyPause(DirectPause& pause);
  // Begin's session converts in place (BeginResult::pause_first) for a manifest of `manifest_key`.
  void NotePlacing(uint64_t manifest_key);
  // From StartEarlyPause (a pause was returned) to EndEarlyWindow, which the caller calls right
  // before its Begin: other begins are refused as busy and start no early pause.
  void EndEarlyWindow() { early_window_ = false; }
  void StartUndoEarlyPause() { ++early_undoing_; }
  static void RunUndoEarlyPause(DirectPause& pause);
  void FinishUndoEarlyPause() { --early_undoing_; }
  bool undoing_early_pause() const { return early_undoing_ > 0; }
  static void RunCommit(Commit& commit);
  // After a RunCommit that left the resume pending (Commit::resume_pending): on the loop thread,
  // sends the resume through the engine's EngineControl::StartResume and runs `done` there once
  // the commit has its outcome (then FinishCommit); false, sending nothing, when the control
  // cannot resume from this thread: RunResume (worker thread, blocking) then.
  static bool StartLoopResume(const std::shared_ptr<Commit>& commit, std::function<void()> done);
  static void RunResume(Commit& commit);
  // Ends the session with the commit's outcome; returns the report (also last_report()).
  const RefitReport& FinishCommit(Commit& commit);

  // hold > 0: the commit of the held version `tag` (NotFound naming the held tags otherwise), or
  // of the previous committed version (rollback; FailedPrecondition when none is staged). Run
  // and finished like a session's commit. Unavailable while another commit runs; a session may
  // be receiving meanwhile.
  absl::StatusOr<std::shared_ptr<Commit>> StartVersionCommit(const std::string& tag);
  absl::StatusOr<std::shared_ptr<Commit>> StartRollback();
  // Held, current and previous versions in staging, held first, then current, then previous.
  std::vector<VersionInfo> Versions() const;
  uint64_t versions_bytes() const;
  // A commit by tag or rollback is in flight (a session's commit waits for it).
  bool version_committing() const { return version_commit_ != nullptr; }

  // Sleep and wake. Sleep: the engine releases its weights; refitd drops its mappings (the
  // parameter list stays registered) and the engine is asleep. Unavailable while a commit is in
  // flight. A session may run on while the engine sleeps: its commit validates and then waits for
  // the wake (outcome staged), or, with refuse_while_asleep, is refused; sessions are refused at
  // begin then.
  absl::Status Sleep(uint64_t engine_id);
  // The engine woke and mapped its parameters again at `storage` (the same list of names, dtypes
  // and shapes, at the same or new addresses; InvalidArgument naming the first that differs).
  // Returns the commit of the refit staged while it slept, run like a session's, or null.
  absl::StatusOr<std::shared_ptr<Commit>> Wake(uint64_t engine_id, std::unique_ptr<storage::EngineStorage> storage);
  bool asleep() const { return engine_ && engine_->asleep; }
  // The session whose validated refit waits for the engine to wake; 0 when none.
  uint64_t awaiting_wake_session() const { return active_ && active_->awaiting_wake ? active_->session->id() : 0; }

  // State, for status and readiness.
  const EngineRecord* engine() const { return engine_.get(); }
  // Serving-readiness: an engine registered, clean and answering.
  absl::Status Ready() const;
  uint64_t version() const;
  // The trainer's tag of version() ("" when none).
  const std::string& tag() const;
  bool session_active() const { return active_.has_value(); }
  uint64_t active_session_id() const { return active_ ? active_->session->id() : 0; }
  bool committing() const { return (active_ && active_->committing) || version_commit_ != nullptr; }
  // Staging in use: the active session's and every kept version's.
  uint64_t staging_bytes() const {
    return (active_ && !active_->staging_taken ? active_->session->staging().bytes() : 0) + versions_bytes();
  }
  const RefitReport& last_report() const { return last_report_; }
  uint64_t committed() const { return committed_; }
  uint64_t refused() const { return refused_; }
  uint64_t aborted() const { return aborted_; }
  uint64_t verify_mismatches() const { return verify_mismatches_; }
  uint64_t staged() const { return staged_; }
  const NodeOptions& options() const { return options_; }

  // Checksum64 of every registered parameter read from the engine's storage.
  struct ParamChecksum {
    std::string name;
    uint64_t checksum;
    uint64_t nbytes;
  };
  absl::StatusOr<std::vector<ParamChecksum>> Checksums() const;

 private:
  struct Active {
    std::shared_ptr<EngineRecord> engine;  // declared first: outlives the session
    std::unique_ptr<StagingPool> own_pool;  // hold > 0: this session's pool (outlives the session)
    std::unique_ptr<Session> session;
    bool stage_only = false;
    bool staging_taken = false;  // handed to a kept version
    absl::Time begun;
    absl::Time deadline;
    double plan_ms = 0;
    std::string tag;  // the manifest's
    bool committing = false;
    uint32_t open_members = 0;  // joined ranks that have not detached
    uint32_t joined = 0;        // ranks that joined, detached or not (the last one's number)
    std::shared_ptr<const WireTable> wire;  // the session's wire plan
    // Set when the node aborted the session while its commit ran (engine gone, operator,
    // shutdown): the commit ends with this cause.
    std::optional<std::pair<EndCause, std::string>> ended_by;
    // Validated while the engine slept: waits for Wake, which commits it from the prepare step.
    bool awaiting_wake = false;
    // staging: direct: where the session's tensors go in the engine (empty: nothing to place, a
    // staged session), and whether the engine is paused for it (since when).
    std::shared_ptr<const Placement> placement;
    bool direct_paused = false;
    absl::Time direct_since;
    PhaseTimes staged_times;
    uint64_t staged_checksum = 0;
  };
  absl::Status CheckActive(uint64_t session_id) const;
  // Ends the active session: aborts it if still running, counts, reports, resets.
  void End(Outcome outcome, EndCause cause, std::string reason, const PhaseTimes* times = nullptr,
           uint64_t staged_checksum = 0);
  // Aborts the active session with `cause`: at once when not committing, else when the commit ends.
  void AbortWith(EndCause cause, const std::string& reason);
  void NotifySession();
  uint64_t NewSessionId();
  // `proposed` (a trainer's choice) when it is no recent session's, else an error; 0: NewSessionId.
  absl::StatusOr<uint64_t> TakeSessionId(uint64_t proposed);
  // Keeps the active session's staging as a version in `state` (End, before the session goes).
  void KeepActive(StagedVersion::State state, uint64_t checksum);
  // A version of `state`, or null.
  std::shared_ptr<StagedVersion> Find(StagedVersion::State state) const;
  void Drop(const std::shared_ptr<StagedVersion>& v);
  // A commit of a kept version, checked and set up; `rollback` for the report's reason.
  absl::StatusOr<std::shared_ptr<Commit>> StartKeptCommit(std::shared_ptr<StagedVersion> v, bool rollback);
  const RefitReport& FinishVersionCommit(Commit& commit);
  // The commit's outcome applied to its engine record (and each of its ranks): dirty, version,
  // tag, verify mismatches. FinishCommit and FinishVersionCommit both start with it.
  void ApplyCommitOutcome(Commit& commit);
  // Engine ranks (node_ranks.cc).
  absl::StatusOr<uint64_t> RegisterRank(EngineSetup setup);
  absl::Status CheckRank(const EngineSetup& setup) const;
  // Every declared rank is in: the engine over them.
  absl::Status BuildGroup();
  // "no engine is registered" naming the ranks missing, for Begin and Ready.
  std::string MissingRanks() const;
  // A commit of the active session (StartCommit, Wake).
  std::shared_ptr<Commit> NewSessionCommit();
  // Before the pause: the registration the commit writes into is the one it started with and
  // refitd's own mappings are not stale (EngineStorage::Audit); the engine's own audit comes with
  // its pause (EngineControl::PausedStale). Runs on the commit's worker thread.
  static absl::Status AuditRegistration(const Commit& c);
  // The commit's outcome once the engine answered its resume (or did not).
  static void FinishResume(Commit& c, const absl::Status& resumed);

  const NodeOptions options_;
  // The sessions' receiver and converter loops, on threads kept across sessions: a session's
  // begin starts no thread. Declared before the sessions below, so destroyed after them.
  KeptThreads session_threads_;
  const std::unique_ptr<Clock> system_clock_;  // when options_.clock is null
  const Clock* const clock_;
  transport::Receiver& receiver_;
  BucketRing& ring_;
  NodeHooks hooks_;
  std::shared_ptr<EngineRecord> engine_;
  std::optional<Active> active_;
  // The last session that committed, its teardown (threads joined, staging and ledger freed) left
  // for ReleaseEnded, after the trainer's answer.
  std::optional<Active> ended_;
  uint64_t next_engine_id_ = 1;
  bool ranked_ = false;
  std::vector<std::shared_ptr<const spec::ModelSpec>> rank_specs_;  // spec::ForRank, by rank
  std::vector<std::shared_ptr<RankRecord>> ranks_;  // by rank; null while not registered
  std::vector<bool> left_dirty_;                    // by rank: left while a commit failed on it
  uint64_t committed_ = 0, refused_ = 0, aborted_ = 0, verify_mismatches_ = 0, staged_ = 0;
  std::vector<std::shared_ptr<StagedVersion>> versions_;
  std::shared_ptr<Commit> version_commit_;  // a commit by tag or rollback in flight
  uint32_t early_undoing_ = 0;              // early pauses being undone (StartUndoEarlyPause)
  bool early_window_ = false;               // StartEarlyPause returned a pause; its Begin is to come
  // NotePlacing's last manifest key, and the engine registration (id) it placed into. Not the
  // storage generation: a wake keeps the parameters (Wake checks them), so the manifest still
  // places (RebasePlacement), and the loop's first begin after its wake pauses early too.
  std::optional<std::pair<uint64_t, uint64_t>> placing_;
  // Whether a session could convert into the registered engine's memory (staging: direct).
  bool DirectPossible() const;
  // A pause of `engine` from its state now (no session yet).
  std::shared_ptr<DirectPause> NewDirectPause(std::shared_ptr<EngineRecord> engine) const;
  // The pool of the last dropped version, its buffers reused by the next session (same keys and
  // sizes: no allocation). At most one; freed with the engine.
  std::unique_ptr<StagingPool> spare_pool_;
  std::deque<uint64_t> recent_session_ids_;  // the last kRecentSessionIds, oldest first
  static constexpr size_t kRecentSessionIds = 64;
  std::random_device entropy_;
  RefitReport last_report_;
};

}  // namespace refit

#endif  // REFIT_REFIT_NODE_H_
