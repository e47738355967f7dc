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
#include "formats/format.h"

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

// Product of all dimensions but the last two (1 for rank 2).
int64_t BatchCount(const Shape& shape);

// An OutputSpec with its byte count, overflow-checked.
absl::StatusOr<OutputSpec> MakeSpec(std::string suffix, DType dtype, Shape shape);

// InvalidArgument unless `shape` has rank >= 2 and its last dimension is a multiple of
// `k_multiple` (1 for none). `format` names the format in the message.
absl::Status CheckMatrixShape(const Shape& shape, int64_t k_multiple, std::string_view format);

// Parts given to Dequantize must match `plan` in count, dtype and shape.
absl::Status CheckParts(const std::vector<OutputSpec>& plan, std::span<const ConstTensor> parts);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_INPUT_H_
