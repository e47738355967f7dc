// Trainer-side client library: connects to refitd's control plane, opens a refit session,
// packs tensors into buckets and sends them over the data plane, then commits.
//
//   auto client = TrainerClient::Connect("unix:/run/refitd/refitd.sock");
//   auto session = (*client)->Begin(manifest);
//   for (auto& t : tensors) session->Push(t);
//   absl::StatusOr<RefitReport> report = session->Commit();
//   if (!report.ok()) Handle(refit::CauseOf(report.status()), session->report());  // how it ended
//
// The data plane is the one refitd offers: UCX (host buckets) or NCCL (buckets packed on the
// caller's current CUDA device, which must differ from refitd's). FanoutClient feeds several
// daemons with every bucket packed once.
//
// Threading: a client and its sessions are used from one thread (the thread's KJ event loop,
// shared by every client made on that thread).
// A session destroyed before Commit aborts.
#ifndef REFIT_CLIENT_TRAINER_CLIENT_H_
#define REFIT_CLIENT_TRAINER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "refit/types.h"

namespace refit::client {

struct TensorRef {
  std::string name;
  DType dtype;
  Shape shape;
  // Dense row-major bytes: host memory, or (NCCL data plane) device memory, which is read
  // asynchronously until the bucket holding it is sent (the next Flush/Commit or overflowing
  // Push): keep it unchanged until then.
  const void* data;
  // Set to push a slice of the HF tensor (e.g. this rank's tensor-parallel shard): `shape` is
  // then the slice's, and refitd assembles the tensor from its slices before converting it.
  TensorSlice slice = {};
  // max|x| of the bytes pushed, for single-pass NVFP4 (docs/formats.md "Trainer-supplied amax"):
  // refitd encodes an NVFP4 tensor against it and refuses the tensor when it is below the real
  // max. Unset: measured by the session when RefitSession::MeasureAmax is on, else refitd's own.
  std::optional<float> amax = std::nullopt;
};

struct ParamChecksum {
  std::string name;
  uint64_t checksum;
  uint64_t nbytes;
};

// One declared rank of an engine of several ranks, as refitd's status shows it.
struct EngineRankInfo {
  int tp_rank = 0;
  bool registered = false;
  int ep_rank = 0;
  int device = -1;
  uint64_t version = 0;
  std::string tag;
  bool dirty = false;       // registered dirty, or the last commit failed on it
  bool left_dirty = false;  // not registered: it left while a commit failed on it
  bool responsive = true;
  uint32_t params = 0;
  uint64_t bytes = 0;
  bool asleep = false;  // released its weights (sleep) until its wake
};

// This daemon as a member of an engine group (docs/architecture.md "Engine groups").
struct GroupInfo {
  std::string name;  // "" when the daemon is in no group
  uint32_t members = 0;
  uint32_t member = 0;
  std::string phase;        // joining | idle | copying | copied | resuming | restoring
  std::string tag;          // the group version this member serves
  std::string pending_tag;  // the group version in flight
  bool dirty = false;
  std::string reason;
  uint64_t deadline_left_ms = 0;
  uint64_t commits = 0, aborts = 0, deadline_expiries = 0;
  std::string group_version;  // late join: what the other members serve ("" unknown)
};

struct DaemonStatus {
  std::string model;
  bool engine_registered = false;
  uint32_t engine_params = 0;
  uint64_t engine_bytes = 0;
  uint64_t version = 0;
  std::string tag;  // the trainer's tag of `version` ("" when none)
  uint64_t active_session = 0;
  uint64_t staging_bytes = 0;
  uint64_t staging_limit_bytes = 0;
  uint64_t ring_bytes = 0;  // bucket ring (bucket_bytes x slots); memory use = ring + staging
  bool ring_on_device = false;
  uint64_t committed = 0, refused = 0, aborted = 0;
  std::string data_endpoint;
  bool engine_dirty = false;       // the engine's weights may be mixed; only a full refit clears it
  bool engine_responsive = true;   // false while a pause/resume that timed out is unanswered
  bool verify_after_commit = false;  // engine.verify_after_commit is on
  uint64_t verify_mismatches = 0;    // commits it failed
  bool engine_asleep = false;        // the engine released its weights (EngineAgent::Sleep)
  uint64_t awaiting_wake = 0;        // the session whose validated refit commits at the wake; 0: none
  RefitReport last_report;
  std::string daemon_version;  // refitd's version; empty from a daemon older than the field
  std::string daemon_commit;   // the git commit refitd was built from
  std::vector<EngineRankInfo> ranks;  // engine ranks: every declared rank (empty for a single engine)
  GroupInfo group;
};

// How an engine group's commit went (FanoutClient::CommitGroup), member by member.
struct GroupCommitResult {
  std::string tag;
  // committed: every member copied and resumed with `tag`. aborted: some member could not copy
  // and every member that could was told to restore what it held (nothing serves `tag`). dirty:
  // a member was lost after every member copied, or did not restore: the group must take a full
  // group refit before it is consistent again.
  std::string outcome;
  std::vector<std::string> member_errors;  // by daemon: "" when that member did what was asked
  std::string error;                       // every member's error, each naming its daemon
};

// A version refitd keeps in staging (hold: K; docs/versions.md).
struct StagedVersionInfo {
  std::string tag;
  std::string state;  // held | current | previous
  uint64_t version = 0;  // refitd's version when last committed (0 while only held)
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  uint64_t session_id = 0;
};

struct VersionsList {
  std::vector<StagedVersionInfo> versions;
  uint32_t hold_limit = 0;
  uint64_t staging_limit_bytes = 0;
};

class RefitSession;
class FanoutClient;

class TrainerClient {
 public:
  // `address`: "unix:/path" or "host:port".
  static absl::StatusOr<std::unique_ptr<TrainerClient>> Connect(const std::string& address);
  ~TrainerClient();

