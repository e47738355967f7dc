#include "refitctl/spec_command.h"

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "refit/checkpoint_io.h"
#include "refitctl/common_flags.h"
#include "spec/model_spec.h"

ABSL_FLAG(std::string, checkpoint, "",
          "a safetensors file, or a directory of *.safetensors, whose tensor names the spec must fit");

namespace refit::refitctl {

int RunSpecLint(std::span<const std::string> args) {
  const bool json_output = absl::GetFlag(FLAGS_json);
  auto fail = [&](absl::string_view msg) {
    if (json_output) {
      std::cout << nlohmann::json{{"ok", false}, {"error", std::string(msg)}}.dump() << "\n";
    } else {
      std::cerr << "refitctl spec lint: " << msg << "\n";
    }
    return kExitFailure;
  };
  absl::StatusOr<spec::ModelSpec> spec = spec::LoadModelSpecFile(args[0]);
  if (!spec.ok()) return fail(spec.status().message());
  const std::string checkpoint_path = absl::GetFlag(FLAGS_checkpoint);
  if (checkpoint_path.empty()) {
    if (json_output) {
      std::cout << nlohmann::json{{"ok", true}, {"model", spec->model}, {"rules", spec->rules.size()}}.dump() << "\n";
    } else {
      std::cout << args[0] << ": model " << spec->model << ", " << spec->rules.size() << " rules, "
                << spec->groups.size() << " groups: loads\n";
    }
    return kExitOk;
  }
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(checkpoint_path);
  if (!checkpoint.ok()) return fail(checkpoint.status().message());
  std::map<const spec::Rule*, size_t> hits;
  for (const spec::Rule& r : spec->rules) hits[&r] = 0;
  std::vector<std::string> unmatched, conflicts;
  for (const InputTensor& t : (*checkpoint)->tensors()) {
    if (const spec::Rule* never = spec->NeverRuleFor(t.name); never != nullptr) ++hits[never];
    absl::StatusOr<const spec::Rule*> rule = spec->RuleFor(t.name);
    if (!rule.ok()) {
      conflicts.push_back(std::string(rule.status().message()));
    } else if (*rule == &spec->defaults) {
      if (spec->NeverRuleFor(t.name) == nullptr) unmatched.push_back(t.name);
    } else {
      ++hits[*rule];
    }
  }
  std::vector<std::string> unused;
  for (const spec::Rule& r : spec->rules) {
    if (hits[&r] == 0) unused.push_back(absl::StrCat("line ", r.line, ": ", r.Describe()));
  }
  const bool ok = unused.empty() && conflicts.empty();
  if (json_output) {
    std::cout << nlohmann::json{{"ok", ok},
                                {"model", spec->model},
                                {"tensors", (*checkpoint)->tensors().size()},
                                {"rules_matching_nothing", unused},
                                {"conflicts", conflicts},
                                {"tensors_taking_defaults", unmatched}}
                     .dump()
              << "\n";
  } else {
    std::cout << args[0] << ": " << (*checkpoint)->tensors().size() << " tensors of " << checkpoint_path << ", "
              << spec->rules.size() << " rules\n";
    for (const std::string& u : unused) std::cout << "  rule matches no tensor: " << u << "\n";
    for (const std::string& c : conflicts) std::cout << "  conflict: " << c << "\n";
    for (const std::string& n : unmatched) std::cout << "  no rule, takes the defaults: " << n << "\n";
    std::cout << (ok ? "ok" : "the spec does not fit the checkpoint") << "\n";
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace refit::refitctl
