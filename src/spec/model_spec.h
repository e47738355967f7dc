// A model spec: how a trainer's HF tensors map onto the engine's parameters for one model.
// Loaded once from YAML at daemon start, immutable afterwards (thread-safe to read).
// docs/config.md is the reference for the YAML schema.
#ifndef REFIT_SPEC_MODEL_SPEC_H_
#define REFIT_SPEC_MODEL_SPEC_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"
#include "spec/name_pattern.h"

namespace refit::spec {

// How a trainer tensor becomes engine parameters.
enum class Conversion : uint8_t {
  kAuto,         // cast to the dtype of the engine parameter of the same name (bf16/fp16/fp32)
  kPassthrough,  // bytes copied as sent; dtype and shape must equal the engine's
  kFormat,       // quantize with `format`; outputs are NAME + the format's suffixes
};

struct Rule {
  NamePattern match;
  Conversion conversion = Conversion::kAuto;
  formats::Format format = formats::Format::kBf16;  // when kFormat
  bool never = false;    // `refit: never`: engine keeps its own value; excluded from checks
  bool partial = false;  // may be refit alone in a partial refit
  int line = 0;          // 1-based line in the spec file
  std::string Describe() const;
};

// Members that must arrive together (fused q/k/v, gate/up, all experts of a layer).
struct Group {
  std::string name;
  std::vector<NamePattern> members;
  int line = 0;
};

enum class DerivedOp : uint8_t { kAddOne };

// An engine parameter recomputed at every commit from the staged value of `from`.
struct Derived {
  NamePattern target;
  NamePattern from;
  DerivedOp op = DerivedOp::kAddOne;
  int line = 0;
};

struct ModelSpec {
  std::string model;
  std::string path;  // where it was loaded from ("<string>" for inline specs)
  formats::QuantizeOptions options;
  Rule defaults;  // applies to names no rule matches (match is "**")
  std::vector<Rule> rules;
  std::vector<Group> groups;
  std::vector<Derived> derived;

  // The rule for `name`: the one rule whose pattern matches, else `defaults`. Error naming both
  // rules when two match (overlapping rules).
  absl::StatusOr<const Rule*> RuleFor(std::string_view name) const;
  // The derived entry whose target matches `engine_param`, with its captures; nullopt if none.
  std::optional<std::pair<const Derived*, Captures>> DerivedFor(std::string_view engine_param) const;
};

absl::StatusOr<ModelSpec> LoadModelSpecFile(const std::string& path);
absl::StatusOr<ModelSpec> ParseModelSpec(std::string_view yaml, std::string_view path = "<string>");

}  // namespace refit::spec

#endif  // REFIT_SPEC_MODEL_SPEC_H_
