// Converter: turns a trainer tensor into its engine parameters' checkpoint-format bytes in
// staging, on the CPU (cpu_converter.h, the reference quantizers of src/formats/) or on the
// engine's GPU (src/refit/gpu/, the kernels of kernels/, byte-identical). Both run the same
// plan; which one a daemon uses follows its `staging:` setting.
//
// Threading: one converter per session, used by that session's converter thread only.
#ifndef REFIT_REFIT_CONVERTER_H_
#define REFIT_REFIT_CONVERTER_H_

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "formats/format.h"
#include "refit/planner.h"
#include "refit/types.h"
#include "storage/engine_storage.h"
#include "storage/memory.h"

namespace refit {

// The global amax of one NVFP4 conversion (formats::NeedsGlobalAmax formats; others ignore it).
// Neither `device` nor `host`: the tensor's own, computed first (two passes).
struct PlannedAmax {
  const float* device = nullptr;  // a fused group's amax in a device float (members held on the GPU)
  std::optional<float> host;      // trainer-supplied: the tensor's amax, or the max over its group's
  // The tensor's own supplied amax: the encode checks it against the tensor's real max|x| in the
  // same pass, and the tensor is refused, named, when it is below.
  std::optional<float> claim;
};

// The device side of a converter whose staging is on the GPU: every step of a plan (transpose,
// this rank's shard slice, a fused group's shared NVFP4 amax) and every engine layout step and
// derived parameter, on the converter's own stream, with no host round trip. All pointers but
// host sources are device memory; every call only enqueues work, except Synchronize.
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // Converts `desc` per the whole plan: transposed when plan.transpose, quantized into whole
  // outputs, then each target's part written to `outs` (one per plan.targets entry, that target's
  // bytes: its rank's shard slice, or the whole output). Over engine ranks a target whose part
  // another target already stages (one key for every rank) has a null `data` and is skipped.
  // `amax`: where the NVFP4 global amax comes from (above). Errors surface here or at
  // Converter::Sync, as for Convert (a supplied amax below the tensor's max|x| at Sync).
  virtual absl::Status ConvertPlanned(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                                      storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                                      const formats::QuantizeOptions& options, const PlannedAmax& amax) = 0;
  // *amax = 0, then *amax = max(*amax, max|x| of `desc` under the input policy).
  virtual absl::Status ResetAmax(float* amax) = 0;
  virtual absl::Status AccumulateAmax(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                      const formats::QuantizeOptions& options, float* amax) = 0;
  // `bytes` from `src` (host or device) to device `dst`.
  virtual absl::Status Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, storage::MemoryKind src_kind) = 0;
  // Device-to-device copies of regions that do not overlap: one launch for many (a stacked
  // parameter's pieces), where the device side has one; else one Copy each.
  struct CopyRegion {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t bytes;
  };
  virtual absl::Status CopyMany(std::span<const CopyRegion> regions) {
    for (const CopyRegion& r : regions) {
      if (absl::Status st = Copy(r.dst, r.src, r.bytes, storage::MemoryKind::kDevice); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // One member of a fused NVFP4 amax group: a device tensor and its outputs (one per output of
  // `format`, in order: an unsharded, untransposed plan's targets).
  struct GroupMember {
    const TensorDesc* desc;
    const uint8_t* src;
    std::span<const formats::MutableBytes> outs;
  };
  // Converts every member of one amax group against the group's amax (max|x| over all members),
  // byte-identical to ResetAmax, AccumulateAmax of each member and ConvertPlanned of each with
  // that device amax, in a batched launch shared with other tensors. False, with nothing enqueued
  // and nothing failed, when the group has to take that path (batching off, an input not aligned
  // for the batched kernels): the caller then runs it.
  virtual absl::StatusOr<bool> ConvertAmaxGroup(formats::Format format, std::span<const GroupMember> members,
                                                const formats::QuantizeOptions& options) {
    (void)format, (void)members, (void)options;
    return false;
  }
  // `height` rows of `width` bytes, `src_pitch` / `dst_pitch` bytes apart.
  virtual absl::Status Copy2D(uint8_t* dst, uint64_t dst_pitch, const uint8_t* src, uint64_t src_pitch,
                              uint64_t width, uint64_t height) = 0;
  virtual absl::Status Zero(uint8_t* dst, uint64_t bytes) = 0;
  // The engine layout kernels (kernels/layout.h, derive.h); PackUe8m0 checks its scales at Synchronize.
  virtual absl::Status Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                                    uint64_t out_bytes) = 0;
  virtual absl::Status PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int32_t* out,
                                 uint64_t out_words, const std::string& name) = 0;
  virtual absl::Status AddOne(const uint8_t* w, DType dtype, int64_t n, uint8_t* out) = 0;
  // Waits for everything enqueued; the first failure recorded meanwhile (a pack_ue8m0 scale that
  // is not a power of two, naming its parameter).
  virtual absl::Status Synchronize() = 0;
};

class Converter {
 public:
  virtual ~Converter() = default;

  // The memory kind of the staging buffers this converter writes.
  virtual storage::MemoryKind staging_kind() const = 0;

  // Converts `desc` (bytes at `src`, in `src_kind` memory) per `plan` into `outs`. May finish
  // asynchronously: `src` must stay valid and errors may surface only at Sync().
  virtual absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                               storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                               const formats::QuantizeOptions& options) = 0;

  // Completes every conversion issued so far. Returns the tensors that failed (e.g. NaN input
  // under `nonfinite: reject`), each with its error.
  virtual std::vector<std::pair<std::string, absl::Status>> Sync() = 0;

  // Ends a bucket: the conversions issued since the previous EndBucket are launched and marked
  // with the returned ticket; the next bucket's conversions may be issued before WaitBucket, so
  // that they queue behind this bucket's on the GPU instead of waiting for it on the host.
  virtual uint64_t EndBucket() { return 0; }
  // Completes the bucket `ticket` and every earlier one (their sources may then be released).
  // Returns their failed tensors, as Sync does. A converter that finishes each conversion before
  // returning (the CPU's) completes everything here.
  virtual std::vector<std::pair<std::string, absl::Status>> WaitBucket(uint64_t ticket) {
    (void)ticket;
    return Sync();
  }
  // Whether WaitBucket(ticket) would return without waiting (the bucket's work is done).
  virtual bool BucketDone(uint64_t ticket) {
    (void)ticket;
    return true;
  }

  // A refit begins: a GPU converter enqueues a few bytes' work on its streams, so that a GPU idle
  // since the last refit has woken (its first launch after idling starts late) by the time the
  // first bucket arrives. Touches no converter state: callable from any thread, also while an
  // ended session's threads still finish.
  virtual void Warm() {}

  // The device side, for converters whose staging is on the GPU; nullptr otherwise.
  virtual DeviceOps* device_ops() { return nullptr; }
};

}  // namespace refit

#endif  // REFIT_REFIT_CONVERTER_H_
