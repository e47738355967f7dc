// The CPU converter: the reference quantizers of src/formats/, writing host staging.
#ifndef REFIT_REFIT_CPU_CONVERTER_H_
#define REFIT_REFIT_CPU_CONVERTER_H_

#include "refit/converter.h"

namespace refit {

class CpuConverter final : public Converter {
 public:
  storage::MemoryKind staging_kind() const override { return storage::MemoryKind::kHost; }
  absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                       storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                       const formats::QuantizeOptions& options) override;
  std::vector<std::pair<std::string, absl::Status>> Sync() override { return {}; }
};

}  // namespace refit

#endif  // REFIT_REFIT_CPU_CONVERTER_H_
