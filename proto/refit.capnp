# refitd control plane. Trainers open refit sessions; engines register their parameters and a
# control capability; operators read status. Bulk tensor bytes never travel here: buckets are
# announced here and carried by the data plane (UCX/NCCL/CUDA IPC), matched by tag.
@0xe41872c58a9bfa4a;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("refit::proto");

# Errors are values: a call that fails for a reason the caller handles (bad input, a refused refit,
# a busy or engineless daemon) answers normally with `status` set; exceptions mean the connection
# itself failed. Codes are absl's canonical status codes.
enum StatusCode {
  ok @0;
  cancelled @1;
  unknown @2;
  invalidArgument @3;     # a field or tensor is wrong; the message names it
  deadlineExceeded @4;
  notFound @5;
  alreadyExists @6;
  permissionDenied @7;
  resourceExhausted @8;   # staging memory or a limit; retry later or smaller
  failedPrecondition @9;  # refused: incomplete, duplicate, mismatched, dirty engine
  aborted @10;            # the session was aborted
  outOfRange @11;
  unimplemented @12;
  internal @13;
  unavailable @14;        # no engine, busy, engine unresponsive, peer gone: retry later
  dataLoss @15;           # a bucket's checksum did not match
  unauthenticated @16;
}

struct Status {
  code @0 :StatusCode;
  message @1 :Text;
  cause @2 :EndCause;       # why, where refitd knows more than the code says (none otherwise, and from
                            # daemons older than the field): busy or engineDirty for a refused begin,
                            # the report's cause for a commit that did not land (engineDirty when it
                            # left the engine dirty)
}

# How a session ended, and why (the metric label refit_sessions_total{reason}).
enum Outcome {
  none @0;
  committed @1;
  refused @2;
  aborted @3;
  failed @4;
  staged @5;                # a stage-only refit is held under its tag (hold: K), not written
}

enum EndCause {
  none @0;
  clientAbort @1;
  deadlineExceeded @2;
  disconnected @3;
  invalidInput @4;
  incomplete @5;
  overloaded @6;
  engineError @7;
  internal @8;
  verifyMismatch @9;       # verify-after-commit read engine bytes that differ from the staged ones
  # Causes of refusals (Status.cause), never of a session's end:
  busy @10;                # another session or commit holds refitd: begin again once it ended
  engineDirty @11;         # the engine's weights may be mixed after a failed commit: only a full refit lands
}

struct TensorDesc {
  name @0 :Text;            # HF tensor name, as the trainer names it
  dtype @1 :Text;           # safetensors spelling: BF16, F32, F8_E4M3, ...
  shape @2 :List(Int64);
  offset @3 :UInt64;        # byte offset inside the bucket (bucket announcements only)
  nbytes @4 :UInt64;
  # A slice of the HF tensor (bucket announcements only): `shape` is the slice's, covering
  # indices [sliceStart, sliceStart + shape[sliceDim]) of dimension sliceDim of fullShape.
  sliceDim @5 :Int32 = -1;  # -1: the whole tensor
  sliceStart @6 :UInt64;
  fullShape @7 :List(Int64);
  # The tensor's max|x| (after the spec's fp32 input policy), supplied by the trainer so that an
  # NVFP4 tensor converts in one pass (docs/formats.md, "Trainer-supplied amax"). In a bucket
  # announcement or the manifest; for a slice, the max over the slice. refitd refuses, naming the
  # tensor, an amax below the tensor's real max|x|; other formats ignore it.
  amax @8 :Float32;
  hasAmax @9 :Bool;         # false: no amax supplied (refitd computes it)
}

