// Quantizes a whole safetensors checkpoint into one format, the offline counterpart of the
// daemon's conversion (`refitctl quantize`). Every floating tensor the format takes (rank >= 2
// for quantized formats; any rank for the bf16/fp16/fp32 casts) becomes the format's tensors
// NAME+suffix; everything else is copied unchanged. The report says which and why.
// NVFP4 tensors use their own amax (no fused-group sharing: the file has no spec).
// Thread-safe: reentrant; streams one output tensor at a time.
#ifndef REFIT_FORMATS_QUANTIZE_FILE_H_
#define REFIT_FORMATS_QUANTIZE_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"
#include "formats/safetensors.h"

namespace refit::formats {

struct QuantizeFileOptions {
  Format format = Format::kBf16;
  QuantizeOptions quantize;
  SafetensorsLimits limits;
};

struct TensorReport {
  enum class Action : uint8_t { kQuantized, kCopied };
  std::string name;
  Action action;
  std::string reason;                // why a tensor was copied; empty when quantized
  std::vector<std::string> outputs;  // names written for this input tensor
};

// Reads `in_path`, writes `out_path` (atomically; `__metadata__` is kept). Fails without
// writing when the input is malformed, an output name collides, or a tensor is rejected by
// the input policy (e.g. NaN under nonfinite: reject).
absl::StatusOr<std::vector<TensorReport>> QuantizeFile(const std::string& in_path,
                                                       const std::string& out_path,
                                                       const QuantizeFileOptions& options);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_QUANTIZE_FILE_H_
