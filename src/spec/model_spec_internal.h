// What the model spec loader's sources share: the YAML readers, the sizes a spec may leave to the
// model, and the sections ParseModelSpec assembles a spec from (model_spec.cc: the top-level
// sections (checkpoint, parallelism, source, defaults) and the spec's lookups;
// model_spec_reader.cc: `Reader` and `Sizes`; model_spec_layout.cc: layout steps;
// model_spec_rules.cc: rules and their cross-field checks; model_spec_groups.cc: groups and
// derived parameters). Not part of spec/model_spec.h's interface: only src/spec/ includes it.
//
// Threading: none of it is shared; one load runs on one thread.
#ifndef REFIT_SPEC_MODEL_SPEC_INTERNAL_H_
#define REFIT_SPEC_MODEL_SPEC_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/format.h"
#include "spec/model_config.h"
#include "spec/model_spec.h"
#include "spec/name_pattern.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec::internal {

// Reads a spec's YAML values. Errors carry "file:line: key: message".
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  absl::Status Error(const YAML::Node& node, std::string_view where, absl::string_view msg) const;
  // An error naming the first key of `map` that is not in `allowed`.
  absl::Status CheckKeys(const YAML::Node& map, std::string_view where, const std::set<std::string>& allowed) const;
  absl::StatusOr<std::string> String(const YAML::Node& node, std::string_view where) const;
  absl::StatusOr<bool> Bool(const YAML::Node& node, std::string_view where) const;
  absl::StatusOr<int64_t> Int(const YAML::Node& node, std::string_view where, int64_t min) const;
  absl::StatusOr<NamePattern> Pattern(const YAML::Node& node, std::string_view where) const;
  // A `format:` value into `rule.conversion` (and `rule.format`).
  absl::Status Conversion(const YAML::Node& node, std::string_view where, Rule& rule) const;
  // `fp32_input` and `nonfinite` of `map`, where given.
  absl::Status Options(const YAML::Node& map, const std::string& where, formats::QuantizeOptions& options) const;
  // A rule's `layout:` steps (model_spec_layout.cc).
  absl::Status Layout(const YAML::Node& list, const std::string& where, Rule& rule) const;
  // `with_on` false: the steps of a derived copy, each on the one tensor it derives from.
  absl::Status Layout(const YAML::Node& list, const std::string& where, std::vector<LayoutStep>& steps,
                      bool with_on) const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sizes a spec may leave to the model (docs/config.md, "Sizes come from the model").
class Sizes {
 public:
  using Lookup = std::function<absl::StatusOr<std::optional<ConfigSize>>(const ModelConfig&)>;
  // When a size neither the spec nor a model config gives is an error.
  enum class Need : uint8_t {
    kOptional,  // never: 0 means "not given" (vocab_size: no padding)
    kLater,     // when a tensor needs it (a Megatron-core push: linear_qkv's heads); listed as unresolved
    kAtLoad,    // at load (a stack's count: the planner's slots): listed, and the spec refused
  };

  Sizes(const Reader& r, const LoadOptions& options, ModelSpec& spec) : r_(r), options_(options), spec_(spec) {}

  // `parent[key]` when the spec states it (it must agree with the model config's, when one is
  // given and has the size), else the model config's (`keys` names where it looks, for errors);
  // 0 when neither has it. With a model config, a size it lacks that is needed (not kOptional)
  // is an error; without one, it is listed as unresolved.
  absl::StatusOr<int64_t> Get(const YAML::Node& parent, const char* key, const std::string& where, const Lookup& lookup,
                              std::string_view keys, Need need);

  // The sizes the spec cannot load without (no model config was given).
  const std::vector<std::string>& refused() const { return refused_; }

 private:
  const Reader& r_;
  const LoadOptions& options_;
  ModelSpec& spec_;
  std::vector<std::string> refused_;
};

absl::StatusOr<std::optional<ConfigSize>> ExpertsOf(const ModelConfig& c);
absl::StatusOr<std::optional<ConfigSize>> QueryGroupsOf(const ModelConfig& c);
absl::StatusOr<std::optional<ConfigSize>> HeadDimOf(const ModelConfig& c);
// The config's value of `key`.
Sizes::Lookup Key(const char* key);

inline constexpr std::string_view kExpertKeys = "num_experts, n_routed_experts or num_local_experts";

// The sections after `defaults`, in the order ParseModelSpec reads them; each appends to `spec`.
// REQUIRES: `spec`'s checkpoint, parallel sizes and defaults are read (rules use them).
// `tensor_parallel_given`: the spec has a top-level `tensor_parallel` section (a `shard:` needs it).
absl::Status ParseRules(const Reader& r, const YAML::Node& rules, bool tensor_parallel_given, Sizes& sizes,
                        ModelSpec& spec);
absl::Status ParseGroups(const Reader& r, const YAML::Node& groups, ModelSpec& spec);
absl::Status ParseDerived(const Reader& r, const YAML::Node& derived, Sizes& sizes, ModelSpec& spec);

}  // namespace refit::spec::internal

#endif  // REFIT_SPEC_MODEL_SPEC_INTERNAL_H_
