#include "refit/offline.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/format.h"

namespace refit {

absl::StatusOr<std::vector<storage::ParamInfo>> ConvertedLayout(const spec::ModelSpec& spec, const std::string& name,
                                                               DType dtype, const Shape& shape) {
  REFIT_ASSIGN_OR_RETURN(const spec::Rule* rule, spec.RuleFor(name));
  std::vector<storage::ParamInfo> out;
  if (rule->conversion != spec::Conversion::kFormat || rule->never) {
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(dtype, shape));
    out.push_back({name, dtype, shape, n});
    return out;
  }
  absl::StatusOr<std::vector<formats::OutputSpec>> outs = formats::PlanOutputs(rule->format, dtype, shape);
  if (!outs.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", outs.status().message()));
  for (formats::OutputSpec& o : *outs) out.push_back({name + o.suffix, o.dtype, o.shape, o.bytes});
  return out;
}

absl::StatusOr<std::vector<ConvertedTensor>> ConvertTensor(const spec::ModelSpec& spec, const std::string& name,
                                                           DType dtype, const Shape& shape, const void* data) {
  REFIT_ASSIGN_OR_RETURN(std::vector<storage::ParamInfo> layout, ConvertedLayout(spec, name, dtype, shape));
  std::vector<ConvertedTensor> out;
  for (storage::ParamInfo& p : layout) out.push_back({p.name, p.dtype, p.shape, std::vector<uint8_t>(p.nbytes)});
  REFIT_ASSIGN_OR_RETURN(const spec::Rule* rule, spec.RuleFor(name));
  if (rule->conversion != spec::Conversion::kFormat || rule->never) {
    std::memcpy(out[0].bytes.data(), data, out[0].bytes.size());
    return out;
  }
  std::vector<formats::MutableBytes> outs;
  for (ConvertedTensor& t : out) outs.push_back({t.bytes.data(), t.bytes.size()});
  REFIT_RETURN_IF_ERROR(formats::Quantize(rule->format, formats::ConstTensor{dtype, shape, data}, spec.options,
                                          std::nullopt, outs, name));
  return out;
}

}  // namespace refit
