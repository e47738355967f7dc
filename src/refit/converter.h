// Converter: turns a trainer tensor into its engine parameters' checkpoint-format bytes in
// staging, on the CPU (cpu_converter.h, the reference quantizers of src/formats/) or on the
// engine's GPU (src/refit/gpu/, the kernels of kernels/, byte-identical). Both run the same
// plan; which one a daemon uses follows its `staging:` setting.
//
// Threading: one converter per session, used by that session's converter thread only.
#ifndef REFIT_REFIT_CONVERTER_H_
#define REFIT_REFIT_CONVERTER_H_

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "formats/format.h"
#include "refit/planner.h"
#include "refit/types.h"
#include "storage/engine_storage.h"
#include "storage/memory.h"

namespace refit {

class Converter {
 public:
  virtual ~Converter() = default;

  // The memory kind of the staging buffers this converter writes.
  virtual storage::MemoryKind staging_kind() const = 0;

  // Converts `desc` (bytes at `src`, in `src_kind` memory) per `plan` into `outs`. May finish
  // asynchronously: `src` must stay valid and errors may surface only at Sync().
  virtual absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                               storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                               const formats::QuantizeOptions& options) = 0;

  // Completes every conversion issued so far. Returns the tensors that failed (e.g. NaN input
  // under `nonfinite: reject`), each with its error.
  virtual std::vector<std::pair<std::string, absl::Status>> Sync() = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_CONVERTER_H_
