#include "spec/model_config.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec {
namespace {

// Non-null scalars of `map` by key (nested objects and lists are not sizes).
void Scalars(const YAML::Node& map, std::map<std::string, std::string, std::less<>>& out) {
  for (const auto& kv : map) {
    if (kv.second.IsScalar()) out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::Parse(std::string_view json, std::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(json));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ":", e.mark.line + 1, ": ", e.msg));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": a model config is a JSON object"));
  }
  ModelConfig c;
  c.source_ = std::string(source);
  Scalars(root, c.top_);
  if (const YAML::Node text = root["text_config"]; text && text.IsMap()) Scalars(text, c.text_);
  return c;
}

absl::StatusOr<std::optional<ConfigSize>> ModelConfig::First(std::initializer_list<std::string_view> keys) const {
  for (std::string_view key : keys) {
    const std::string* text = nullptr;
    if (auto it = top_.find(key); it != top_.end()) {
      text = &it->second;
    } else if (auto nested = text_.find(key); nested != text_.end()) {
      text = &nested->second;
    } else {
      continue;
    }
    int64_t v = 0;
    if (!absl::SimpleAtoi(*text, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config '", source_, "': ", std::string(key), " is '", *text, "', not a positive integer"));
    }
    return ConfigSize{v, std::string(key)};
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<ConfigSize>> ModelConfig::Experts() const {
  return First({"num_experts", "n_routed_experts", "num_local_experts"});
}

absl::StatusOr<std::optional<ConfigSize>> ModelConfig::QueryGroups() const {
  return First({"num_key_value_heads", "num_attention_heads"});
}

absl::StatusOr<std::optional<ConfigSize>> ModelConfig::HeadDim() const {
  REFIT_ASSIGN_OR_RETURN(std::optional<ConfigSize> d, First({"head_dim"}));
  if (d) return d;
  REFIT_ASSIGN_OR_RETURN(std::optional<ConfigSize> hidden, First({"hidden_size"}));
  REFIT_ASSIGN_OR_RETURN(std::optional<ConfigSize> heads, First({"num_attention_heads"}));
  if (!hidden || !heads) return std::nullopt;
  if (hidden->value % heads->value != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config '", source_, "': no head_dim, and hidden_size ",
                                                   hidden->value, " is not a multiple of num_attention_heads ",
                                                   heads->value));
  }
  return ConfigSize{hidden->value / heads->value, "hidden_size / num_attention_heads"};
}

absl::StatusOr<ModelConfig> LoadModelConfigFile(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(std::string text, ReadBoundedFile(path, kMaxModelConfigFileBytes, "model config"));
  return ModelConfig::Parse(text, path);
}

}  // namespace refit::spec
