#include "refit/cpu_converter.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/parallel_copy.h"

namespace refit {

absl::Status CpuConverter::Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                                   storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                                   const formats::QuantizeOptions& options) {
  if (src_kind != storage::MemoryKind::kHost) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", desc.name, "' arrived in GPU memory; this daemon converts on the CPU (staging: host)"));
  }
  if (plan.kind == ConvertKind::kCopy) {
    ParallelCopy(outs[0].data, src, desc.nbytes);
    return absl::OkStatus();
  }
  return formats::Quantize(plan.format, formats::ConstTensor{desc.dtype, desc.shape, src}, options, std::nullopt,
                           outs, desc.name);
}

}  // namespace refit
