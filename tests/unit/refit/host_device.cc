#include "host_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "formats/layout.h"
#include "refit/committer.h"
#include "refit/convert.h"
#include "refit/resolve.h"

namespace refit::host_device {
namespace {

class HostBackedDeviceMemory final : public storage::Memory {
 public:
  storage::MemoryKind kind() const override { return storage::MemoryKind::kDevice; }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) override {
    auto* p = static_cast<uint8_t*>(std::malloc(std::max<uint64_t>(bytes, 1)));
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("allocating ", bytes, " bytes"));
    return std::shared_ptr<uint8_t>(p, [](uint8_t* q) { std::free(q); });
  }
  absl::Status CopyWithin(void* dst, const void* src, uint64_t bytes) override { return Copy(dst, src, bytes); }
  absl::Status CopyToHost(void* host_dst, const void* src, uint64_t bytes) override {
    return Copy(host_dst, src, bytes);
  }
  absl::Status CopyFromHost(void* dst, const void* host_src, uint64_t bytes) override {
    return Copy(dst, host_src, bytes);
  }
  absl::Status CopyInAsync(void* dst, const void* src, uint64_t bytes) override { return Copy(dst, src, bytes); }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  static absl::Status Copy(void* dst, const void* src, uint64_t bytes) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<storage::Memory> NewHostBackedDeviceMemory() { return std::make_unique<HostBackedDeviceMemory>(); }

absl::Status HostDeviceOps::ConvertPlanned(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                                           storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                                           const formats::QuantizeOptions& options, const PlannedAmax& amax) {
  (void)src_kind;  // host and "device" bytes are both host memory here
  ++stats_.planned;
  if (outs.size() != plan.targets.size()) {
    return absl::InternalError(
        absl::StrCat("tensor '", desc.name, "': ", outs.size(), " outputs for ", plan.targets.size(), " targets"));
  }
  // The whole outputs first, as the CPU path converts them (ConvertFull), then each target's
  // part of its output, as the GPU's ConvertPlanned slices them (every target its own shard index).
  size_t n_outputs = 0;
  for (const Target& t : plan.targets) n_outputs = std::max(n_outputs, t.output + 1);
  std::vector<std::vector<uint8_t>> whole(n_outputs);
  std::vector<formats::MutableBytes> whole_outs(n_outputs);
  for (const Target& t : plan.targets) {
    if (!whole[t.output].empty()) continue;
    absl::StatusOr<uint64_t> n = DenseBytes(t.spec.dtype, t.full_shape);
    if (!n.ok()) return n.status();
    whole[t.output].resize(std::max<uint64_t>(*n, 1));
    whole_outs[t.output] = {whole[t.output].data(), *n};
  }
  std::optional<float> global, claim;
  if (plan.kind == ConvertKind::kQuantize && formats::NeedsGlobalAmax(plan.format)) {
    global = amax.device != nullptr ? std::optional<float>(*amax.device) : amax.host;
    claim = amax.claim;
  }
  const ConvertStep step{plan.kind, plan.format, plan.transpose};
  absl::Status st = ConvertFull(step, formats::ConstTensor{desc.dtype, desc.shape, src}, options, global, whole_outs,
                                desc.name, claim);
  if (!st.ok()) return st;
  const bool sharded = plan.shard_dim.has_value() && plan.shard_parts > 1;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].data == nullptr) continue;  // a part another target stages
    const Target& t = plan.targets[i];
    ShardPart(whole[t.output].data(), t.spec.dtype, t.full_shape, sharded ? plan.shard_dim : std::nullopt,
              sharded ? plan.shard_parts : 1, sharded ? t.shard_index : 0, static_cast<uint8_t*>(outs[i].data));
  }
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ResetAmax(float* amax) {
  ++stats_.amax_resets;
  *amax = 0.0f;
  return absl::OkStatus();
}

