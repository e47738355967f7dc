// Value types of the refit core: what trainers declare and send, independent of any wire format.
// The server translates Cap'n Proto messages into these at the edge.
#ifndef REFIT_REFIT_TYPES_H_
#define REFIT_REFIT_TYPES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace refit {

// A part of an HF tensor along one dimension, e.g. a tensor-parallel shard: the bytes carry
// indices [start, start + shape[dim]) of dimension `dim` of a tensor of `full_shape`; every other
// dimension is whole. refitd assembles a tensor's slices and converts it once they tile it.
struct TensorSlice {
  int32_t dim = -1;  // -1: not a slice (the whole tensor)
  uint64_t start = 0;
  Shape full_shape;
  bool present() const { return dim >= 0; }
};

// A slice's geometry against its tensor's (`name`, for the message): the same rank as the full
// shape, `dim` inside it, equal extents outside `dim`, a non-empty range inside the full extent.
// InvalidArgument "tensor 'x': slice ..." otherwise. Checked by the trainer client before it sends
// a slice and by refitd when one arrives.
absl::Status CheckSliceGeometry(const std::string& name, const Shape& shape, const TensorSlice& slice);

struct TensorDesc {
  std::string name;
  DType dtype = DType::kBF16;
  Shape shape;          // of the bytes sent (the slice's shape for a slice)
  uint64_t offset = 0;  // inside a bucket
  uint64_t nbytes = 0;
  TensorSlice slice = {};  // bucket announcements only
  // max|x| as the trainer computed it (NVFP4 single pass; docs/formats.md "Trainer-supplied
  // amax"); of the slice's bytes for a slice. nullopt: not supplied.
  std::optional<float> amax = std::nullopt;
};

// A BucketHeader seq asking refitd to number the bucket (several trainer ranks per session).
inline constexpr uint32_t kAssignBucketSeq = 0xFFFFFFFFu;

// How a bucket's checksum was computed (proto ChecksumKind): Checksum64 (common/checksum.h), or
// ParallelChecksum64 (common/parallel_checksum.h), which both ends compute on several threads.
enum class ChecksumKind : uint8_t { kChecksum64, kParallel64 };

struct BucketHeader {
  uint32_t seq = 0;  // or kAssignBucketSeq
  uint64_t nbytes = 0;
  uint64_t checksum = 0;
  ChecksumKind checksum_kind = ChecksumKind::kChecksum64;
  std::vector<TensorDesc> tensors;
};

// A trainer's version tag: a string it chooses (the training step, "step-1200", a run id and a
// step), carried from the manifest to the report, status, metrics, logs and the engine's resume.
// "" is no tag. Otherwise 1..kMaxTagBytes bytes of [A-Za-z0-9._:+-], so that a tag is safe as a
// metric label, in a log line and on a command line. refitd's own version (a counter it assigns
// at each commit) stays the order of commits; tags need not be unique or ordered.
inline constexpr size_t kMaxTagBytes = 128;

// What a session's buckets carry. kBf16: every tensor as the manifest declares it (refitd
// converts). kCheckpoint: the tensors of the session's WirePlan arrive converted by the trainer
// (checkpoint-format outputs: FP8/FP4 bytes plus scales); the others as declared.
enum class WireFormat : uint8_t { kBf16, kCheckpoint };
const char* WireFormatName(WireFormat f);  // "bf16", "checkpoint"

// One checkpoint-format output of a tensor the trainer converts: sent as `name + suffix`.
struct WireOutput {
  std::string suffix;
  DType dtype = DType::kU8;
  Shape shape;  // the whole tensor's output
};

// A tensor the trainer converts before sending (wire format checkpoint), as refitd's spec plans it.
struct WireTensor {
  uint32_t tensor = 0;  // index into the beginning rank's manifest
  std::string name;
  std::string format;   // formats::FormatName
  bool transpose = false;
  std::vector<WireOutput> outputs;  // formats::PlanOutputs order
  // NVFP4 fused-group members: every member's name (this one included), sharing one global
  // amax (the max over them all). Empty: the tensor's own amax.
  std::vector<std::string> amax_group;
};

struct WirePlan {
  std::vector<WireTensor> tensors;  // empty: nothing converts on the trainer
  std::string fp32_input = "exact";  // the spec's QuantizeOptions
  std::string nonfinite = "reject";
};

struct Manifest {
  std::string model;
  std::vector<TensorDesc> tensors;
  bool partial = false;
  uint32_t deadline_ms = 0;
  std::string tag;
  // Stage only (hold: K): receive, convert and validate, then keep the result in staging under
  // `tag` instead of writing it; a later commit by tag (or rollback) writes it. Needs a tag and a
  // full refit.
  bool stage_only = false;
  WireFormat wire_format = WireFormat::kBf16;
};

