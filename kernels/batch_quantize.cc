#include "kernels/batch_quantize.h"

#include <cstdint>
#include <vector>

#include "kernels/batch_launch.h"
#include "kernels/quantize.h"
#include "kernels/status.h"

namespace refit::kernels {
namespace {

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

launch::Input InputOf(const Nvfp4BatchKind& kind) {
  if (kind.dtype == DType::kBF16) return launch::Input::kBf16;
  return kind.fp32_input == formats::Fp32InputPolicy::kRoundToBf16 ? launch::Input::kF32RoundBf16
                                                                   : launch::Input::kF32;
}

}  // namespace

Nvfp4BatchKind Nvfp4KindOf(formats::Format f, DType dtype, const formats::QuantizeOptions& options) {
  return Nvfp4BatchKind{f, dtype, options.fp32_input};
}

absl::StatusOr<std::optional<Nvfp4BatchItem>> Nvfp4BatchItemFor(formats::Format f, const formats::ConstTensor& in,
                                                                const formats::QuantizeOptions& options,
                                                                std::span<const formats::MutableBytes> outs,
                                                                std::string_view tensor_name, float* amax,
                                                                unsigned long long* first_bad) {
  // The batched launcher is NVFP4's own kernel (one launch for many small two-pass tensors,
  // docs/kernels.md), not a per-format dispatch: every other format takes Quantize.
  if (f != formats::Format::kNvfp4 && f != formats::Format::kNvfp4Te) return std::nullopt;
  if (auto st = CheckQuantizeArgs(f, in, outs, tensor_name); !st.ok()) return st;
  if (options.nonfinite == formats::NonfinitePolicy::kReject && first_bad == nullptr) {
    return absl::InvalidArgumentError(
        Msg("tensor ", tensor_name, ": nonfinite=reject needs a device word to record non-finite input"));
  }
  if (amax == nullptr) return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": null amax pointer"));
  absl::StatusOr<int64_t> n = NumElements(in.shape);
  if (!n.ok()) return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": ", n.status().message()));
  // CheckQuantizeArgs ensured K % 16 == 0, so n is a whole number of 16-byte chunks.
  if (*n == 0 || !Aligned(in.data, 16) || !Aligned(outs[0].data, 4)) return std::nullopt;
  return Nvfp4BatchItem{in.data,
                        *n,
                        static_cast<uint8_t*>(outs[0].data),
                        static_cast<uint8_t*>(outs[1].data),
                        static_cast<float*>(outs[2].data),
                        amax,
                        options.nonfinite == formats::NonfinitePolicy::kReject ? first_bad : nullptr};
}

uint64_t Nvfp4BatchTableBytes(size_t count) { return launch::Nvfp4BatchTableBytes(count); }
uint64_t CopyBatchTableBytes(size_t count) { return launch::CopyBatchTableBytes(count); }

absl::Status QuantizeNvfp4Batch(const Nvfp4BatchKind& kind, std::span<const Nvfp4BatchItem> items, void* host_table,
                                void* device_table, void* stream) {
  if (kind.format != formats::Format::kNvfp4 && kind.format != formats::Format::kNvfp4Te) {
    return absl::InvalidArgumentError(Msg("NVFP4 batch of format ", formats::FormatName(kind.format)));
  }
  if (kind.dtype != DType::kBF16 && kind.dtype != DType::kF32) {
    return absl::InvalidArgumentError(Msg("NVFP4 batch of input dtype ", DTypeName(kind.dtype)));
  }
  if (items.empty()) return absl::OkStatus();
  if (host_table == nullptr || device_table == nullptr || !Aligned(device_table, 16)) {
    return absl::InvalidArgumentError("NVFP4 batch: null or misaligned descriptor table");
  }
  std::vector<launch::Nvfp4Item> raw;
  raw.reserve(items.size());
  for (const Nvfp4BatchItem& it : items) {
    if (it.elements <= 0 || it.elements % 16 != 0 || !Aligned(it.in, 16) || !Aligned(it.q, 4) || it.amax == nullptr) {
      return absl::InvalidArgumentError("NVFP4 batch: an item was not made by Nvfp4BatchItemFor");
    }
    raw.push_back({it.in, it.elements, it.q, it.scales, it.scale_2, it.amax, it.first_bad});
  }
  return CudaStatus(launch::Nvfp4Batch(raw.data(), raw.size(), InputOf(kind), kind.format == formats::Format::kNvfp4Te,
                                       host_table, device_table, stream),
                    Msg("quantizing a batch of ", items.size(), " NVFP4 tensors"));
}

absl::Status CopyBatch(std::span<const CopyBatchItem> items, void* host_table, void* device_table, void* stream) {
  if (items.empty()) return absl::OkStatus();
  if (host_table == nullptr || device_table == nullptr || !Aligned(device_table, 16)) {
    return absl::InvalidArgumentError("copy batch: null or misaligned descriptor table");
  }
  std::vector<launch::CopyItem> raw;
  raw.reserve(items.size());
  for (const CopyBatchItem& it : items) {
    if (it.bytes > 0 && (it.dst == nullptr || it.src == nullptr)) {
      return absl::InvalidArgumentError("copy batch: null pointer");
    }
    raw.push_back({it.dst, it.src, it.bytes});
  }
  return CudaStatus(launch::CopyBatch(raw.data(), raw.size(), host_table, device_table, stream),
                    Msg("copying a batch of ", items.size(), " tensors"));
}

}  // namespace refit::kernels
