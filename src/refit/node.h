// Node: the refit state of one rollout node — the registered engine, the version it serves, the
// one active session — and the protocol that takes a session from begin to its outcome: receive,
// validate, prepare, pause, copy, resume. The server adapts RPCs to these calls; nothing here
// knows the wire, and every way a session ends goes through one place (End), which produces one
// report with a typed outcome and cause.
//
// An engine of several ranks (spec tensor_parallel.size > 1 without a rank: TP/EP workers, one
// process per GPU) registers rank by rank; once every rank is in, the node's one engine record is
// built over all of them (node_ranks.cc), so everything below runs as for a single engine. Under
// tensor_parallel.size engine the first registration gives the size (spec()).
//
// Engine records are shared: the node holds the registered one, and the active session (and a
// commit in flight) hold theirs, so an engine that unregisters or is replaced during a commit
// leaves its mappings alive until that commit has finished with them. A commit in flight is an
// outcome for the engine that left (never a write through an unmapped address).
//
// The pieces the node drives live apart: a commit's phases in Commit (commit.h), every pause of
// the engine in EnginePause (engine_pause.h), the versions kept in staging in VersionStore
// (version_store.h). Node keeps the registry of engines and ranks and the sessions' lifecycle.
//
// Threading: every method runs on one thread (the server's event loop). A Commit's Run and a
// DirectPause's Run run on a worker thread and touch only that object, its session and its
// engine record (planner, storage and control; never the node).
#ifndef REFIT_REFIT_NODE_H_
#define REFIT_REFIT_NODE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/failpoint.h"
#include "common/kept_threads.h"
#include "refit/bucket_ring.h"
#include "refit/commit.h"
#include "refit/converter.h"
#include "refit/engine_control.h"
#include "refit/engine_pause.h"
#include "refit/engine_record.h"
#include "refit/group_member.h"
#include "refit/placement.h"
#include "refit/planner.h"
#include "refit/rank_group_control.h"
#include "refit/session.h"
#include "refit/staged_version.h"
#include "refit/staging.h"
#include "refit/types.h"
#include "refit/version_store.h"
#include "refit/wire_plan.h"
#include "storage/engine_storage.h"
#include "transport/transport.h"

namespace refit {

// What status shows of each declared engine rank.
struct RankStatus {
  int tp_rank = 0;
  bool registered = false;
  RankPlacement placement;  // as registered
  uint64_t version = 0;
  std::string tag;
  bool dirty = false;         // registered dirty, or its last commit failed on it
  bool left_dirty = false;    // not registered: it left while a commit failed on it
  bool asleep = false;        // released its weights (Node::Sleep through its registration)
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
  // Engine groups: the member's phase, version or dirty flag changed (GroupMember).
  std::function<void(const GroupMember&)> on_group;
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
  // worker thread: Commit::Run returns with resume_pending() and the caller sends it
  // (Commit::StartLoopResume), saving the worker's wake-up and its hop back. Off: Run resumes.
  bool resume_on_loop = false;
  const FailpointSet* failpoints = nullptr;  // test builds only
  // Engine groups (GroupMember): this daemon serves part of an engine whose ranks span several
  // daemons; members == 0: none.
  GroupOptions group;
  // What session deadlines are computed and checked against; the system clock when null.
  const Clock* clock = nullptr;
  // Engine ranks: the node's spec. When it declares tensor_parallel.size > 1 without a rank, the
  // engine is that many rank processes, each registering its rank (RegisterEngine), and the node
  // builds the engine over all of them once every rank is in, with `make_staging` (which fills
  // pool, new_pool and converter for the group's storage). Null: a single engine.
  const spec::ModelSpec* spec = nullptr;
  std::function<absl::Status(EngineSetup&)> make_staging;
};

struct BeginResult {
  uint64_t session_id = 0;
  uint32_t deadline_ms = 0;
  // Wire format checkpoint: the tensors the trainer converts (empty plan otherwise).
  std::shared_ptr<const WireTable> wire;
  // staging: direct: the engine must be paused (StartDirectPause, DirectPause::Run,
  // FinishDirectPause) before the trainer is answered.
  bool pause_first = false;
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

