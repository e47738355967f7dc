#include "kernels/quantize.h"

#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/launch.h"
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

absl::Status NeedMultiple(const Shape& shape, int64_t k, std::string_view format) {
  if (shape.back() % k != 0) {
    return absl::InvalidArgumentError(Msg(format, " needs the last dimension to be a multiple of ",
                                                   k, ", got K=", shape.back()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> OutputBytes(Format f, DType input, const Shape& shape) {
  if (input != DType::kBF16 && input != DType::kF32) {
    return absl::InvalidArgumentError(Msg("input dtype ", DTypeName(input), " is not BF16 or F32"));
  }
  if (shape.empty()) return absl::InvalidArgumentError("scalar input");
  auto n_or = NumElements(shape);
  if (!n_or.ok()) return n_or.status();
  const uint64_t n = static_cast<uint64_t>(*n_or);
  switch (f) {
    case Format::kBf16:
    case Format::kFp16:
      return std::vector<uint64_t>{2 * n};
    case Format::kFp32:
      return std::vector<uint64_t>{4 * n};
    case Format::kFp8Block128:
    case Format::kFp8Block128Ue8m0: {
      if (shape.size() < 2) return absl::InvalidArgumentError("fp8_block128 needs a matrix (rank >= 2)");
      const uint64_t rows = shape[shape.size() - 2], cols = shape.back();
      const uint64_t batch = rows * cols == 0 ? 0 : n / (rows * cols);
      return std::vector<uint64_t>{n, batch * ((rows + 127) / 128) * ((cols + 127) / 128) * 4};
    }
    case Format::kMxfp8:
      if (auto s = NeedMultiple(shape, 32, "mxfp8"); !s.ok()) return s;
      return std::vector<uint64_t>{n, n / 32};
    case Format::kNvfp4:
    case Format::kNvfp4Te:
      if (auto s = NeedMultiple(shape, 16, "nvfp4"); !s.ok()) return s;
      return std::vector<uint64_t>{n / 2, n / 16, 4};
    case Format::kMxfp4:
      if (auto s = NeedMultiple(shape, 32, "mxfp4"); !s.ok()) return s;
      return std::vector<uint64_t>{n / 2, n / 32};
  }
  return absl::InvalidArgumentError("unknown format");
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
  for (size_t i = 0; i < outs.size(); ++i) {
    const bool f32_part = f == Format::kFp32 || (i == 1 && (f == Format::kFp8Block128 || f == Format::kFp8Block128Ue8m0)) ||
                          (i == 2 && (f == Format::kNvfp4 || f == Format::kNvfp4Te));
    const bool f16_part = i == 0 && (f == Format::kBf16 || f == Format::kFp16);
    const uintptr_t align = f32_part ? 4 : (f16_part ? 2 : 1);
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
  if (options.nonfinite == formats::NonfinitePolicy::kReject) {
    if (first_bad == nullptr) {
      return absl::InvalidArgumentError(
          Msg("tensor ", tensor_name, ": nonfinite=reject needs a device word to record non-finite input"));
    }
    bad = first_bad;
  }
  auto view = MakeView(in, options, tensor_name);
  if (!view.ok()) return view.status();
  const launch::Src& src = view->src;
  auto out8 = [&](size_t i) { return static_cast<uint8_t*>(outs[i].data); };
  int rc = 0;
  switch (f) {
    case Format::kBf16:
    case Format::kFp16:
    case Format::kFp32: {
      const launch::Output out = f == Format::kBf16 ? launch::Output::kBf16
                                 : f == Format::kFp16 ? launch::Output::kF16
                                                      : launch::Output::kF32;
      const bool same = (f == Format::kBf16 && src.input == launch::Input::kBf16) ||
                        (f == Format::kFp32 && src.input == launch::Input::kF32);
      if (same && bad == nullptr) {
        rc = static_cast<int>(cudaMemcpyAsync(outs[0].data, in.data, outs[0].bytes,
                                              cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
      } else {
        rc = launch::Cast(src, out, outs[0].data, bad, stream);
      }
      break;
    }
    case Format::kFp8Block128:
    case Format::kFp8Block128Ue8m0:
      rc = launch::Fp8Block128(src, f == Format::kFp8Block128Ue8m0, out8(0),
                               static_cast<float*>(outs[1].data), bad, stream);
      break;
    case Format::kMxfp8:
      rc = launch::Mxfp8(src, out8(0), out8(1), bad, stream);
      break;
    case Format::kMxfp4:
      rc = launch::Mxfp4(src, out8(0), out8(1), bad, stream);
      break;
    case Format::kNvfp4:
    case Format::kNvfp4Te: {
      if (amax.device == nullptr && !amax.host.has_value()) {
        return absl::InvalidArgumentError(Msg(
            "tensor ", tensor_name, ": nvfp4 needs the global amax (host value or AccumulateAmax result)"));
      }
      if (amax.device == nullptr && bad != nullptr && !(std::isfinite(*amax.host) && *amax.host >= 0.0f)) {
        return absl::InvalidArgumentError(
            Msg("tensor ", tensor_name, ": global amax ", *amax.host, " is not finite and >= 0"));
      }
      if (f == Format::kNvfp4 && amax.device == nullptr && *amax.host == 0.0f) {
        return absl::InvalidArgumentError(Msg("tensor ", tensor_name,
                                              ": nvfp4 global amax is 0 (ModelOpt scales would be 0/0)"));
      }
      rc = launch::Nvfp4(src, f == Format::kNvfp4Te, amax.device, amax.host.value_or(0.0f), out8(0), out8(1),
                         static_cast<float*>(outs[2].data), bad, stream);
      break;
    }
  }
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
  if (first != ~0ULL) {
    return absl::InvalidArgumentError(
        Msg("tensor ", tensor_name, ": non-finite value (NaN or Inf) at flat index ", first));
  }
  return absl::OkStatus();
}

}  // namespace refit::kernels
