// The GPU entry point of every format (quantize_table.h), in enum order: each row adapts
// GpuQuantizeArgs to its format's launcher (launch.h, one .cu file per format family).
#include "kernels/quantize_table.h"

#include <array>

#include <cuda_runtime.h>

namespace refit::kernels {
namespace {

using formats::Format;

// Casts: a device copy when the input already has the target dtype and nothing needs checking.
template <launch::Output kOut>
int Cast(const GpuQuantizeArgs& a) {
  const bool same = (kOut == launch::Output::kBf16 && a.src.input == launch::Input::kBf16) ||
                    (kOut == launch::Output::kF32 && a.src.input == launch::Input::kF32);
  if (same && a.first_bad == nullptr) {
    return static_cast<int>(cudaMemcpyAsync(a.outs[0].data, a.src.data, a.outs[0].bytes, cudaMemcpyDeviceToDevice,
                                            static_cast<cudaStream_t>(a.stream)));
  }
  return launch::Cast(a.src, kOut, a.outs[0].data, a.first_bad, a.stream);
}

template <bool kTe>
int Nvfp4(const GpuQuantizeArgs& a) {
  return launch::Nvfp4(a.src, kTe, a.amax.device, a.amax.host.value_or(0.0f), a.bytes(0), a.bytes(1), a.floats(2),
                       a.first_bad, a.amax.claim.value_or(0.0f), a.amax.claim ? a.claim_word : nullptr, a.stream);
}

constexpr std::array<GpuFormat, formats::kFormatCount> kGpuFormats = {{
    {Format::kBf16, Cast<launch::Output::kBf16>},
    {Format::kFp16, Cast<launch::Output::kF16>},
    {Format::kFp32, Cast<launch::Output::kF32>},
    {Format::kFp8Block128,
     [](const GpuQuantizeArgs& a) {
       return launch::Fp8Block128(a.src, /*ue8m0=*/false, a.bytes(0), a.floats(1), a.first_bad, a.stream);
     }},
    {Format::kFp8Block128Ue8m0,
     [](const GpuQuantizeArgs& a) {
       return launch::Fp8Block128(a.src, /*ue8m0=*/true, a.bytes(0), a.floats(1), a.first_bad, a.stream);
     }},
    {Format::kMxfp8,
     [](const GpuQuantizeArgs& a) { return launch::Mxfp8(a.src, a.bytes(0), a.bytes(1), a.first_bad, a.stream); }},
    {Format::kNvfp4, Nvfp4<false>},
    {Format::kNvfp4Te, Nvfp4<true>},
    {Format::kMxfp4,
     [](const GpuQuantizeArgs& a) { return launch::Mxfp4(a.src, a.bytes(0), a.bytes(1), a.first_bad, a.stream); }},
    {Format::kCtFp8Channel,
     [](const GpuQuantizeArgs& a) {
       return launch::CtFp8Channel(a.src, a.bytes(0), reinterpret_cast<uint16_t*>(a.bytes(1)), a.first_bad, a.stream);
     }},
    {Format::kCtFp8Tensor,
     [](const GpuQuantizeArgs& a) {
       return launch::CtFp8Tensor(a.src, a.amax.device, a.amax.host.value_or(0.0f), a.bytes(0),
                                  reinterpret_cast<uint16_t*>(a.bytes(1)), a.first_bad, a.amax.claim.value_or(0.0f),
                                  a.amax.claim ? a.claim_word : nullptr, a.stream);
     }},
    {Format::kCtNvfp4,
     [](const GpuQuantizeArgs& a) {
       return launch::CtNvfp4(a.src, a.amax.device, a.amax.host.value_or(0.0f), a.bytes(0), a.bytes(1), a.floats(2),
                              a.first_bad, a.amax.claim.value_or(0.0f), a.amax.claim ? a.claim_word : nullptr,
                              a.stream);
     }},
    {Format::kCtW4a16,
     [](const GpuQuantizeArgs& a) {
       // "_shape" holds one int64 per input dimension.
       const int rank = static_cast<int>(a.outs[2].bytes / sizeof(int64_t));
       return launch::CtW4a16(a.src, rank, reinterpret_cast<uint32_t*>(a.bytes(0)),
                              reinterpret_cast<uint16_t*>(a.bytes(1)), reinterpret_cast<int64_t*>(a.bytes(2)),
                              a.first_bad, a.stream);
     }},
}};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kGpuFormats.size(); ++i) {
    if (static_cast<size_t>(kGpuFormats[i].format) != i || kGpuFormats[i].quantize == nullptr) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "quantize_table.cc: one row per Format, in enum order, each with an entry");

}  // namespace

const GpuFormat& GpuInfo(Format f) { return kGpuFormats[static_cast<size_t>(f)]; }

}  // namespace refit::kernels