  // The spec declares engine ranks (NodeOptions::spec), or its size is the engine's
  // (tensor_parallel.size: engine) and the engine's first rank registered a size above 1.
  bool ranked() const { return ranked_; }
  // Whether a registration at `placement` registers an engine rank (RegisterEngine's rank path):
  // ranked(), or while the engine's size is still open (a spec whose size is the engine's and no
  // registration yet), whether `placement` gives a tp_size above 1.
  bool RanksFor(const RankPlacement& placement) const;
  // RegisterEngine's refusals of `placement` alone (model, sizes, ranks), before anything is
  // mapped or planned for it.
  absl::Status CheckPlacement(const RankPlacement& placement) const;
  // The spec the engine is served under: NodeOptions::spec, or under tensor_parallel.size engine
  // that spec with the size the engine's first registration gave (spec::WithEngineSize). Null
  // without a spec.
  const spec::ModelSpec* spec() const { return spec_; }
  // The tensor-parallel rank of engine rank registration `engine_id`; -1 when it is none (a
  // single engine, or a rank that left).
  int TpRankOf(uint64_t engine_id) const;
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

  // The commit of the active session: StartCommit (loop) → Commit::Run (worker) → FinishCommit
  // (loop); with NodeOptions::resume_on_loop, Commit::StartLoopResume (loop) or RunResume (worker)
  // between the last two. A session has at most one commit.
  absl::StatusOr<std::shared_ptr<Commit>> StartCommit(uint64_t session_id);
  // Ends the session with the commit's outcome; returns the report (also last_report()).
  const RefitReport& FinishCommit(Commit& commit);

  // staging: direct (BeginResult::pause_first): the pause of session `session_id`'s engine,
  // StartDirectPause (loop) → DirectPause::Run (worker: refitd's audit of its mappings, the pause
  // and the engine's own audit) → FinishDirectPause (loop): OK once the engine is paused and the
  // session converts in place; otherwise the session has ended (the engine untouched) and the
  // status says why (the begin's answer).
  // `early`: the pause StartEarlyPause began for this begin request, adopted by the session
  // instead of a new one.
  absl::StatusOr<std::shared_ptr<DirectPause>> StartDirectPause(uint64_t session_id,
                                                                std::shared_ptr<DirectPause> early = nullptr);
  absl::Status FinishDirectPause(const std::shared_ptr<DirectPause>& pause);
  // staging: direct: the engine's pause requested as a begin request arrives, before its manifest
  // is decoded and planned, which it then overlaps (a Llama-8B manifest: ~0.9 ms of decode and
  // planning against a ~0.7 ms pause). Only for a manifest like the last one that converted in
  // place into this engine registration (`manifest_key`: a hash of what placement depends on,
  // NotePlacing), as in an RL loop's steady state: the first refit, and any other manifest, pause
  // after planning as before. nullptr otherwise, or when no session could convert in place now (a
  // session or a kept version's commit active, the engine asleep or unresponsive). The caller
  // waits for its answer (EnginePause::WhenAnswered) and takes it on the loop
  // (DirectPause::TakeAnswered) or, when that refuses, runs DirectPause::Run on a worker; then
  // either Begin's session adopts it (StartDirectPause) or, when the begin failed or placed
  // nothing, it is undone before the begin is answered: StartUndoEarlyPause (loop),
  // EnginePause::Undo (worker: the engine resumed at the version it holds, unless it was dirty),
  // FinishUndoEarlyPause (loop). Begins are refused as busy while an undo runs.
  std::shared_ptr<DirectPause> StartEarlyPause(uint64_t manifest_key);
  // A begin arrived: the engine's converter wakes its GPU (Converter::Warm) while the begin is
  // decoded and planned and the engine pauses. Loop thread.
  void WarmConverter();
  // Begin's session converts in place (BeginResult::pause_first) for a manifest of `manifest_key`.
  void NotePlacing(uint64_t manifest_key);
  // From StartEarlyPause (a pause was returned) to EndEarlyWindow, which the caller calls right
  // before its Begin: other begins are refused as busy and start no early pause.
  void EndEarlyWindow() { early_window_ = false; }
  void StartUndoEarlyPause() { ++early_undoing_; }
  void FinishUndoEarlyPause() { --early_undoing_; }
  bool undoing_early_pause() const { return early_undoing_ > 0; }

