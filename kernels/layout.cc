// Host side of layout.h, derive.h and checksum.h: argument checks, then the raw launchers.
#include "kernels/layout.h"

#include "kernels/checksum.h"
#include "kernels/derive.h"
#include "kernels/launch.h"
#include "kernels/status.h"

namespace refit::kernels {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 40;

bool BadDims(int64_t a, int64_t b, int64_t c) {
  return a < 0 || b < 0 || c < 0 || a > kMaxDim || b > kMaxDim || c > kMaxDim ||
         (a > 0 && b > 0 && c > 0 && (a * b > kMaxDim || a * b * ((c + 3) / 4 * 4) > kMaxDim * 4));
}

}  // namespace

absl::StatusOr<uint64_t> PackUe8m0OutputWords(int64_t groups, int64_t mn, int64_t kb) {
  if (BadDims(groups, mn, kb)) {
    return absl::InvalidArgumentError(Msg("ue8m0 pack: bad dims ", groups, "x", mn, "x", kb));
  }
  return static_cast<uint64_t>(groups * ((mn + 3) / 4 * 4) * ((kb + 3) / 4));
}

absl::Status PackUe8m0Scales(const float* sf, int64_t groups, int64_t mn, int64_t kb, int gran_mn,
                             int32_t* out, uint64_t out_words, unsigned long long* first_bad, void* stream) {
  if (gran_mn != 1 && gran_mn != 128) {
    return absl::InvalidArgumentError(Msg("ue8m0 pack: gran_mn ", gran_mn, " is not 1 or 128"));
  }
  auto words = PackUe8m0OutputWords(groups, mn, kb);
  if (!words.ok()) return words.status();
  if (*words != out_words) {
    return absl::InvalidArgumentError(
        Msg("ue8m0 pack: output has ", out_words, " words, expected ", *words));
  }
  if (*words > 0 && (sf == nullptr || out == nullptr)) return absl::InvalidArgumentError("ue8m0 pack: null pointer");
  return CudaStatus(launch::PackUe8m0(sf, groups, mn, kb, gran_mn, out, first_bad, stream), "packing ue8m0 scales");
}

absl::Status TransposeLast2(const void* in, int64_t batch, int64_t rows, int64_t cols, int elem_bytes, void* out,
                            void* stream) {
  if (BadDims(batch, rows, cols)) {
    return absl::InvalidArgumentError(Msg("transpose: bad dims ", batch, "x", rows, "x", cols));
  }
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8) {
    return absl::InvalidArgumentError(Msg("transpose: ", elem_bytes, "-byte elements"));
  }
  if (batch > 65535 || (rows + 31) / 32 > 65535) {  // grid z and y limits
    return absl::InvalidArgumentError(Msg("transpose: ", batch, "x", rows, " rows exceed the launch grid"));
  }
  if (batch * rows * cols > 0 && (in == nullptr || out == nullptr)) return absl::InvalidArgumentError("transpose: null pointer");
  return CudaStatus(launch::TransposeLast2(in, batch, rows, cols, elem_bytes, out, stream), "transposing");
}

absl::StatusOr<uint64_t> Swizzle128x4OutputBytes(int64_t batch, int64_t rows, int64_t cols) {
  if (BadDims(batch, rows, cols)) {
    return absl::InvalidArgumentError(Msg("swizzle 128x4: bad dims ", batch, "x", rows, "x", cols));
  }
  return static_cast<uint64_t>(batch * ((rows + 127) / 128 * 128) * ((cols + 3) / 4 * 4));
}

absl::Status Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                          uint64_t out_bytes, void* stream) {
  auto bytes = Swizzle128x4OutputBytes(batch, rows, cols);
  if (!bytes.ok()) return bytes.status();
  if (*bytes != out_bytes) {
    return absl::InvalidArgumentError(
        Msg("swizzle 128x4: output has ", out_bytes, " bytes, expected ", *bytes));
  }
  if (*bytes > 0 && (s == nullptr || out == nullptr)) return absl::InvalidArgumentError("swizzle 128x4: null pointer");
  return CudaStatus(launch::Swizzle128x4(s, batch, rows, cols, out, stream), "swizzling scales");
}

absl::Status GemmaPlusOne(const void* w, DType dtype, int64_t n, void* out, void* stream) {
  launch::Output type;
  switch (dtype) {
    case DType::kBF16: type = launch::Output::kBf16; break;
    case DType::kF16: type = launch::Output::kF16; break;
    case DType::kF32: type = launch::Output::kF32; break;
    default:
      return absl::InvalidArgumentError(Msg("gemma w+1: dtype ", DTypeName(dtype), " is not BF16/F16/F32"));
  }
  if (n < 0) return absl::InvalidArgumentError("gemma w+1: negative size");
  if (n > 0 && (w == nullptr || out == nullptr)) return absl::InvalidArgumentError("gemma w+1: null pointer");
  return CudaStatus(launch::GemmaPlusOne(w, type, n, out, stream), "computing w + 1");
}

absl::Status DeviceChecksum(const void* data, uint64_t bytes, uint64_t seed, uint64_t* result, void* stream) {
  if (result == nullptr || (bytes > 0 && data == nullptr)) return absl::InvalidArgumentError("checksum: null pointer");
  return CudaStatus(launch::Checksum(data, bytes, seed, reinterpret_cast<unsigned long long*>(result), stream),
                    "checksumming");
}

}  // namespace refit::kernels
