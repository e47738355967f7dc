// Checkpoint directories for the offline path (`refitctl convert`, the example engine and
// trainer): reading every *.safetensors file of a directory, and writing a converted
// checkpoint with the quantization metadata an engine reads (config.json
// "quantization_config", plus hf_quant_config.json for ModelOpt formats).
// Thread-safety: an open checkpoint is immutable; writing is reentrant.
#ifndef REFIT_REFIT_CHECKPOINT_IO_H_
#define REFIT_REFIT_CHECKPOINT_IO_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/safetensors.h"
#include "refit/offline.h"
#include "spec/model_spec.h"

namespace refit {

class Checkpoint {
 public:
  // `path`: a directory (every *.safetensors in it, by file name) or one .safetensors file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);
  const std::vector<InputTensor>& tensors() const { return tensors_; }
  std::vector<storage::ParamInfo> infos() const;
  const InputTensor* Find(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<formats::SafetensorsFile>> files_;
  std::vector<InputTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

// The quantization metadata of a converted checkpoint: file name -> JSON text. Empty when no
// tensor is quantized. One format: config.json's quantization_config (and hf_quant_config.json
// for nvfp4/nvfp4_te); several: hf_quant_config.json with MIXED_PRECISION quantized_layers.
// Modules with rank >= 2 tensors and nothing quantized are listed as excluded.
absl::StatusOr<std::map<std::string, std::string>> QuantMetadata(const spec::ModelSpec& spec,
                                                                 const std::vector<storage::ParamInfo>& inputs);

// Writes OUT_DIR/model.safetensors (tensors sorted by name) and the metadata files.
absl::Status WriteConvertedCheckpoint(const std::string& out_dir, const spec::ModelSpec& spec,
                                      const std::vector<storage::ParamInfo>& inputs,
                                      const std::vector<ConvertedTensor>& converted);

// Tensors by name, for EngineLayout.
std::map<std::string, const ConvertedTensor*> ByName(const std::vector<ConvertedTensor>& tensors);

}  // namespace refit

#endif  // REFIT_REFIT_CHECKPOINT_IO_H_
