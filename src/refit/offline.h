// Offline conversion of whole tensors under a model spec: what `refitctl convert` writes and
// what an engine's parameters must hold after a refit of the same input. The online path
// (Session) uses the same formats functions, so both produce identical bytes.
// Thread-safe: pure functions.
#ifndef REFIT_REFIT_OFFLINE_H_
#define REFIT_REFIT_OFFLINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "refit/types.h"
#include "spec/model_spec.h"
#include "storage/engine_storage.h"

namespace refit {

struct ConvertedTensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// The engine parameters (checkpoint-format tensors) that HF tensor (name, dtype, shape) becomes.
// `auto` conversions keep the input dtype; `never` tensors are kept as they are.
absl::StatusOr<std::vector<storage::ParamInfo>> ConvertedLayout(const spec::ModelSpec& spec, const std::string& name,
                                                               DType dtype, const Shape& shape);

// Converts one HF tensor's bytes.
absl::StatusOr<std::vector<ConvertedTensor>> ConvertTensor(const spec::ModelSpec& spec, const std::string& name,
                                                           DType dtype, const Shape& shape, const void* data);

}  // namespace refit

#endif  // REFIT_REFIT_OFFLINE_H_