  // Refusals carry refitd's cause (refit::CauseOf) where the code alone does not say how to
  // handle them: Unavailable with kBusy (another session or commit holds refitd: begin again once
  // it ended) or kEngineError (no engine, or one not answering); FailedPrecondition with
  // kEngineDirty (a partial refit of a dirty engine: only a full refit lands). After a pipelined
  // begin, the refusal comes from the session's first call that needs the answer.
  absl::StatusOr<std::unique_ptr<RefitSession>> Begin(const Manifest& manifest);
  // Joins the active session `session_id`, begun by another trainer rank (a pipeline stage, an
  // expert- or tensor-parallel rank): Push its own tensors (or slices), then Detach(). The rank
  // that began the session commits once every joined rank has detached.
  absl::StatusOr<std::unique_ptr<RefitSession>> Join(uint64_t session_id);
  absl::StatusOr<DaemonStatus> Status();
  absl::StatusOr<bool> AbortActive(const std::string& reason);
  absl::StatusOr<std::pair<uint64_t, std::vector<ParamChecksum>>> Checksums();
  // hold: K. Commits the held version `tag` (a stage-only refit) into the engine; a refused or
  // failed commit returns its status (NotFound naming the held tags for an unknown one).
  absl::StatusOr<RefitReport> CommitVersion(const std::string& tag);
  // Commits again the version committed before the current one, when it is still staged.
  absl::StatusOr<RefitReport> Rollback();
  // The report of the last CommitVersion or Rollback, whatever its outcome (a commit that failed
  // included: its status says that it failed, this how); nullopt when refitd sent none (it
  // refused to start the commit, or the call failed before refitd answered).
  std::optional<RefitReport> last_commit_report() const;
  absl::StatusOr<VersionsList> Versions();

  struct Impl;

 private:
  friend class FanoutClient;
  explicit TrainerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One trainer rank feeding several refitd daemons (rollout replicas) at once: Begin opens a
// session with the same manifest on every daemon, and every bucket is packed once and sent to all
// of them — on the NCCL data plane by one NCCL broadcast (every daemon on its own GPU, none on the
// trainer's), on UCX by one send per daemon. Commit commits on every daemon. Each daemon validates
// and swaps atomically on its own; the fan-out as a whole is not atomic: when one daemon refuses
// or fails, Commit reports it (naming the daemon) and the others may have committed.
//
// Threading: as TrainerClient (several clients may share a thread).
class FanoutClient {
 public:
  // `addresses`: one control-plane address per daemon (as TrainerClient::Connect).
  static absl::StatusOr<std::unique_ptr<FanoutClient>> Connect(const std::vector<std::string>& addresses);
  ~FanoutClient();