struct PhaseTimes {
  double receive_ms = 0, convert_ms = 0, validate_ms = 0, commit_ms = 0, pause_ms = 0, total_ms = 0;
  double plan_ms = 0;     // begin: checking and planning the manifest
  double finish_ms = 0;   // commit requested to the last bucket converted
  double prepare_ms = 0;  // building engine parameters and the copy plan, before the pause
  double verify_ms = 0;   // verify_after_commit: staged checksums (before the pause) + engine checksums (in it)
};

// How a session ended. kNone: no session has ended yet.
enum class Outcome {
  kNone,
  kCommitted,  // the engine serves the new version
  kRefused,    // validation refused the refit before anything was written; the engine is unchanged
  kAborted,    // ended before commit (trainer, operator, deadline, peer gone); the engine is unchanged
  kFailed,     // the commit or the session failed (engine, data, resources); see cause and reason
  kStaged,     // a stage-only refit: validated and held in staging under its tag, not written (hold: K)
};

// Why a session that did not commit ended: the metric label, the log's cause, the client's code.
enum class EndCause {
  kNone,
  kClientAbort,       // the trainer or an operator aborted
  kDeadlineExceeded,  // the session stalled past its deadline
  kDisconnected,      // a trainer, data-plane peer or refitd itself went away
  kInvalidInput,      // a manifest, bucket, name, dtype, shape, size or checksum was rejected
  kIncomplete,        // commit refused: missing, duplicate or mismatched tensors
  kOverloaded,        // no staging memory; retry later
  kEngineError,       // the engine left, failed or timed out in pause, copy or resume
  kInternal,          // a bug or an unexpected device error
  kVerifyMismatch,    // verify_after_commit: the engine's bytes after the copy differ from the staged ones
  // Causes of refusals a trainer acts on, carried by the status (WithCause) rather than ending a
  // session: they never label a session's end.
  kBusy,              // another session or commit holds refitd: begin again once it ended
  kEngineDirty,       // the engine's weights may be mixed (a commit failed in its window): only a full refit lands
};

const char* OutcomeName(Outcome outcome);    // "none", "committed", "refused", "aborted", "failed"
const char* EndCauseName(EndCause cause);    // "none", "client_abort", ... (the metric's label values)
// The cause of a failure a session reported on its own threads, from its status code.
EndCause CauseOfSessionFailure(const absl::Status& failure);

// A failure's cause travels with its status, so that a trainer tells apart failures of one code
// that it handles differently (busy or engine gone, both Unavailable; a dirty engine): `status`
// with `cause` attached (as an absl payload; kNone removes it). An OK status stays OK.
absl::Status WithCause(absl::Status status, EndCause cause);
// The cause attached by WithCause; kNone when there is none.
EndCause CauseOf(const absl::Status& status);

struct RefitReport {
  uint64_t session_id = 0;
  uint64_t version = 0;
  std::string tag;  // the manifest's tag ("" when none), whatever the outcome
  Outcome outcome = Outcome::kNone;
  EndCause cause = EndCause::kNone;
  std::string reason;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint32_t buckets = 0;
  uint32_t tensors = 0;
  PhaseTimes times;
  std::map<std::string, uint64_t> bytes_out_by_format;  // "fp8_block128", "bf16", "passthrough", ...
  // Device staging: the most input bytes of fused NVFP4 members held on the device at once,
  // waiting for the rest of their group across buckets (counted against the staging limit).
  uint64_t fused_held_peak_bytes = 0;
  // staging: direct: bytes converted straight into the engine's memory (no staging, no copy in
  // the commit window); the rest of bytes_out was staged and copied as usual.
  uint64_t bytes_in_place = 0;
};

// The status a trainer gets for a session that ended with `report`: OK when committed; a refused
// refit is FailedPrecondition; otherwise the code follows the cause (invalid input
// InvalidArgument, engine or peer gone Unavailable, staging ResourceExhausted, abort Aborted...).
// The report's cause is attached (WithCause).
absl::Status ReportStatus(const RefitReport& report);

// Limits on what a session may ask for; all from the daemon config, checked before allocation.
struct SessionLimits {
  uint64_t bucket_bytes = 256ull << 20;
  uint32_t bucket_slots = 2;
  uint64_t staging_bytes = 64ull << 30;
  uint32_t max_tensors = 1'000'000;
  uint32_t max_name_bytes = 512;
  uint32_t max_rank = 8;
  uint32_t deadline_ms = 600'000;
};

// InvalidArgument naming the problem when `tag` is not "" and not a valid tag (see kMaxTagBytes).
absl::Status CheckTag(std::string_view tag);

}  // namespace refit

#endif  // REFIT_REFIT_TYPES_H_