  // hold > 0: the commit of the held version `tag` (NotFound naming the held tags otherwise), or
  // of the previous committed version (rollback; FailedPrecondition when none is staged). Run
  // and finished like a session's commit. Unavailable while another commit runs; a session may
  // be receiving meanwhile.
  absl::StatusOr<std::shared_ptr<Commit>> StartVersionCommit(const std::string& tag);
  absl::StatusOr<std::shared_ptr<Commit>> StartRollback();
  // Held, current and previous versions in staging, held first, then current, then previous.
  std::vector<VersionInfo> Versions() const { return versions_.List(); }
  uint64_t versions_bytes() const { return versions_.bytes(); }
  // A commit by tag or rollback is in flight (a session's commit waits for it).
  bool version_committing() const { return version_commit_ != nullptr; }

  // Engine groups (node_group.cc; GroupMember has the protocol). The coordinator's commit of the
  // held version `tag`: as StartVersionCommit, but its Run leaves the engine paused and copied
  // (resume_pending). Refused while another group version is in flight, or no group is configured.
  absl::StatusOr<std::shared_ptr<Commit>> StartGroupCommit(const std::string& tag, absl::Duration deadline);
  // Loop thread, after the group commit's Run: true when the engine is paused and copied (the
  // commit stays in flight until resumed or restored); false when it ended before (FinishCommit
  // then reports it).
  bool FinishGroupCopy(const Commit& commit);
  // The coordinator's resume of `tag`: the copied commit, whose resume the caller sends
  // (Commit::StartLoopResume or RunResume) before FinishCommit. FailedPrecondition unless copied
  // with `tag`.
  absl::StatusOr<std::shared_ptr<Commit>> StartGroupResume(const std::string& tag);
  // The abort of `tag`, by the coordinator or at the member's deadline (`expired`). Copied: the
  // commit to restore (Commit::RunRestore with `before`, the version the engine held, null when it
  // is not kept) before FinishCommit. Still copying: null, and the member restores once copied
  // (GroupMember::abort_requested). Otherwise null: a held version `tag` was dropped.
  struct GroupRestore {
    std::shared_ptr<Commit> commit;
    std::shared_ptr<StagedVersion> before;
  };
  absl::StatusOr<GroupRestore> StartGroupAbort(const std::string& tag, bool expired);
  const GroupMember& group() const { return group_; }
  // Late join (GroupMember::PeersReported): the group's version as this member's peers report it.
  // Joining, the member serves it at once when its engine (every rank registered) holds it clean.
  // JoinHolds: the engine, or each registered engine rank, that runs another version while the
  // group's is known; each returned is marked dirty (held once; only the group's next version,
  // a full refit, resumes it), and the caller pauses it (EngineControl::Pause on a worker).
  // While no peer answered and the group's version is unknown (GroupMember::MustHoldUnanswered),
  // every clean one is held too, without being marked dirty; once a peer answers, each of those
  // that may run comes back with `release` (the caller resumes it with `version` and `tag`, what
  // it holds), and each that holds another version than the group's is marked dirty and stays
  // paused (nothing returned: paused already).
  struct JoinHold {
    std::string who;      // "the engine", "engine rank 1"
    uint64_t engine = 0;  // its registration (EngineRecord::id, RankRecord::id)
    std::shared_ptr<EngineControl> control;
    bool release = false;
    uint64_t version = 0;
    std::string tag;
  };
  // `answered`: the ask reached a peer (GroupMember::PeersAsked).
  void GroupPeersReported(const std::vector<GroupMember::PeerVersion>& peers, bool answered = true);
  std::vector<JoinHold> GroupJoinHolds();
  // Engine groups: on_group with the member's state now.
  void GroupChanged() const {
    if (hooks_.on_group && group_.enabled()) hooks_.on_group(group_);
  }