  size_t size() const;
  // The client of daemon `i` (status, checksums, operator calls).
  TrainerClient& daemon(size_t i);
  // Refusals carry refitd's cause (refit::CauseOf) where the code alone does not say how to
  // handle them: Unavailable with kBusy (another session or commit holds refitd: begin again once
  // it ended) or kEngineError (no engine, or one not answering); FailedPrecondition with
  // kEngineDirty (a partial refit of a dirty engine: only a full refit lands). After a pipelined
  // begin, the refusal comes from the session's first call that needs the answer.
  absl::StatusOr<std::unique_ptr<RefitSession>> Begin(const Manifest& manifest);
  // Joins the active session of every daemon (session_ids[i] on daemon i), begun by another
  // fan-out rank; Push, then Detach (see TrainerClient::Join).
  absl::StatusOr<std::unique_ptr<RefitSession>> Join(const std::vector<uint64_t>& session_ids);

  // Engine groups (docs/architecture.md "Engine groups"): the daemons are the members of one
  // engine group, in member order, each with hold >= 1. A group version is prepared by a fan-out
  // session begun with `stage_only` and a tag (Begin, Push, CommitAll: every member receives,
  // converts, validates and holds it; when any member fails, AbortGroup drops it everywhere), then
  // committed by CommitGroup: every member pauses its engine and copies the version, holding it
  // paused; once all copied, every member resumes with it. When a member cannot copy (or does not
  // answer within `timeout_ms`), every member is told to abort: the ones that copied write back
  // the version they held and resume with it. `member_deadline_ms` (0: each daemon's
  // group.decision_timeout_ms) is how long a copied member waits for the resume or abort before
  // it restores alone; `timeout_ms` (0: 10 s) bounds each phase's answers here and should be well
  // below it. `after_copied`, when set, runs once every member copied, before any resume (a
  // trainer's own record of the decision; tests die there). Returns the outcome
  // (GroupCommitResult); an error only for a call that could not be made at all.
  absl::StatusOr<GroupCommitResult> CommitGroup(const std::string& tag, uint32_t member_deadline_ms = 0,
                                                uint32_t timeout_ms = 0,
                                                const std::function<void()>& after_copied = nullptr);
  // Aborts group version `tag` on every member (held: dropped; copied: restored and resumed).
  // Returns the members' errors, each naming its daemon (OK when every member answered).
  absl::Status AbortGroup(const std::string& tag, const std::string& reason, uint32_t timeout_ms = 0);

  struct Impl;

