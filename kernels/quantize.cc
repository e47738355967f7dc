#include "kernels/quantize.h"

#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "formats/format_info.h"
#include "kernels/launch.h"
#include "kernels/quantize_table.h"
#include "kernels/status.h"

namespace refit::kernels {
namespace {

using formats::Format;

struct View {
  launch::Src src;
  int64_t n;
};

absl::StatusOr<View> MakeView(const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                              std::string_view name) {
  launch::Input input;
  if (in.dtype == DType::kBF16) {
    input = launch::Input::kBf16;
  } else if (in.dtype == DType::kF32) {
    input = options.fp32_input == formats::Fp32InputPolicy::kRoundToBf16 ? launch::Input::kF32RoundBf16
                                                                         : launch::Input::kF32;
  } else {
    return absl::InvalidArgumentError(
        Msg("tensor ", name, ": input dtype ", DTypeName(in.dtype), " is not BF16 or F32"));
  }
  if (in.shape.empty()) {
    return absl::InvalidArgumentError(Msg("tensor ", name, ": scalar input"));
  }
  auto n = NumElements(in.shape);
  if (!n.ok()) return absl::InvalidArgumentError(Msg("tensor ", name, ": ", n.status().message()));
  const int64_t cols = in.shape.back();
  const int64_t rows = in.shape.size() >= 2 ? in.shape[in.shape.size() - 2] : 1;
  const int64_t batch = (rows == 0 || cols == 0) ? 0 : *n / (rows * cols);
  if (*n > 0 && in.data == nullptr) {
    return absl::InvalidArgumentError(Msg("tensor ", name, ": null input pointer"));
  }
  return View{launch::Src{in.data, input, batch, rows, cols}, *n};
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> OutputBytes(Format f, DType input, const Shape& shape) {
  // The kernels read BF16 or F32 (casts from F16 are CPU-only) and view the input as a matrix.
  if (input != DType::kBF16 && input != DType::kF32) {
    return absl::InvalidArgumentError(Msg("input dtype ", DTypeName(input), " is not BF16 or F32"));
  }
  if (shape.empty()) return absl::InvalidArgumentError("scalar input");
  auto plan = formats::PlanOutputs(f, input, shape);
  if (!plan.ok()) return plan.status();
  std::vector<uint64_t> bytes;
  for (const formats::OutputSpec& o : *plan) bytes.push_back(o.bytes);
  return bytes;
}

absl::Status CheckQuantizeArgs(Format f, const formats::ConstTensor& in, std::span<const formats::MutableBytes> outs,
                               std::string_view tensor_name) {
  auto bytes = OutputBytes(f, in.dtype, in.shape);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": ", bytes.status().message()));
  }
  if (outs.size() != bytes->size()) {
    return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": ", outs.size(),
                                                   " output buffers given, format emits ", bytes->size()));
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].bytes != (*bytes)[i] || (outs[i].bytes > 0 && outs[i].data == nullptr)) {
      return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": output ", i, " has ",
                                                     outs[i].bytes, " bytes (ptr ", outs[i].data != nullptr,
                                                     "), expected ", (*bytes)[i]));
    }
  }
  // Element alignment: the kernels pick 16-byte vector paths when they can and fall back to
  // element accesses otherwise, but never split an element.
  if (reinterpret_cast<uintptr_t>(in.data) % DTypeSize(in.dtype) != 0) {
    return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": input is not aligned to its element size"));
  }
  const std::span<const formats::OutputRole> roles = formats::Info(f).Outputs();
  for (size_t i = 0; i < outs.size(); ++i) {
    const uintptr_t align = DTypeSize(roles[i].dtype);
    if (reinterpret_cast<uintptr_t>(outs[i].data) % align != 0) {
      return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": output ", i, " is not ", align, "-byte aligned"));
    }
  }
  return absl::OkStatus();
}

absl::Status Quantize(Format f, const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                      const GlobalAmax& amax, std::span<const formats::MutableBytes> outs,
                      std::string_view tensor_name, const NonfiniteProbe* probe, void* stream) {
  if (auto st = CheckQuantizeArgs(f, in, outs, tensor_name); !st.ok()) return st;
  if (options.nonfinite == formats::NonfinitePolicy::kReject && probe == nullptr) {
    return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": nonfinite=reject needs a NonfiniteProbe"));
  }
  return QuantizeRecording(f, in, options, amax, outs, tensor_name, probe != nullptr ? probe->device_word() : nullptr,
                           stream);
}