struct Manifest {
  model @0 :Text;           # must equal the daemon's model spec name
  tensors @1 :List(TensorDesc);
  partial @2 :Bool;         # a partial refit: only whole parameters the spec marks updatable alone
  deadlineMs @3 :UInt32;    # 0: the daemon's default session deadline
  tag @4 :Text;             # the trainer's version tag (e.g. "step-1200"); "" for none. 1..128 bytes
                            # of [A-Za-z0-9._:+-]; carried to the report, status, metrics, the engine
  stageOnly @5 :Bool;       # hold: K: validate and keep under `tag`; commitVersion(tag) writes it later
  wireFormat @6 :Text;      # "" or "bf16": tensors travel as the manifest declares them (refitd converts);
                            # "checkpoint": the trainer converts the tensors begin's `wirePlan` lists and
                            # sends their checkpoint-format outputs (FP8/FP4 bytes plus scales)
}

# Wire format checkpoint: the tensors the trainer converts itself before sending, as refitd's spec
# plans them. Tensors not listed travel as the manifest declares them. Lean: one entry per listed
# tensor; an output's bytes follow from its dtype and shape.
struct WirePlan {
  tensors @0 :List(WireTensor);
  fp32Input @1 :Text;       # "exact" | "round_to_bf16" (the spec's options)
  nonfinite @2 :Text;       # "reject" | "propagate"
}

struct WireTensor {
  tensor @0 :UInt32;        # index into the manifest's tensors (the beginning rank's manifest)
  name @1 :Text;            # the trainer tensor's name
  format @2 :Text;          # a quantized format's name, as `refitctl formats` lists it
  transpose @3 :Bool;       # swap the last two dimensions before quantizing
  outputs @4 :List(WireOutput);  # in formats::PlanOutputs order; send each as `name + suffix`,
                                 # all of a tensor's outputs in one bucket
  amaxGroup @5 :List(Text); # NVFP4 members of a fused group (q/k/v, gate/up, w1/w3): every
                            # member's name, this one included; their global amax is the max over
                            # them all (and over every rank's slices). Empty: the tensor's own
                            # amax (over every rank's slices when sliced).
}

struct WireOutput {
  suffix @0 :Text;
  dtype @1 :Text;
  shape @2 :List(Int64);    # the whole tensor's output (refitd keeps its own shard)
}

# How a bucket's checksum is computed. checksum64 (src/common/checksum.h) is sequential;
# parallel64 (src/common/parallel_checksum.h) splits over threads on both ends. A trainer sends
# parallel64 only to a daemon whose begin or join answered parallelChecksum (daemons older than the
# field verify checksum64).
enum ChecksumKind {
  checksum64 @0;
  parallel64 @1;
}

struct BucketHeader {
  seq @0 :UInt32;           # 0, 1, 2, ... in send order
  nbytes @1 :UInt64;        # payload bytes on the data plane
  checksum @2 :UInt64;      # of the payload, by checksumKind (0 on data planes that check integrity)
  tensors @3 :List(TensorDesc);
  checksumKind @4 :ChecksumKind;
}

struct PhaseTimes {
  receiveMs @0 :Float64;
  convertMs @1 :Float64;
  validateMs @2 :Float64;
  commitMs @3 :Float64;     # copying the prepared bytes into the engine (inside the pause)
  pauseMs @4 :Float64;      # engine paused (the window the engine does not serve)
  totalMs @5 :Float64;      # begin to commit reply
  planMs @6 :Float64;       # begin: checking and planning the manifest
  finishMs @7 :Float64;     # commit requested to the last bucket converted
  prepareMs @8 :Float64;    # building engine parameters and the copy plan, before the pause
}

