// Element types as safetensors names them, with their sizes.
// Thread-safe: pure functions over value types.
#ifndef REFIT_COMMON_DTYPE_H_
#define REFIT_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace refit {

enum class DType : uint8_t {
  kBF16,
  kF16,
  kF32,
  kF64,
  kF8E4M3,  // float8_e4m3fn
  kF8E5M2,
  kF8E8M0,  // float8_e8m0fnu
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kBool,
};

// Bytes per element.
size_t DTypeSize(DType t);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
const char* DTypeName(DType t);
absl::StatusOr<DType> ParseDType(std::string_view name);
bool IsFloating(DType t);

using Shape = std::vector<int64_t>;

// Number of elements, or an error when a dimension is negative or the product overflows.
absl::StatusOr<int64_t> NumElements(const Shape& shape);
// Bytes of a dense tensor, overflow-checked.
absl::StatusOr<uint64_t> DenseBytes(DType t, const Shape& shape);
std::string ShapeString(const Shape& shape);

}  // namespace refit

#endif  // REFIT_COMMON_DTYPE_H_
