// Offline conversion under a model spec: what `refitctl convert` writes (the checkpoint
// format: unfused HF names plus scales, whole tensors) and what an engine's parameters must
// hold after a refit of the same input (the engine layout: fused, stacked, sharded, laid out,
// with derived parameters). The online path (Session, Committer) calls the same resolve,
// convert and build functions, so both produce identical bytes.
// Thread-safe: pure functions.
#ifndef REFIT_REFIT_OFFLINE_H_
#define REFIT_REFIT_OFFLINE_H_

#include <map>
#include <optional>
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

struct InputTensor {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};

// The checkpoint-format tensors that HF tensor (name, dtype, shape) becomes, whole (unsharded).
// `auto` conversions keep the input dtype; `never` tensors are kept as they are.
absl::StatusOr<std::vector<storage::ParamInfo>> ConvertedLayout(const spec::ModelSpec& spec, const std::string& name,
                                                               DType dtype, const Shape& shape);

// Converts one HF tensor's bytes on its own (a fused NVFP4 member uses its own amax; use
// ConvertCheckpoint for whole checkpoints).
absl::StatusOr<std::vector<ConvertedTensor>> ConvertTensor(const spec::ModelSpec& spec, const std::string& name,
                                                           DType dtype, const Shape& shape, const void* data);

// Converts one HF tensor resolved by Resolve (refit/resolve.h); `amax`: its fused group's
// shared amax, when it has one.
struct Resolution;
absl::StatusOr<std::vector<ConvertedTensor>> ConvertResolved(const spec::ModelSpec& spec, const Resolution& r,
                                                             const InputTensor& in, std::optional<float> amax);

// Converts a whole checkpoint: fused NVFP4 members share their group's amax (max over the
// members present). Outputs follow the input order, each tensor's outputs in format order.
absl::StatusOr<std::vector<ConvertedTensor>> ConvertCheckpoint(const spec::ModelSpec& spec,
                                                               const std::vector<InputTensor>& inputs);

// The engine parameters a refit of trainer tensors `inputs` (their names, dtypes and shapes)
// leaves in the engine, built from their converted checkpoint tensors `converted` (by name):
// this rank's shard, fused/stacked slots assembled, layout steps applied, derived parameters
// computed, `never` tensors as given. Errors name a parameter whose slots are not all present.
absl::StatusOr<std::vector<ConvertedTensor>> EngineLayout(
    const spec::ModelSpec& spec, const std::vector<storage::ParamInfo>& inputs,
    const std::map<std::string, const ConvertedTensor*>& converted);

// The engine parameters (names, dtypes, shapes) EngineLayout would produce from trainer
// tensors `inputs`, without any bytes: what an engine registers for them. Errors as EngineLayout.
absl::StatusOr<std::vector<storage::ParamInfo>> EngineParamInfos(const spec::ModelSpec& spec,
                                                                 const std::vector<storage::ParamInfo>& inputs);

}  // namespace refit

#endif  // REFIT_REFIT_OFFLINE_H_