struct RefitReport {
  sessionId @0 :UInt64;
  version @1 :UInt64;
  outcome @2 :Text;         # committed | refused | aborted | failed | staged (the name of outcomeCode)
  reason @3 :Text;
  bytesIn @4 :UInt64;
  bytesOut @5 :UInt64;
  buckets @6 :UInt32;
  tensors @7 :UInt32;
  times @8 :PhaseTimes;
  bytesByFormat @9 :List(FormatBytes);  # output bytes per format ("fp8_block128", "passthrough", ...)
  outcomeCode @10 :Outcome;
  cause @11 :EndCause;
  tag @12 :Text;            # the manifest's tag ("" when it had none)
  fusedHeldPeakBytes @13 :UInt64;
  # Device staging: the most input bytes of fused NVFP4 members held on the device at once,
  # waiting across buckets for the rest of their group (counted against limits.staging_bytes).
  bytesInPlace @14 :UInt64;
  # staging: direct: output bytes converted straight into the engine's memory (not staged, not
  # copied in the commit window).
}

struct FormatBytes {
  format @0 :Text;
  bytes @1 :UInt64;
}

interface Session {
  announce @0 (header :BucketHeader) -> (seq :UInt32, status :Status);
  # Queues a bucket for receipt, or fails if the session has already failed. Each trainer rank
  # numbers its buckets in its own range (begin/join: seqBase, seqBase + 1, ...): a header with
  # seq 0xFFFFFFFF gets the rank's next number assigned; any other seq must be that number. `seq`
  # is the bucket's number either way: its data-plane tag is (sessionId << 32) | seq. Send the
  # bytes after this returns, except over a data plane whose receiver drops a message of an ended
  # session (CUDA IPC; the transport descriptor's `early_sends`): there they may go once the
  # number is known, and the daemon holds a message that arrives before its announce is read.

  commit @1 () -> (report :RefitReport, status :Status);
  # First waits until every rank that joined the session has detached (bounded by the
  # session's deadline; a joined rank that disconnects without detaching aborts the session, and
  # the commit then fails with status aborted naming why). Ranks must have joined before the
  # commit is sent: a rank joining later is too late once the commit started.
  # Then waits for every announced bucket, validates, and swaps into the engine. `status` is not ok
  # when the refit did not commit (refused: failedPrecondition, the engine untouched; aborted;
  # failed); `report` says how it ended either way.

  abort @2 (reason :Text) -> (status :Status);

  detach @3 () -> (status :Status);
  # A joined trainer rank has announced and sent everything it will push; dropping this
  # capability afterwards is not a failure. (Without detach, a joined rank's disconnect aborts
  # the session.) The rank that began the session commits; its commit waits for every detach.
}

struct EngineParam {
  name @0 :Text;
  dtype @1 :Text;
  shape @2 :List(Int64);
  nbytes @3 :UInt64;
  storage :union {
    shm :group {
      name @4 :Text;        # POSIX shared memory object name ("/refit-engine-123")
      offset @5 :UInt64;
    }
    cudaIpc :group {
      handle @6 :Data;      # cudaIpcMemHandle_t bytes of the allocation holding the parameter
      offset @7 :UInt64;
      device @8 :Int32;
    }
    cudaVmm :group {
      # A CUDA virtual-memory allocation (cuMemCreate + cuMemMap) exported as a POSIX file
      # descriptor (cuMemExportToShareableHandle). Descriptors pass only over a Unix-socket
      # connection, at most 64 in one message (docs/architecture.md, "In place").
      fd @9 :SharedFd;      # set on the first parameter of each allocation in the list
      allocation @10 :UInt32;  # which allocation of the list: the parameters sharing it share one fd
      offset @11 :UInt64;   # of the parameter from the start of the allocation's mapping
      size @12 :UInt64;     # bytes of the allocation's mapping (refitd maps [0, size) of it)
      device @13 :Int32;
      pieces @14 :List(VmmPiece);
      # Instead of `fd`, on the first parameter of an allocation that is a run of several mappings
      # at consecutive addresses (expandable segments map memory piece by piece): each piece's
      # descriptor and size, in address order; `size` is their sum. refitd maps them the same way.
    }
  }
}

struct VmmPiece {
  fd @0 :SharedFd;
  size @1 :UInt64;
}

interface SharedFd {
  # Carries a file descriptor (Capability::Server::getFd) and nothing else: the receiver reads
  # it with Capability::Client::getFd while it holds the capability.
}

