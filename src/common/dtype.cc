#include "common/dtype.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace refit {
namespace {

struct Info {
  DType type;
  std::string_view name;
  size_t size;
  bool floating;
};

constexpr std::array<Info, 13> kInfo = {{
    {DType::kBF16, "BF16", 2, true},
    {DType::kF16, "F16", 2, true},
    {DType::kF32, "F32", 4, true},
    {DType::kF64, "F64", 8, true},
    {DType::kF8E4M3, "F8_E4M3", 1, true},
    {DType::kF8E5M2, "F8_E5M2", 1, true},
    {DType::kF8E8M0, "F8_E8M0", 1, false},
    {DType::kU8, "U8", 1, false},
    {DType::kI8, "I8", 1, false},
    {DType::kI16, "I16", 2, false},
    {DType::kI32, "I32", 4, false},
    {DType::kI64, "I64", 8, false},
    {DType::kBool, "BOOL", 1, false},
}};

const Info& Lookup(DType t) { return kInfo[static_cast<size_t>(t)]; }

}  // namespace

size_t DTypeSize(DType t) { return Lookup(t).size; }
std::string_view DTypeName(DType t) { return Lookup(t).name; }
bool IsFloating(DType t) { return Lookup(t).floating; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const Info& i : kInfo) {
    if (i.name == name) return i.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", std::string(name), "'"));
}

absl::StatusOr<int64_t> NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension in ", ShapeString(shape)));
    if (d != 0 && n > INT64_MAX / d) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows"));
    }
    n *= d;
  }
  return n;
}

absl::StatusOr<uint64_t> DenseBytes(DType t, const Shape& shape) {
  absl::StatusOr<int64_t> n = NumElements(shape);
  if (!n.ok()) return n.status();
  uint64_t size = DTypeSize(t);
  if (static_cast<uint64_t>(*n) > UINT64_MAX / size) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows"));
  }
  return static_cast<uint64_t>(*n) * size;
}

std::string ShapeString(const Shape& shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

}  // namespace refit