 private:
  explicit FanoutClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class RefitSession {
 public:
  ~RefitSession();
  // The session's id; after a pipelined begin (docs/architecture.md "The pipelined begin") it
  // first waits for refitd's answer, so that ranks handed the id find the session to join.
  uint64_t id() const;
  uint64_t bucket_bytes() const;
  // Appends a tensor to the current bucket, sending the bucket first when it would overflow.
  // The bytes are copied: `t.data` may be reused when Push returns.
  // Wire format checkpoint (Manifest::wire_format): a BF16/F32 tensor that refitd's wire plan
  // lists is converted here first (trainer_convert.h: the CPU reference quantizers for host
  // tensors, the GPU kernels for device tensors) and its checkpoint-format outputs are packed
  // together into one bucket, named name + suffix. A slice of such a tensor converts on its own
  // when it does not cut the format's blocks; otherwise, and for transposed tensors, it is
  // refused (InvalidArgument naming the tensor). NVFP4 encodes against TensorRef::amax when set
  // (for a listed tensor: the global amax, refused when below the bytes' max|x|); a member of a
  // fused group (AmaxGroup) or a slice needs it (the max over the group's members and over every
  // rank's slices, reduced by the caller) and is refused naming the tensor without it.
  absl::Status Push(const TensorRef& t);
  // As Push, except that a device tensor on a data plane that sends device memory from where it
  // is (TransportDescriptor::sends_in_place: CUDA IPC) is not copied into a bucket: consecutive PushInPlace
  // tensors lying one after another in one allocation (16-byte aligned, at most 256 bytes apart,
  // as a trainer's contiguous parameter buffer holds them) travel as one bucket of that memory,
  // up to the bucket size. `t.data` must then stay allocated and unchanged until Commit (or
  // Detach, or Abort) returns. Anything else (host memory, a tensor this trainer converts under
  // wire format checkpoint, MeasureAmax on, a host data plane) is pushed as Push does. Memory in
  // CUDA virtual memory counts as one allocation across pieces mapped one after another (PyTorch's
  // expandable segments).
  absl::Status PushInPlace(const TensorRef& t);
  // Bytes of this session's tensors that PushInPlace sent from where they lie (not packed).
  uint64_t pushed_in_place_bytes() const;
  // Pushes each of `members` as Push does; a fused NVFP4 group member without TensorRef::amax
  // gets the max|x| over its group's members, which must all be among `members` (whole host
  // tensors), else refused naming the tensor.
  absl::Status PushGroup(std::span<const TensorRef> members);
  // Wire format checkpoint: the tensors whose max|x| `name`'s NVFP4 global amax spans, from the
  // wire plan: its fused group's members, or just `name` for an NVFP4 tensor of its own (whose
  // slices still share one amax across ranks); empty when the plan does not convert it to NVFP4.
  std::vector<std::string> AmaxGroup(const std::string& name) const;
  // Appends tensors to one bucket (sending the current bucket first when they would not fit),
  // as they are: no conversion. For callers that convert themselves (a converted tensor's
  // outputs must travel in one bucket).
  absl::Status PushTogether(std::span<const TensorRef> parts);
  // Wire format checkpoint: how many tensors refitd's plan has this trainer convert (0 otherwise).
  size_t trainer_converted_tensors() const;
  // OK when Push can take `p` as device memory (a build with CUDA, and `p` is CUDA device memory:
  // NCCL buckets pack it on the GPU, host buckets copy it to the host); Unimplemented without
  // CUDA, InvalidArgument when `p` is not device memory.
  static absl::Status CheckDeviceMemory(const void* p);
  // Sends the current bucket, if any.
  absl::Status Flush();
  // On: every BF16 tensor pushed afterwards without TensorRef::amax carries its max|x| in its
  // announcement, measured here (host tensors with the CPU reference, device tensors with refitd's
  // amax kernel on the caller's GPU, read back once per bucket), so refitd converts NVFP4 tensors
  // in one pass and a fused group's members without holding them. refitd ignores it for other
  // formats; the cost is one read of each tensor on the trainer. Off by default.
  void MeasureAmax(bool on);
  // Flushes, then asks refitd to validate and swap. Refused refits return FailedPrecondition
  // with refitd's message naming every offending tensor. A failed commit's status carries
  // refitd's cause where it gave one (refit::CauseOf: kEngineDirty when the failure left the
  // engine dirty, so that only a full refit lands; kDeadlineExceeded, kOverloaded, ...), and how
  // the session ended is report().
  absl::StatusOr<RefitReport> Commit();
  // Commit of a fan-out session: one report per daemon, in FanoutClient order. Fails when any
  // daemon did not commit, naming it (the others' outcomes are in the message).
  absl::StatusOr<std::vector<RefitReport>> CommitAll();
  // How the session ended, as refitd reported it in its answer to Commit (or CommitAll), whatever
  // the outcome: refused, aborted (a deadline, a peer gone) and failed refits included. nullopt
  // before the commit, and when no report came (the commit failed before refitd answered it: a
  // send or the connection failed). Fan-out: the first daemon's that neither committed nor
  // staged, else the first daemon's.
  std::optional<RefitReport> report() const;
  // One per daemon, in FanoutClient order (one entry unless fan-out); nullopt where none came.
  std::vector<std::optional<RefitReport>> reports() const;
  // The session id on each daemon (one entry unless fan-out).
  std::vector<uint64_t> ids() const;
  absl::Status Abort(const std::string& reason);
  // A joined rank: flushes, waits until everything it pushed is sent, and tells refitd it is
  // done, so that closing the session afterwards is not a failure.
  absl::Status Detach();

  // Fault injection (tests, example_trainer --fault): called with each bucket's bytes after its
  // checksum was announced and before they are sent, so the data plane can carry bytes other
  // than the announced ones. refitd must refuse such a bucket before anything is committed.
  void SetWireTamper(std::function<void(uint32_t seq, std::vector<uint8_t>& bytes)> tamper);

  struct Impl;
  explicit RefitSession(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit::client

#endif  // REFIT_CLIENT_TRAINER_CLIENT_H_
