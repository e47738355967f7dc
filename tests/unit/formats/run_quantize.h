// Test helper: runs the public Quantize/Dequantize API into owned buffers.
#ifndef REFIT_TESTS_UNIT_FORMATS_RUN_QUANTIZE_H_
#define REFIT_TESTS_UNIT_FORMATS_RUN_QUANTIZE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"

namespace refit::formats::testing {

struct Quantized {
  std::vector<OutputSpec> plan;
  std::vector<std::vector<uint8_t>> parts;

  template <typename T>
  const T* As(size_t i) const {
    return reinterpret_cast<const T*>(parts[i].data());
  }
};

inline absl::StatusOr<Quantized> RunQuantize(Format f, DType dtype, const Shape& shape,
                                             const void* data, QuantizeOptions options = {},
                                             std::optional<float> global_amax = std::nullopt,
                                             const std::string& name = "t") {
  absl::StatusOr<std::vector<OutputSpec>> plan = PlanOutputs(f, dtype, shape);
  if (!plan.ok()) return plan.status();
  Quantized q;
  q.plan = *plan;
  std::vector<MutableBytes> outs;
  q.parts.resize(q.plan.size());
  for (size_t i = 0; i < q.plan.size(); ++i) {
    q.parts[i].assign(q.plan[i].bytes, 0xCD);  // poison: every byte must be written
    outs.push_back({q.parts[i].data(), q.plan[i].bytes});
  }
  absl::Status s = Quantize(f, ConstTensor{dtype, shape, data}, options, global_amax, outs, name);
  if (!s.ok()) return s;
  return q;
}

inline absl::StatusOr<Quantized> RunQuantizeF32(Format f, const Shape& shape,
                                                const std::vector<float>& x,
                                                QuantizeOptions options = {},
                                                std::optional<float> global_amax = std::nullopt) {
  return RunQuantize(f, DType::kF32, shape, x.data(), options, global_amax);
}

inline absl::StatusOr<std::vector<float>> RunDequantize(Format f, const Shape& shape,
                                                        const Quantized& q) {
  std::vector<ConstTensor> parts;
  for (size_t i = 0; i < q.plan.size(); ++i) {
    parts.push_back({q.plan[i].dtype, q.plan[i].shape, q.parts[i].data()});
  }
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  absl::Status s = Dequantize(f, shape, parts, out);
  if (!s.ok()) return s;
  return out;
}

}  // namespace refit::formats::testing

#endif  // REFIT_TESTS_UNIT_FORMATS_RUN_QUANTIZE_H_