interface EngineControl {
  pause @0 () -> (stale :List(Text));
  # Returns once the engine runs nothing that reads its parameters. refitd waits for it at most
  # `engine.pause_timeout_ms`. `stale`: the engine's registration audit, done once paused: the
  # parameters no longer where it registered them (each still at the address, in the allocation,
  # it registered). refitd then writes nothing, resumes the engine at the version it has and
  # refuses the refit naming them. Engines older than the field answer none.
  resume @1 (version :UInt64, tag :Text) -> ();
  # `tag`: the trainer's tag of `version` ("" when it had none).
  # The parameters now hold `version`; serving may continue. A resume with no pause before it
  # only records the version (refitd sends one after a pause that timed out).
}

interface Registration {
  # Dropping this capability (or the connection) unregisters the engine.
  version @0 () -> (version :UInt64, tag :Text);

  sleep @1 () -> (status :Status);
  # The engine releases its weights: refitd drops its mappings of them (the parameter list stays
  # registered) and reports the engine asleep. Refused (unavailable) while a commit is in flight.
  # A refit while the engine sleeps is validated and staged (outcome staged), or refused when the
  # daemon's engine.asleep_refits is refuse. An engine rank's registration sleeps that rank; the
  # engine is asleep while any of its ranks sleeps.

  wake @2 (params :List(EngineParam)) -> (status :Status, committed :Bool, report :RefitReport);
  # The engine mapped its weights again: the same parameters (names, dtypes, shapes, in order) at
  # the same or new addresses. refitd maps them and, when a refit was staged while the engine
  # slept, commits it (pause, copy, resume) before answering: `committed` and its `report`. For
  # engine ranks, the wake of the last rank asleep commits it, on every rank.
}

struct DaemonStatus {
  model @0 :Text;
  engineRegistered @1 :Bool;
  engineParams @2 :UInt32;
  engineBytes @3 :UInt64;
  version @4 :UInt64;
  activeSession @5 :UInt64;          # 0 when none
  stagingBytes @6 :UInt64;
  stagingLimitBytes @7 :UInt64;
  lastReport @8 :RefitReport;
  committed @9 :UInt64;
  refused @10 :UInt64;
  aborted @11 :UInt64;
  dataEndpoint @12 :Text;
  engineDirty @13 :Bool;             # the engine's weights may be mixed; only a full refit clears it
  ringBytes @14 :UInt64;             # bucket ring: bucket_bytes x bucket_slots, allocated once
  ringOnDevice @15 :Bool;            # the ring is in GPU memory (NCCL data plane)
  engineResponsive @16 :Bool;        # false while a pause/resume that timed out is unanswered
  daemonVersion @17 :Text;           # refitd's version (CMake project version, e.g. "0.1.0"); empty from older daemons
  daemonCommit @18 :Text;            # the git commit refitd was built from, or "unknown"
  tag @19 :Text;                     # the trainer's tag of `version` ("" when none)
  verifyAfterCommit @20 :Bool;       # config verify_after_commit: engine bytes checked after each copy
  verifyMismatches @21 :UInt64;      # commits whose engine bytes did not match the staged ones
  ranks @22 :List(EngineRankStatus); # engine ranks: every declared rank (empty for a single engine)
  engineAsleep @23 :Bool;            # the engine released its weights (Registration.sleep)
  awaitingWake @24 :UInt64;          # the session whose validated refit commits at the wake; 0 when none
  group @25 :GroupStatus;            # engine groups: this daemon's part (name "" when not in a group)
}

