// The input policy shared by every format (FORMATS.md Part A): BF16 or F32 tensors are
// converted to fp32 before any arithmetic, optionally rounded through BF16, and NaN/Inf are
// rejected unless the caller asks to propagate them.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_INPUT_H_
#define REFIT_FORMATS_INPUT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/bits.h"
#include "formats/format.h"
#include "formats/format_info.h"

namespace refit::formats {

// InvalidArgument unless `in` is BF16 or F32 with a non-null buffer (empty tensors may be null).
absl::Status CheckQuantizableInput(const ConstTensor& in, std::string_view tensor_name);

// Under NonfinitePolicy::kReject: InvalidArgument naming the tensor and the first flat index
// whose value (after the fp32_input policy) is NaN or +-Inf. OK under kPropagate.
absl::Status CheckFinite(const ConstTensor& in, const QuantizeOptions& options,
                         std::string_view tensor_name);

// Writes elements [begin, begin + count) of `in` (BF16, F16 or F32, flat row-major) to `dst`
// as fp32, applying the fp32_input policy to F32 input.
void LoadF32(const ConstTensor& in, Fp32InputPolicy policy, int64_t begin, int64_t count,
             float* dst);

// Calls fn(b, x, amax) for every 1 x `block` run along the last dimension of `in`, in row-major
// order: `b` is the run's index (its first flat element is b * block, and its scale's flat index
// in a [..., N, K/block] scale tensor is b), `x` its `block` fp32 values after the input policy,
// `amax` their max|x| (NaN-dominant). REQUIRES: K % block == 0; `in` validated.
template <typename Fn>
void ForEachRowBlock(const ConstTensor& in, Fp32InputPolicy policy, int64_t block, Fn&& fn) {
  const int64_t k = in.shape.back();
  const int64_t rows = k == 0 ? 0 : *NumElements(in.shape) / k;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    LoadF32(in, policy, r * k, k, row.data());
    for (int64_t j = 0; j < k / block; ++j) {
      const float* x = row.data() + j * block;
      float amax = 0.0f;
      for (int64_t i = 0; i < block; ++i) amax = bits::AbsMaxNan(amax, x[i]);
      fn(r * (k / block) + j, x, amax);
    }
  }
}

// Packs encode(x[i]) (4-bit codes) two per byte, even element in the low nibble.
// REQUIRES: count is even.
template <typename Encode>
void PackNibbles(const float* x, int64_t count, uint8_t* out, Encode&& encode) {
  for (int64_t i = 0; i < count; i += 2) {
    out[i / 2] = static_cast<uint8_t>(encode(x[i]) | (encode(x[i + 1]) << 4));
  }
}

// Element i of a tensor of packed 4-bit codes (even element in the low nibble).
inline uint8_t Nibble(const uint8_t* packed, int64_t i) {
  const uint8_t byte = packed[i / 2];
  return (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
}

// Product of all dimensions but the last two (1 for rank 2).
int64_t BatchCount(const Shape& shape);

// An OutputSpec with its byte count, overflow-checked.
absl::StatusOr<OutputSpec> MakeSpec(std::string suffix, DType dtype, Shape shape);

// InvalidArgument unless `shape` has rank >= 2 and its last two dimensions are whole numbers of
// `block`'s (any size when block.partial). `format` names the format in the message.
absl::Status CheckMatrixShape(const Shape& shape, const BlockGeometry& block, std::string_view format);

// Parts given to Dequantize must match `plan` in count, dtype and shape.
absl::Status CheckParts(const std::vector<OutputSpec>& plan, std::span<const ConstTensor> parts);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_INPUT_H_