absl::Status HostDeviceOps::AccumulateAmax(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                           const formats::QuantizeOptions& options, float* amax) {
  (void)src_kind;
  absl::StatusOr<float> a = TensorAmax(formats::ConstTensor{desc.dtype, desc.shape, src}, options, desc.name);
  if (!a.ok()) return a.status();
  *amax = std::max(*amax, *a);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, storage::MemoryKind src_kind) {
  (void)src_kind;
  ++stats_.copies;
  if (bytes != 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::StatusOr<bool> HostDeviceOps::ConvertAmaxGroup(formats::Format format, std::span<const GroupMember> members,
                                                     const formats::QuantizeOptions& options) {
  if (!options_.batch_groups || members.empty() || !formats::NeedsGlobalAmax(format)) {
    ++stats_.groups_declined;
    return false;
  }
  // The group's amax over every member before any member is encoded. A member whose amax cannot
  // be taken (a non-finite input refused) is left to the caller's path, which names it.
  float a = 0.0f;
  for (const GroupMember& m : members) {
    absl::StatusOr<float> own =
        TensorAmax(formats::ConstTensor{m.desc->dtype, m.desc->shape, m.src}, options, m.desc->name);
    if (!own.ok()) {
      ++stats_.groups_declined;
      return false;
    }
    a = std::max(a, *own);
  }
  ++stats_.groups_batched;
  for (const GroupMember& m : members) {
    absl::Status st = formats::Quantize(format, formats::ConstTensor{m.desc->dtype, m.desc->shape, m.src}, options, a,
                                        m.outs, m.desc->name);
    if (!st.ok()) failed_.emplace_back(m.desc->name, std::move(st));
  }
  return true;
}

absl::Status HostDeviceOps::Copy2D(uint8_t* dst, uint64_t dst_pitch, const uint8_t* src, uint64_t src_pitch,
                                   uint64_t width, uint64_t height) {
  for (uint64_t r = 0; r < height && width != 0; ++r) std::memcpy(dst + r * dst_pitch, src + r * src_pitch, width);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Zero(uint8_t* dst, uint64_t bytes) {
  if (bytes != 0) std::memset(dst, 0, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                                         uint64_t out_bytes) {
  const formats::Swizzle128x4Geometry g{batch, rows, cols};
  return formats::Swizzle128x4(g, {s, static_cast<size_t>(g.InputBytes())}, {out, static_cast<size_t>(out_bytes)});
}

absl::Status HostDeviceOps::PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int32_t* out,
                                      uint64_t out_words, const std::string& name) {
  const formats::Ue8m0PackGeometry g{groups, mn, kb, 128};
  std::vector<int32_t> packed(static_cast<size_t>(g.PackedWords()));
  absl::Status st = formats::PackUe8m0(g, {sf, static_cast<size_t>(g.ScaleCount())}, packed);
  // As on the GPU, a scale that is not a power of two surfaces at Synchronize, naming the parameter.
  if (!st.ok()) {
    if (pack_failure_.ok()) {
      pack_failure_ = absl::InvalidArgumentError(absl::StrCat(name, " pack_ue8m0: ", st.message()));
    }
    return absl::OkStatus();
  }
  std::memcpy(out, packed.data(), std::min<uint64_t>(out_words, packed.size()) * sizeof(int32_t));
  return absl::OkStatus();
}

absl::Status HostDeviceOps::AddOne(const uint8_t* w, DType dtype, int64_t n, uint8_t* out) {
  const storage::ParamInfo target{"", dtype, {n}, static_cast<uint64_t>(n) * DTypeSize(dtype)};
  return ComputeDerived(spec::DerivedOp::kAddOne, target, w, out);
}

absl::Status HostDeviceOps::Synchronize() { return std::exchange(pack_failure_, absl::OkStatus()); }

absl::Status HostDeviceConverter::Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                                          storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                                          const formats::QuantizeOptions& options) {
  (void)src_kind;  // a "device" payload is host memory
  return cpu_.Convert(plan, desc, src, storage::MemoryKind::kHost, outs, options);
}

absl::Status HostDeviceEngineStorage::WriteFromDevice(const storage::DeviceWrite& write) {
  if (absl::Status st = storage::CheckDeviceWrite(params(), write); !st.ok()) return st;
  uint8_t* dst = inner_->MappedAddress(write.index);
  if (dst == nullptr) {
    return absl::InternalError(absl::StrCat("parameter '", params()[write.index].name, "' is not mapped"));
  }
  if (write.bytes != 0) std::memcpy(dst + write.offset, write.src, write.bytes);
  return absl::OkStatus();
}

}  // namespace refit::host_device