# This daemon as a member of an engine group (docs/architecture.md "Engine groups").
struct GroupStatus {
  name @0 :Text;                     # group.name; "" when the daemon is in no group
  members @1 :UInt32;                # group.members
  member @2 :UInt32;                 # group.member: this daemon's index
  phase @3 :Text;                    # joining | idle | copying | copied | resuming | restoring
  tag @4 :Text;                      # the group version this member serves ("" before its first)
  pendingTag @5 :Text;               # the group version in flight (copying .. restoring)
  dirty @6 :Bool;                    # the group may be mixed: a full group refit must land
  reason @7 :Text;                   # why it is dirty or joining
  deadlineLeftMs @8 :UInt64;         # copied: time left before this member decides alone
  groupCommits @9 :UInt64;           # group versions resumed
  groupAborts @10 :UInt64;           # group versions aborted or restored
  deadlineExpiries @11 :UInt64;      # copied members that decided at their deadline
  groupVersion @12 :Text;            # late join: the version the other members serve, as they
                                     # answered ("" unknown: not asked, none answered, or they differ)
}

# One declared rank of an engine of several ranks (DaemonStatus.ranks).
struct EngineRankStatus {
  tpRank @0 :Int32;
  registered @1 :Bool;
  epRank @2 :Int32;
  device @3 :Int32;                  # -1: host
  version @4 :UInt64;
  tag @5 :Text;
  dirty @6 :Bool;                    # registered dirty, or the last commit failed on it
  leftDirty @7 :Bool;                # not registered: it left while a commit failed on it
  responsive @8 :Bool;
  params @9 :UInt32;
  bytes @10 :UInt64;
  asleep @11 :Bool;                  # released its weights (its Registration.sleep) until its wake
}

interface Daemon {
  begin @0 (manifest :Manifest, manifestKey :UInt64, sessionId :UInt64)
      -> (session :Session, sessionId :UInt64, dataEndpoint :Text, bucketBytes :UInt64, status :Status,
          wirePlan :WirePlan, seqBase :UInt32, ownSeqs :Bool, manifestKey :UInt64, needManifest :Bool,
          parallelChecksum :Bool);
  # One session at a time: fails with "busy" while another runs. Data-plane tags of this session
  # are (sessionId << 32) | seq. `wirePlan`: with manifest.wireFormat "checkpoint", what the
  # trainer converts before sending (empty otherwise). `ownSeqs` (false from daemons older than
  # the field): this rank's buckets are numbered seqBase, seqBase + 1, ... in the order it
  # announces them, so it may number them itself and send a bucket's bytes without waiting for
  # its announce's answer (Session.announce).
  # The manifest's tensors are the same every refit: the answer's `manifestKey` (0: not kept, or
  # a daemon older than the field) names this manifest's tensor list, which refitd keeps (its
  # last one). A later begin may send `manifestKey` with a manifest whose `tensors` is empty (the
  # other fields as usual): refitd uses the list it kept. When it no longer has it (restarted,
  # or another list came since), the begin fails with `needManifest` set, and nothing else
  # happened: the trainer sends the whole manifest. Tensor lists with a supplied amax are not
  # kept (the amax changes each refit). refitd keeps the last 8 lists.
  # `sessionId` (0: refitd chooses): the trainer's choice of this session's id, nonzero and below
  # 2^32, refused (invalidArgument) when one of refitd's recent sessions had it. Knowing its
  # data-plane tags, the trainer need not wait for the answer: it may announce on the answer's
  # session as promised (Cap'n Proto promise pipelining: refitd takes the announce once the begin
  # is answered) and, on a data plane with early sends (CUDA IPC), send a bucket's bytes at once;
  # refitd holds them for the session, and drops them if the begin is refused. The answer's
  # `sessionId` is the chosen one. `parallelChecksum` (false from daemons older than the field):
  # the session verifies buckets announced with checksumKind parallel64.

