#include "refit/convert.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "refit/param_build.h"

namespace refit {

absl::Status ConvertFull(const ConvertStep& step, const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                         std::optional<float> global_amax, std::span<const formats::MutableBytes> outs,
                         std::string_view name, std::optional<float> supplied_amax) {
  absl::StatusOr<uint64_t> nbytes = DenseBytes(in.dtype, in.shape);
  if (!nbytes.ok()) return nbytes.status();
  formats::ConstTensor src = in;
  std::vector<uint8_t> transposed;
  if (step.transpose) {
    if (in.shape.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name), "': transpose needs rank >= 2"));
    }
    transposed.resize(*nbytes);
    TransposeLast2(static_cast<const uint8_t*>(in.data), in.shape, DTypeSize(in.dtype), transposed.data());
    std::swap(src.shape[src.shape.size() - 1], src.shape[src.shape.size() - 2]);
    src.data = transposed.data();
  }
  if (step.kind == ConvertKind::kCopy) {
    if (outs.size() != 1 || outs[0].bytes != *nbytes) {
      return absl::InternalError(absl::StrCat("tensor '", std::string(name), "': copy output does not fit"));
    }
    std::memcpy(outs[0].data, src.data, *nbytes);
    return absl::OkStatus();
  }
  return formats::Quantize(step.format, src, options, global_amax, outs, name, supplied_amax);
}

absl::StatusOr<float> TensorAmax(const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                                 std::string_view name) {
  return formats::Amax(in, options, name);
}

void ShardPart(const uint8_t* src, DType dtype, const Shape& full_shape, std::optional<int> shard_dim, int64_t parts,
               int64_t index, uint8_t* dst) {
  if (!SplitsOutput(full_shape, shard_dim, parts)) {
    std::memcpy(dst, src, *DenseBytes(dtype, full_shape));
    return;
  }
  SliceDim(src, full_shape, DTypeSize(dtype), *shard_dim, parts, index, dst);
}

}  // namespace refit