  // Sleep and wake. Sleep: the engine releases its weights; refitd drops its mappings (the
  // parameter list stays registered) and the engine is asleep. Unavailable while a commit is in
  // flight. A session may run on while the engine sleeps: its commit validates and then waits for
  // the wake (outcome staged), or, with refuse_while_asleep, is refused; sessions are refused at
  // begin then.
  //
  // Engine ranks: `engine_id` is a rank's registration, and each rank sleeps and wakes on its own
  // (SleepRank, WakeRank); the engine is asleep while any rank sleeps. A rank may sleep before
  // every rank is in: the engine built later is then asleep.
  absl::Status Sleep(uint64_t engine_id);
  // The engine (or rank) woke and mapped its parameters again at `storage` (the same list of
  // names, dtypes and shapes, at the same or new addresses; InvalidArgument naming the first that
  // differs). FailedPrecondition when it is not asleep. Returns the commit of the refit staged
  // while it slept, run like a session's, or null; for engine ranks only the wake of the last
  // rank asleep returns it, so the refit commits on every rank at once.
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
    // staged session), and the pause the engine is paused by for it (null until then, and once the
    // commit settled it).
    std::shared_ptr<const Placement> placement;
    std::shared_ptr<DirectPause> direct_pause;
    PhaseTimes staged_times;
    uint64_t staged_checksum = 0;
  };
  // Begin's steps: whether a begin of `manifest` may start now (every refusal before planning);
  // its tensors checked and planned (the plans kept only for `direct`: placement); where they go
  // in the engine (staging: direct; null when nothing places); the session's options.
  absl::Status MayBegin(const Manifest& manifest) const;
  absl::StatusOr<std::vector<std::shared_ptr<const TensorPlan>>> PlanManifest(const Manifest& manifest,
                                                                              uint64_t tensors_key, bool direct);
  std::shared_ptr<const Placement> PlaceDirect(std::vector<std::shared_ptr<const TensorPlan>> plans);
  Session::Options SessionOptions(const Manifest& manifest, uint64_t id, uint32_t deadline_ms,
                                  const SessionLimits& limits);
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
  // The active session's staging as a version in `state` (End, before the session goes).
  std::shared_ptr<StagedVersion> TakeActiveStaging(StagedVersion::State state, uint64_t checksum);
  // A commit of a kept version, checked and set up; `rollback` for the report's reason.
  // `group`: an engine group's version (StartGroupCommit).
  absl::StatusOr<std::shared_ptr<Commit>> StartKeptCommit(std::shared_ptr<StagedVersion> v, bool rollback,
                                                          bool group = false);
  const RefitReport& FinishVersionCommit(Commit& commit);
  // The commit's outcome applied to its engine record (and each of its ranks): dirty, version,
  // tag, verify mismatches. FinishCommit and FinishVersionCommit both start with it.
  void ApplyCommitOutcome(const Commit& commit);
  // GroupJoinHolds' parts: every clean engine (rank) while no peer answered; those running another
  // version than the group's once it is known; and what the first held that may run again.
  void HoldUnanswered(std::vector<JoinHold>& holds);
  void HoldOthers(std::vector<JoinHold>& holds);
  void ReleaseUnanswered(std::vector<JoinHold>& holds);
  // A refit validated while the engine sleeps: its session waits for the wake (FinishCommit).
  const RefitReport& AwaitWake(const CommitResult& result);
  // Whether the engine may sleep now: busy while a commit is in flight or a session converts into
  // its memory (staging: direct).
  absl::Status MaySleep() const;
  // A wake's `woken` storage against what `who` ("the engine", "engine rank 1") slept with: the
  // same parameters, in order, on the same device; InvalidArgument naming the first difference.
  static absl::Status CheckWoken(const std::string& who, const storage::EngineStorage& slept,
                                 const storage::EngineStorage& woken);
  // The engine is awake: the commit of the session whose refit waits for the wake, or null.
  std::shared_ptr<Commit> WokenCommit();
  // Engine ranks (node_ranks.cc).
  absl::StatusOr<uint64_t> RegisterRank(EngineSetup setup);
  absl::StatusOr<uint64_t> RegisterSingle(EngineSetup setup);
  absl::Status CheckRank(const EngineSetup& setup) const;
  // "the spec's FIELD is SIZE", or under tensor_parallel.size engine the engine's, for refusals.
  std::string SizeIs(const char* field, int size) const;
  // ranked_, rank_specs_, ranks_ and left_dirty_ for spec_.
  void InitRanks();
  // Under tensor_parallel.size engine: spec_ for the size `placement` gives (tp_size 0: 1).
  absl::Status AdoptEngineSize(const RankPlacement& placement);
  // Under tensor_parallel.size engine, once no engine, rank, session or dirty rank is left: the
  // size is open again for the next engine's first registration.
  void MaybeReopenEngineSize();
  // Every declared rank is in: the engine over them.
  absl::Status BuildGroup();
  // Sleep and wake of one rank (Sleep, Wake).
  absl::Status SleepRank(uint64_t engine_id);
  absl::StatusOr<std::shared_ptr<Commit>> WakeRank(uint64_t engine_id, std::unique_ptr<storage::EngineStorage> storage);
  // The registered rank of registration `engine_id`, or null.
  RankRecord* FindRank(uint64_t engine_id) const;
  // A rank slept or woke: the engine's storage over the ranks' storages now, asleep while any
  // rank sleeps, a new generation. Nothing without an engine (not every rank is in).
  void RanksStorageChanged();
  // "no engine is registered" naming the ranks missing, for Begin and Ready.
  std::string MissingRanks() const;
  // What every commit of the registered engine shares (timeouts, hooks, failpoints, verify).
  CommitSetup CommitBase(std::shared_ptr<EngineRecord> engine) const;
  // A commit of the active session (StartCommit, Wake).
  CommitSetup SessionCommitSetup() const;

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
  // spec(): options_.spec, or one of sized_specs_. size_open_: the spec's size is the engine's and
  // no engine (rank) holds one now; the next registration gives it. Sized specs are kept by size
  // for the daemon's life: planners of a commit in flight point into them.
  const spec::ModelSpec* spec_ = nullptr;
  bool size_open_ = false;
  std::map<int, std::unique_ptr<const spec::ModelSpec>> sized_specs_;
  std::vector<std::shared_ptr<const spec::ModelSpec>> rank_specs_;  // spec::ForRank, by rank
  std::vector<std::shared_ptr<RankRecord>> ranks_;  // by rank; null while not registered
  std::vector<bool> left_dirty_;                    // by rank: left while a commit failed on it
  // Late join: what GroupJoinHolds paused while no peer answered (not dirty), until a peer does or
  // a group version's commit takes them over.
  std::shared_ptr<EngineRecord> unanswered_engine_;
  std::vector<std::shared_ptr<RankRecord>> unanswered_ranks_;
  uint64_t committed_ = 0, refused_ = 0, aborted_ = 0, verify_mismatches_ = 0, staged_ = 0;
  VersionStore versions_;
  std::shared_ptr<Commit> version_commit_;  // a commit by tag, rollback or group version in flight
  GroupMember group_;
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
  std::deque<uint64_t> recent_session_ids_;  // the last kRecentSessionIds, oldest first
  static constexpr size_t kRecentSessionIds = 64;
  std::random_device entropy_;
  RefitReport last_report_;
};

}  // namespace refit

#endif  // REFIT_REFIT_NODE_H_