  registerEngine @1 (params :List(EngineParam), control :EngineControl, version :UInt64, dirty :Bool,
                     tag :Text, tpRank :Int32, tpSize :Int32, epRank :Int32, epSize :Int32,
                     device :Int32 = -1, model :Text)
      -> (registration :Registration, version :UInt64, status :Status);
  # Engine ranks: an engine of several rank processes (one per GPU, the TP/EP workers of one
  # engine) registers each rank with the node's one refitd, giving `tpRank` of `tpSize`, `epRank`
  # of `epSize` (0: no expert parallelism), its `device` (-1: host) and `model` ("": not checked).
  # tpSize 0 is a single engine, registered as before engine ranks. Refused naming the field when
  # they differ from the spec (docs/config.md "Engine ranks"), the rank is registered and live,
  # or the parameters differ from another rank's. A rank that left is replaced by its next
  # registration; refits wait (begin is refused naming the missing ranks) until every declared
  # rank is in.
  # `version` is what the engine holds now (0 for a fresh engine), `tag` the trainer's tag of it
  # ("" when none). `dirty`: the engine lost refitd inside a commit window, so its parameters may
  # hold a mix of versions; it stays paused, and
  # refitd accepts only a full refit for it, until one lands (docs/reliability.md). Refused
  # (unavailable) while another engine is registered: an engine re-registers by dropping its
  # registration (or its connection) first.

  status @2 () -> (status :DaemonStatus);
  abortActive @3 (reason :Text) -> (aborted :Bool);

  join @5 (sessionId :UInt64) -> (session :Session, dataEndpoint :Text, bucketBytes :UInt64, status :Status,
                                  wirePlan :WirePlan, seqBase :UInt32, ownSeqs :Bool, parallelChecksum :Bool);
  # Another trainer rank (a pipeline stage, an expert-parallel or tensor-parallel rank) pushes
  # into the active session `sessionId`: its buckets are numbered from its own `seqBase` (see
  # begin), and it detaches when done (or aborts the refit). Only the rank that began the session
  # commits. `wirePlan`: the session's (see begin); entries name their tensors.

  commitVersion @6 (tag :Text) -> (report :RefitReport, status :Status);
  # Commits the held version `tag` (hold: K) into the engine, atomically as a session's commit.
  rollback @7 () -> (report :RefitReport, status :Status);
  # Commits again the version committed before the current one, when it is still staged.
  versions @8 () -> (versions :List(StagedVersion), holdLimit :UInt32, stagingLimitBytes :UInt64);

  groupCommit @9 (tag :Text, deadlineMs :UInt32) -> (report :RefitReport, status :Status);
  # Engine groups, phase 2 (docs/architecture.md "Engine groups"): writes the held version `tag`
  # into the engine as commitVersion does, but answers once the engine is paused and copied,
  # leaving it paused ("copied"). Within `deadlineMs` (0: group.decision_timeout_ms) the
  # coordinator sends groupResume or groupAbort; past it the member restores the version it held.
  groupResume @10 (tag :Text) -> (report :RefitReport, status :Status);
  # Every member copied `tag`: the engine resumes with it.
  groupAbort @11 (tag :Text, reason :Text) -> (report :RefitReport, status :Status);
  # Abort `tag` on this member: copied, the engine gets the version it held before back (from its
  # kept copy) and resumes with it; held only, the held version is dropped.

  checksums @4 () -> (version :UInt64, params :List(ParamChecksum), status :Status);
  # Checksum64 of every registered engine parameter, read from the engine's storage
  # (for `refitctl verify` and tests). Fails while a commit is in its pause window.
}

# A version kept in staging (hold: K, docs/versions.md).
struct StagedVersion {
  tag @0 :Text;
  state @1 :Text;           # held | current | previous
  version @2 :UInt64;       # refitd's version when it was last committed (0 while only held)
  bytes @3 :UInt64;         # staging bytes it occupies
  checksum @4 :UInt64;      # ParallelChecksum64 chain over its staged tensors (name, bytes), by name
  sessionId @5 :UInt64;     # the session that staged it
}

struct ParamChecksum {
  name @0 :Text;
  checksum @1 :UInt64;
  nbytes @2 :UInt64;
}
