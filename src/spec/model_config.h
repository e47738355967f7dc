// The model's own config.json (Hugging Face): where a model spec's sizes come from. A shipped
// spec names no expert count, head count or vocabulary of its own; refitd reads them from the
// config.json of the model it serves (daemon `model_config`, `refitctl --model-config`, or the
// checkpoint directory's config.json), so one spec fits every size of its family and a test
// derives its small fixture by handing over a small config.json (docs/config.md, "Sizes come
// from the model"). Immutable after loading: thread-safe to read.
#ifndef REFIT_SPEC_MODEL_CONFIG_H_
#define REFIT_SPEC_MODEL_CONFIG_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace refit::spec {

// One size read from the config: its value and the key(s) it came from, for error texts
// ("num_experts", "hidden_size / num_attention_heads").
struct ConfigSize {
  int64_t value = 0;
  std::string from;
};

class ModelConfig {
 public:
  // `json`: config.json's text; `source` names it in errors (the file path).
  static absl::StatusOr<ModelConfig> Parse(std::string_view json, std::string_view source);

  const std::string& source() const { return source_; }

  // The first of `keys` the config gives a value (null counts as not given). A key is read at
  // the top level, else under `text_config` (multimodal configs nest the language model's sizes
  // there). InvalidArgument when the first key present is not a positive integer.
  absl::StatusOr<std::optional<ConfigSize>> First(std::initializer_list<std::string_view> keys) const;
  // Routed experts per MoE layer: num_experts (Qwen-MoE), n_routed_experts (DeepSeek-V3),
  // num_local_experts (gpt-oss, Mixtral).
  absl::StatusOr<std::optional<ConfigSize>> Experts() const;
  // Key/value heads: num_key_value_heads, else num_attention_heads (multi-head attention).
  absl::StatusOr<std::optional<ConfigSize>> QueryGroups() const;
  // head_dim, else hidden_size / num_attention_heads (the Hugging Face default).
  absl::StatusOr<std::optional<ConfigSize>> HeadDim() const;

 private:
  std::string source_;
  std::map<std::string, std::string, std::less<>> top_;   // scalar values as written ("null" for null)
  std::map<std::string, std::string, std::less<>> text_;  // text_config's
};

// Largest config.json read (bytes).
inline constexpr uint64_t kMaxModelConfigFileBytes = 16 << 20;
absl::StatusOr<ModelConfig> LoadModelConfigFile(const std::string& path);

}  // namespace refit::spec

#endif  // REFIT_SPEC_MODEL_CONFIG_H_
