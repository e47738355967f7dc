// Session: one refit, from begin to commit or abort. Receives announced buckets on the data
// plane into a ring of slots (receiver loop) and converts them into staging (converter loop),
// so receiving bucket k+1 overlaps converting bucket k, and a GPU converter's kernels for bucket
// k+1 queue behind bucket k's (one bucket in flight; Converter::EndBucket).
// Commit-time validation is the Ledger's; the engine swap is a Commit's (commit.h, through the
// Committer). A session never maps, pauses or resumes the engine, and writes into its memory only
// with staging: direct, once the node has paused it: tensors of the Placement given to
// UsePlacement are converted straight into the engine's parameters; everything else is staged.
//
// Threading: Announce/Finish/Abort may be called from any thread (the RPC loop); Abort wakes
// every blocked call. The two loops run on threads kept across sessions (Options::threads) or,
// without them, on threads of the session's own. The destructor stops the session (Stop: aborted
// unless it failed already, both loops ended).
//
// Files: session.cc (lifecycle, announce, the receive and convert loops, validate/finish/report),
// session_convert.cc (a bucket's conversion: wire intake, input tensors, slices), session_ranks.cc
// (a tensor's staging, Stage, over one rank or the engine's ranks), session_amax.cc (supplied amax
// and fused groups deferred until complete).
#ifndef REFIT_REFIT_SESSION_H_
#define REFIT_REFIT_SESSION_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/failpoint.h"
#include "common/kept_threads.h"
#include "refit/bucket_ring.h"
#include "refit/converter.h"
#include "refit/ledger.h"
#include "refit/planner.h"
#include "refit/slice_assembler.h"
#include "refit/staging.h"
#include "refit/types.h"
#include "refit/wire_plan.h"
#include "transport/transport.h"

namespace refit {

class Session {
 public:
  struct Options {
    uint64_t id = 0;
    bool partial = false;
    absl::Time deadline = absl::InfiniteFuture();
    SessionLimits limits;
    const FailpointSet* failpoints = nullptr;  // test builds: after_receive, after_convert
    // Trainer-supplied amax of whole tensors from the manifest (TensorDesc::amax), by name; bucket
    // announcements add theirs. See Session::SuppliedAmax.
    std::vector<std::pair<std::string, float>> supplied_amax;
    // Progress, for live metrics. Called on the session's own threads (receiver, converter),
    // outside its lock: on_received after each bucket arrived intact (its payload bytes);
    // on_converted after each bucket was converted (the bytes it staged per output format,
    // "passthrough" for copies, and the bytes the session's staging holds now).
    std::function<void(uint64_t bytes)> on_received;
    std::function<void(const std::map<std::string, uint64_t>& bytes_by_format, uint64_t staged_bytes)> on_converted;
    // Wire format checkpoint: the tensors that arrive converted by the trainer (their outputs are
    // checked, then staged as copies). nullptr or empty: every tensor arrives as declared.
    std::shared_ptr<const WireTable> wire;
    // staging: direct: buckets are received but none is converted until UsePlacement (the engine
    // paused) or the session ends, so that buckets announced while the engine pauses are still
    // converted straight into its memory.
    bool await_placement = false;
    // Where the session's two loops (receiver, converter) run: threads kept across sessions
    // (Node's), or, when null, threads of the session's own, started here and joined at its end.
    KeptThreads* threads = nullptr;
  };

