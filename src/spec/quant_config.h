// The rollout checkpoint's quantization metadata, as the engine reads it: ModelOpt's
// hf_quant_config.json ({"quantization": {...}}), or config.json's "quantization_config"
// (ModelOpt flat/nested form, DeepSeek-style fp8 block-128, mxfp8, gpt-oss mxfp4,
// compressed-tensors config groups). Says which
// refitd format each module's weights take, or that a module stays unquantized.
//
// Exclusion patterns (exclude_modules, ignore, modules_to_not_convert) are globs: `*` matches
// any run of characters, dots included (fnmatch), and a pattern excludes a module when it
// matches the module's full name or the name of any module containing it. A compressed-tensors
// "re:PATTERN" entry is a regular expression matched from the start of the name instead.
// Thread-safe after construction (immutable).
#ifndef REFIT_SPEC_QUANT_CONFIG_H_
#define REFIT_SPEC_QUANT_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"

namespace YAML {
class Node;
}

namespace refit::spec {

struct QuantConfig {
  std::string source;            // file it was read from, or "<spec>:LINE" when inline
  std::string algo;              // as the checkpoint names it: NVFP4, fp8, mxfp4, MIXED_PRECISION...
  std::optional<formats::Format> format;           // one format for every quantized module
  std::map<std::string, formats::Format> layers;   // MIXED_PRECISION: module -> format
  std::vector<std::string> exclude;                // globs of unquantized modules

  // The format of the module that owns tensor `tensor_name` (the name up to its last '.'),
  // or nullopt when that module is unquantized.
  std::optional<formats::Format> FormatForTensor(std::string_view tensor_name) const;
  bool Excluded(std::string_view module) const;
};

// fnmatch-style: '*' any run (dots included), '?' one character; whole-string match.
bool GlobMatch(std::string_view pattern, std::string_view text);

// Parses JSON (or YAML) text of either file kind. `source` names it in errors.
absl::StatusOr<QuantConfig> ParseQuantConfigText(std::string_view text, std::string_view source);
// Largest quantization config file read (bytes); a bigger one, or one that is not a regular file
// (/dev/zero), is refused naming the file.
inline constexpr uint64_t kMaxQuantConfigFileBytes = 16 << 20;
absl::StatusOr<QuantConfig> LoadQuantConfigFile(const std::string& path);
// `root` holds "quantization" (hf_quant_config.json) or "quantization_config" (config.json).
absl::StatusOr<QuantConfig> ParseQuantConfigNode(const YAML::Node& root, std::string_view source);

}  // namespace refit::spec

#endif  // REFIT_SPEC_QUANT_CONFIG_H_