absl::Status QuantizeRecording(Format f, const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                               const GlobalAmax& amax, std::span<const formats::MutableBytes> outs,
                               std::string_view tensor_name, unsigned long long* first_bad, void* stream) {
  if (auto st = CheckQuantizeArgs(f, in, outs, tensor_name); !st.ok()) return st;
  unsigned long long* bad = nullptr;
  if (amax.claim && first_bad == nullptr) {
    return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": a supplied amax needs a device word to record the check"));
  }
  if (options.nonfinite == formats::NonfinitePolicy::kReject) {
    if (first_bad == nullptr) {
      return absl::InvalidArgumentError(
          Msg("tensor ", tensor_name, ": nonfinite=reject needs a device word to record non-finite input"));
    }
    bad = first_bad;
  }
  auto view = MakeView(in, options, tensor_name);
  if (!view.ok()) return view.status();
  const formats::FormatInfo& info = formats::Info(f);
  if (info.global_amax != formats::GlobalAmax::kNone && amax.device == nullptr) {
    if (!amax.host.has_value()) {
      return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": ", info.name,
                                            " needs the global amax (host value or AccumulateAmax result)"));
    }
    if (bad != nullptr && !(std::isfinite(*amax.host) && *amax.host >= 0.0f)) {
      return absl::InvalidArgumentError(
          Msg("tensor ", tensor_name, ": global amax ", *amax.host, " is not finite and >= 0"));
    }
    if (info.global_amax == formats::GlobalAmax::kNonzero && *amax.host == 0.0f) {
      return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": ", info.name,
                                            " global amax is 0 (the producer's block scales would be 0/0)"));
    }
  }
  const int rc = GpuInfo(f).quantize(GpuQuantizeArgs{view->src, outs, amax, bad, stream, first_bad});
  return CudaStatus(rc, Msg("quantizing tensor ", tensor_name));
}

absl::Status ResetAmax(float* amax_device, void* stream) {
  return CudaStatus(static_cast<int>(cudaMemsetAsync(amax_device, 0, sizeof(float),
                                                     static_cast<cudaStream_t>(stream))),
                    "resetting amax");
}

absl::Status AccumulateAmax(const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                            float* amax_device, void* stream) {
  auto view = MakeView(in, options, "(amax)");
  if (!view.ok()) return view.status();
  if (amax_device == nullptr) return absl::InvalidArgumentError("null amax pointer");
  return CudaStatus(launch::AccumulateAmax(view->src, amax_device, stream), "computing amax");
}

absl::StatusOr<NonfiniteProbe> NonfiniteProbe::Create() {
  int device = 0;
  if (auto s = CudaStatus(static_cast<int>(cudaGetDevice(&device)), "allocating probe"); !s.ok()) return s;
  absl::StatusOr<DeviceAllocation> word = DeviceAllocation::Allocate(device, sizeof(unsigned long long));
  if (!word.ok()) return absl::InternalError(absl::StrCat("allocating probe: ", word.status().message()));
  NonfiniteProbe probe(std::move(*word));
  if (auto s = probe.Reset(nullptr); !s.ok()) return s;
  if (auto s = CudaStatus(static_cast<int>(cudaStreamSynchronize(nullptr)), "clearing probe"); !s.ok()) {
    return s;
  }
  return probe;
}


absl::Status NonfiniteProbe::Reset(void* stream) {
  return CudaStatus(static_cast<int>(cudaMemsetAsync(device_word(), 0xFF, sizeof(unsigned long long),
                                                     static_cast<cudaStream_t>(stream))),
                    "resetting probe");
}

absl::Status NonfiniteProbe::Check(std::string_view tensor_name, void* stream) const {
  unsigned long long first = 0;
  if (auto s = CudaStatus(static_cast<int>(cudaMemcpyAsync(&first, device_word(), sizeof(first), cudaMemcpyDeviceToHost,
                                                           static_cast<cudaStream_t>(stream))),
                          "reading probe");
      !s.ok()) {
    return s;
  }
  if (auto s = CudaStatus(static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))),
                          "reading probe");
      !s.ok()) {
    return s;
  }
  return RecordedStatus(first, tensor_name, std::nullopt);
}

absl::Status RecordedStatus(unsigned long long word, std::string_view tensor_name, std::optional<float> claim) {
  if (word == ~0ULL) return absl::OkStatus();
  if ((word & kAmaxClaimBit) != 0) {
    return absl::InvalidArgumentError(Msg("tensor '", tensor_name, "': supplied amax ", claim.value_or(0.0f),
                                          " is below the tensor's max|x| (block at flat index ", word & ~kAmaxClaimBit,
                                          "; the trainer's amax must cover the bytes it sent)"));
  }
  return absl::InvalidArgumentError(Msg("tensor ", tensor_name, ": non-finite value (NaN or Inf) at flat index ", word));
}

}  // namespace refit::kernels