  // REQUIRES: planner, receiver, ring, converter and pool outlive the session; ring, converter
  // and pool serve no other session meanwhile.
  Session(const Planner& planner, transport::Receiver& receiver, BucketRing& ring, Converter& converter,
          StagingPool& pool, Options options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Data-plane tag of bucket `seq` in session `id`.
  static uint64_t Tag(uint64_t id, uint32_t seq) { return (id << 32) | seq; }

  // A header seq that asks for the next sequence number of the announcing rank's range.
  static constexpr uint32_t kAssignSeq = kAssignBucketSeq;
  // Each trainer rank of a session numbers its buckets in a range of its own: rank k's (the rank
  // that began the session is 0, joined ranks 1, 2, ...) starts at SeqBase(k). So a rank knows a
  // bucket's number (its data-plane tag) before its announce is answered.
  static constexpr int kSeqRangeBits = 20;  // 1M buckets per rank
  static constexpr uint32_t kMaxRanks = 4095;  // SeqBase(kMaxRanks) < kAssignSeq
  static uint32_t SeqBase(uint32_t rank) { return rank << kSeqRangeBits; }
  // Checks the header (sizes, offsets, names; checked arithmetic) and queues it. An invalid
  // header fails the whole session (InvalidArgument naming the field). `header.seq` must be
  // the next number of rank `rank`'s range, or kAssignSeq; `assigned` (optional) receives the
  // bucket's number.
  absl::Status Announce(BucketHeader header, uint32_t* assigned = nullptr, uint32_t rank = 0);
  // Blocks until every announced bucket is received and its conversions issued (a GPU converter:
  // the last may still run), or the session failed. Every tensor has arrived then: the ledger
  // changes after it only by a conversion's failure (Ledger::changes).
  absl::Status WaitIssued() const;
  // Blocks until every announced bucket is received and converted, or the session failed.
  absl::Status Finish();
  // Finish succeeded: every announced bucket is in, and no trainer can be sending one.
  bool sealed() const;
  // The Ledger's verdict, and every tensor whose slices did not tile it (call after Finish).
  absl::Status Validate() const;
  void Abort(const std::string& reason);
  // Ends the session's threads (aborting it unless it failed already): afterwards nothing of it
  // runs, on the CPU or the GPU (each bucket's conversion completes before the next). Idempotent;
  // the destructor calls it. Not from the session's own threads.
  void Stop();
  // staging: direct, once the engine is paused: tensors of `placement` are converted into the
  // engine's memory from now on (Staging::Place); with Options::await_placement, conversions
  // start now.
  void UsePlacement(std::shared_ptr<const Placement> placement);
  // Bytes converted into the engine's memory so far (staging: direct).
  uint64_t in_place_bytes() const;

  uint64_t id() const { return options_.id; }
  bool partial() const { return options_.partial; }
  const Staging& staging() const { return *staging_; }
  // Hands the staged tensors over (a held version keeps them past the session). REQUIRES: Finish
  // returned OK; nothing calls staging() afterwards.
  std::unique_ptr<Staging> TakeStaging();
  const Ledger& ledger() const { return ledger_; }
  // Counters and phase times so far (receive, convert).
  RefitReport Report() const;
  absl::Status failure() const;

 private:
  struct Received {
    BucketHeader header;
    int slot;
    const uint8_t* data;  // the slot, or the bytes the transport lent (then `loan` != 0)
    uint64_t loan;
    // The announced checksum is still to be checked (a transport that does not check integrity
    // itself): by the converter, before anything of the bucket is read, so that the receive
    // loop posts the next bucket's receive at once (the wire does not wait for a checksum).
    bool verify = false;
  };
  // Gives `r`'s loan (if any) back to the transport and its slot back to the ring.
  void Done(const Received& r);
  void ReceiveLoop();
  void ConvertLoop();
  struct Converting;   // below
  struct DeviceGroup;  // below
  // Issues the conversions of the bucket in `c.item`, ending with EndBucket. On a failure that
  // ends the session, returns after Converter::Sync (nothing of the bucket is read any more).
  void Convert(Converting& c);
  // Convert's steps, over the bucket's state (BucketWork, session_convert.cc). Each sets its `failed`
  // when the session failed (FailBucket), after which nothing more of the bucket is converted.
  struct BucketWork;
  // Wire format checkpoint: `pushed` as an output of a tensor the trainer converted (kept for the
  // bucket's end, or assembled from slices), or a tensor sent unconverted that the plan has the
  // trainer convert (refused, named). False when `pushed` is neither: an input tensor.
  bool ConvertWireTensor(BucketWork& w, const TensorDesc& pushed, uint32_t seq);
  // A slice of output `out` of `e` (or its NVFP4 global scale sent with slices): assembled; the
  // tensor is staged once every output is whole.
  void AssembleWireSlice(BucketWork& w, const WireEntry& e, size_t out, const TensorDesc& pushed, bool slice_scale);
  // An input tensor: its pieces (the checkpoint tensors a Megatron-core tensor holds, or itself),
  // each assembled from slices when sliced, then staged.
  void ConvertPushed(BucketWork& w, const TensorDesc& pushed);
  // A whole input tensor: planned by the ledger, converted and staged (or held for its fused
  // group). ResourceExhausted fails the session; other errors are the tensor's.
  void StageArrived(BucketWork& w, const TensorDesc& desc, const uint8_t* src);
  // A failure that ends the session, once nothing of the bucket is read any more (Sync): what it
  // staged is counted and the session fails with `status`.
  void FailBucket(BucketWork& w, absl::Status status);
  // DataLoss naming the bucket when `r` is to be verified and its bytes do not match the
  // announced checksum.
  static absl::Status VerifyChecksum(const Received& r);
  // A SliceAssembler result: staging exhausted fails the bucket (true: stop converting it); another
  // error fails the tensor `name` in the ledger (the caller skips it, as it does a tensor whose
  // slices are still incomplete).
  bool SliceFailed(BucketWork& w, const absl::StatusOr<std::optional<SliceAssembler::Whole>>& added,
                   const std::string& name);
  // The bucket's bytes per format into the session's counts (and on_converted's report).
  void AddFormatBytesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for `c`'s conversions, records its failed tensors, releases its slot and counts it.
  // False when the session failed (the after-convert failpoint).
  bool Complete(Converting& c);
  // Releases what `c` held without looking at its results. REQUIRES: Converter::Sync since.
  void Release(Converting& c);
  // Wire format checkpoint: one converted tensor's outputs from this bucket (`parts[i]` is output
  // i, nullptr when absent) checked and staged as copies. ResourceExhausted ends the session.
  struct WirePart {
    const TensorDesc* desc = nullptr;  // nullptr: absent
    const uint8_t* src = nullptr;
  };
  absl::Status StageConverted(const WireEntry& entry, const std::vector<WirePart>& parts, uint64_t& out_bytes);
  // Wire format checkpoint, sliced outputs: the whole outputs assembled so far, per tensor, until
  // every output of the tensor is whole (converter thread only).
  struct WireAssembly {
    std::vector<TensorDesc> descs;
    std::vector<std::shared_ptr<uint8_t>> data;
    size_t whole = 0;
  };
  std::map<const WireEntry*, WireAssembly> wire_assembly_;
  // NVFP4 global scales seen: per sliced tensor (every rank sends the whole scalar; they must
  // agree) and per fused group (plan amax_group_key -> first member staged and its scale).
  absl::flat_hash_map<const WireEntry*, float> slice_scale_;
  absl::flat_hash_map<std::string, std::pair<std::string, float>> group_scale_;
  // Checks an NVFP4 tensor's global scale (positive, finite; equal across its fused group).
  absl::Status CheckGlobalScale(const WireEntry& entry, float scale_2);
  // A sliced NVFP4 tensor's global scale, sent whole by each rank: the first as the assembled
  // output, later ones (nullopt) only compared with it. Errors name the tensor.
  absl::StatusOr<std::optional<SliceAssembler::Whole>> SliceScale(const WireEntry& entry, const TensorDesc& pushed,
                                                                  const uint8_t* src);
  // Converts one tensor and stages this rank's part of each output. ResourceExhausted fails
  // the session; other errors are the tensor's (recorded by the ledger).
  // `device_amax`: a fused group's amax in a device float (device staging), or nullptr.
  // `claim`: the tensor's own trainer-supplied amax (checked against its max|x| as it converts).
  absl::Status Stage(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind, const TensorPlan& plan,
                     std::optional<float> global_amax, uint64_t& out_bytes, const float* device_amax = nullptr,
                     std::optional<float> claim = std::nullopt);
  // Stage's last resort (transposed, sharded or group-scaled; no device ops): the tensor converted
  // whole on the host, then this rank's part of each output copied into `outs` (one per target).
  absl::Status StageWholeOnHost(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                const TensorPlan& plan, std::optional<float> global_amax, std::optional<float> claim,
                                std::span<const formats::MutableBytes> outs);
  // Stage over several engine ranks: the tensor converted whole once, then each distinct part
  // (`distinct[i]` into `outs[i]`: a rank's shard, or the one part every rank shares) staged, on
  // the GPU by the device ops or else on the host.
  absl::Status StageOnRanks(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                            const TensorPlan& plan, std::optional<float> global_amax, const float* device_amax,
                            std::optional<float> claim, std::span<const Target* const> distinct,
                            std::span<const formats::MutableBytes> outs);
  // Over engine ranks: each output of `plan` split by rows whose every part is in `distinct` gets
  // its parts staged back to back in shard order (Staging::AllocateRun), their buffers into `outs`
  // (parallel to `distinct`), so the whole output converts in place; the rest stay null.
  // Each rank's input rows converted alone into its parts (RowsPerRank in session_ranks.cc).
  absl::Status ConvertRowsPerRank(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                  const TensorPlan& plan, int64_t rows, std::span<const Target* const> distinct,
                                  std::span<const formats::MutableBytes> outs);
  absl::Status AllocateRuns(const TensorPlan& plan, std::span<const Target* const> distinct,
                            std::span<formats::MutableBytes> outs);
  // Over engine ranks: stages one buffer per distinct staging key of `plan` (a part every rank
  // shares is staged once; rows split over the ranks as one run where they can be, AllocateRuns)
  // and counts them: `distinct[i]` into `outs[i]`. ResourceExhausted past the staging limit.
  absl::Status AllocateOnRanks(const TensorPlan& plan, absl::InlinedVector<const Target*, 4>& distinct,
                               absl::InlinedVector<formats::MutableBytes, 4>& outs, uint64_t& out_bytes);
  // A member of a complete fused group on the GPU, its targets staged: `outs` one per target (one
  // engine rank), or one per `distinct` key (several).
  struct StagedMember {
    absl::InlinedVector<const Target*, 4> distinct;
    absl::InlinedVector<formats::MutableBytes, 4> outs;
  };
  // The member's outputs in output order when each lands whole in one buffer (one engine rank's
  // unsharded tensor; over ranks, an expert of one rank's range or a tensor the ranks share):
  // what the batched group conversion takes. nullopt otherwise.
  std::optional<std::vector<formats::MutableBytes>> WholeMemberOutputs(const TensorPlan& plan,
                                                                       const StagedMember& staged) const;
  // `bytes` staged in `plan`'s format (or as copies) in the bucket being converted.
  void CountFormatBytes(const TensorPlan& plan, uint64_t bytes);
  // Single-pass NVFP4 (trainer-supplied amax): {amax to encode against, the tensor's own claim}
  // when the tensor and, for a fused member, every member of its group have a supplied amax
  // (manifest, announcements, or arrivals so far); the group's amax is then the max of its
  // members' and is fixed at the first member converted. nullopt: refitd computes the amax
  // (and holds fused members until their group is complete).
  std::optional<std::pair<float, float>> SuppliedAmax(const TensorDesc& desc, const TensorPlan& plan);
  // The converter's device side when staging is on the GPU, else nullptr.
  DeviceOps* device_ops() const;
  // Defer with staging on the GPU: each member stays on the device (in its ring slot while its
  // bucket converts, then, if the group is still incomplete, in a held device copy counted against
  // the staging limit) until the group is complete; then ConvertDeviceGroup. No host round trip.
  absl::Status DeferOnDevice(DeviceOps& ops, const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                             std::shared_ptr<const TensorPlan> plan, uint64_t& out_bytes);
  // A complete group on the GPU: its members staged and encoded against the group's amax, in the
  // converter's batched run where it takes them (DeviceOps::ConvertAmaxGroup), else through the
  // group's device amax float and each member's own conversion. Errors as for Stage.
  absl::Status ConvertDeviceGroup(DeviceOps& ops, DeviceGroup& group, uint64_t& out_bytes);
  // The group's amax float taken, reset and raised by every member; false when that failed (the
  // members' failures recorded).
  bool AccumulateGroupAmax(DeviceOps& ops, DeviceGroup& group);
  // One engine rank: stages every target of `plan` (its buffers into `outs`, in target order) and
  // counts them. ResourceExhausted past the staging limit.
  absl::Status AllocateTargets(const TensorPlan& plan, absl::InlinedVector<formats::MutableBytes, 4>& outs,
                               uint64_t& out_bytes);
  // End of a bucket: copies the members of incomplete groups out of the slot (ResourceExhausted
  // past the staging limit).
  absl::Status HoldPendingMembers();
  // Once their conversions are complete: frees the held copies and amax floats of `groups`.
  void RetireGroups(std::vector<DeviceGroup>& groups);
  absl::StatusOr<float*> TakeGroupAmax();
  // A fused NVFP4 member: held until every member of its group arrived (their shared amax
  // must be known before any member is encoded), then the whole group is converted.
  absl::Status Defer(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                     std::shared_ptr<const TensorPlan> plan, uint64_t& out_bytes);
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckHeader(const BucketHeader& header) const;

  const Planner& planner_;
  transport::Receiver& receiver_;
  BucketRing& ring_;
  Converter& converter_;
  const Options options_;
  Ledger ledger_;
  std::unique_ptr<Staging> staging_;
  SliceAssembler slices_;  // sliced tensors being assembled (in the ring's memory)
  // Checkpoint tensor -> the Megatron-core tensor a slice of it came from (spec `source`).
  std::map<std::string, std::string> source_of_ ABSL_GUARDED_BY(mu_);
  // Trainer-supplied amax by checkpoint tensor name (manifest, whole-tensor announcements, and
  // arrivals as they convert).
  absl::flat_hash_map<std::string, float> supplied_amax_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex mu_;
  std::deque<BucketHeader> announced_ ABSL_GUARDED_BY(mu_);
  std::deque<Received> received_ ABSL_GUARDED_BY(mu_);
  uint32_t announced_count_ ABSL_GUARDED_BY(mu_) = 0;                   // buckets announced, every rank
  absl::flat_hash_map<uint32_t, uint32_t> next_seq_ ABSL_GUARDED_BY(mu_);  // by rank: its next number
  uint64_t announced_tensors_ ABSL_GUARDED_BY(mu_) = 0;  // across buckets, against max_tensors
  uint32_t issued_ ABSL_GUARDED_BY(mu_) = 0;  // buckets whose conversions were issued
  uint32_t converted_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_placement_ ABSL_GUARDED_BY(mu_) = false;  // Options::await_placement, until UsePlacement
  bool sealed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_out_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> bytes_out_by_format_ ABSL_GUARDED_BY(mu_);
  absl::Duration receive_time_ ABSL_GUARDED_BY(mu_);
  absl::Duration convert_time_ ABSL_GUARDED_BY(mu_);

  // Bytes staged per format ("passthrough" for copies) in the bucket being converted, added to
  // bytes_out_by_format_ once per bucket. Converter thread only.
  struct FormatBytes {
    bool copy;
    formats::Format format;
    uint64_t bytes;
  };
  std::vector<FormatBytes> bucket_out_by_format_;
  // The bucket's bytes per format name, for on_converted. Converter thread only.
  std::map<std::string, uint64_t> bucket_report_;

  // Fused NVFP4 members waiting for their group, by group key. Converter thread only.
  struct PendingMember {
    TensorDesc desc;
    std::shared_ptr<const TensorPlan> plan;
    std::optional<float> amax;  // nullopt when the member's input was refused
    std::vector<uint8_t> input;  // a host copy of the member's input bytes
    std::optional<float> claim;  // the trainer's amax of the member, when it supplied one
  };
  std::map<std::string, std::vector<PendingMember>> pending_;
  // The trainer's amax of `desc` (its announcement, or the manifest), if it supplied one.
  std::optional<float> ClaimOf(const TensorDesc& desc) ABSL_LOCKS_EXCLUDED(mu_);
  // Fused groups converting single-pass from supplied amax: the group's amax and each member's
  // claim, fixed when the first member converted. Converter thread only.
  struct SuppliedGroup {
    float amax = 0.0f;
    absl::flat_hash_map<std::string, float> claims;
  };
  absl::flat_hash_map<std::string, SuppliedGroup> supplied_groups_;

  // The same with staging on the GPU (DeferOnDevice). Converter thread only.
  struct DeviceMember {
    TensorDesc desc;
    std::shared_ptr<const TensorPlan> plan;
    const uint8_t* src;  // the ring slot while its bucket converts, then `held`
    storage::MemoryKind src_kind;
    std::shared_ptr<uint8_t> held;  // device copy, when the group outlived the member's bucket
    uint64_t reserved;              // bytes of `held` counted against the staging limit
    std::optional<float> claim;     // the trainer's amax of the member (checked in its encode)
  };
  struct DeviceGroup {
    std::vector<DeviceMember> members;
    float* amax = nullptr;  // device float of the group's amax, when it is not computed in a batched run
  };
  std::map<std::string, DeviceGroup> device_pending_;
  std::vector<DeviceGroup> retiring_;  // converted this bucket; freed once the bucket is complete
  // A bucket whose conversions are issued (Converter::EndBucket) and not yet complete: what its
  // kernels still read (its slot or loan, whole tensors assembled from slices, fused groups'
  // amax floats and held copies) and what it reports once complete.
  struct Converting {
    Received item;
    uint64_t ticket = 0;
    std::vector<std::shared_ptr<uint8_t>> assembled;
    std::vector<DeviceGroup> retiring;
    std::map<std::string, uint64_t> report;  // bytes per format, for on_converted
    absl::Duration took;                     // issuing it, then waiting for it
  };
  std::vector<float*> free_amax_;
  uint64_t amax_blocks_ = 0;
  uint64_t held_bytes_ = 0;       // held member copies now
  std::atomic<uint64_t> peak_held_bytes_{0};  // the most held at once in this session (read by Report)

  std::unique_ptr<KeptThreads> own_threads_;  // without Options::threads
  KeptThreads::Run receiver_run_;
  KeptThreads::Run converter_run_;
};

}  // namespace refit

#endif  // REFIT_REFIT_SESSION_H_
