#include "refitctl/spec_command.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <filesystem>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/trainer_client.h"
#include "nlohmann/json.hpp"
#include "refit/checkpoint_io.h"
#include "refit/resolve.h"
#include "refitctl/common_flags.h"
#include "spec/model_spec.h"

ABSL_FLAG(std::string, checkpoint, "",
          "a safetensors file, or a directory of *.safetensors, whose tensor names the spec must fit");
ABSL_FLAG(bool, engine, false, "spec init: also read the parameter names of the engine registered with the daemon");
ABSL_FLAG(std::string, output, "", "spec init: write the spec here instead of stdout");
ABSL_DECLARE_FLAG(std::string, model);

namespace refit::refitctl {
namespace {

// One name family: the pattern's dot-separated components, and how many names it covers.
struct Family {
  std::vector<std::string> parts;
  std::set<std::string> examples;  // up to 3 names it covers
  size_t count = 0;
};

bool IsNumber(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

bool IsLiteral(const std::string& s) { return s.find('{') == std::string::npos; }

// Names become patterns: numeric components become captures, named in order of appearance.
absl::StatusOr<std::vector<Family>> Families(const std::vector<std::string>& names) {
  std::map<std::vector<std::string>, Family> by_pattern;
  for (const std::string& name : names) {
    if (name.find_first_of("{}*,") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': a name with '{', '}', '*' or ',' cannot be written as a spec pattern"));
    }
    std::vector<std::string> parts = absl::StrSplit(name, '.');
    int captures = 0;
    for (std::string& p : parts) {
      if (!IsNumber(p)) continue;
      ++captures;
      p = captures == 1 ? "{L}" : captures == 2 ? "{E}" : absl::StrCat("{N", captures, "}");
    }
    Family& f = by_pattern[parts];
    f.parts = parts;
    ++f.count;
    if (f.examples.size() < 3) f.examples.insert(name);
  }
  std::vector<Family> out;
  for (auto& [k, f] : by_pattern) out.push_back(std::move(f));
  // Families differing in exactly one literal component merge into one alternation there:
  // a.{q_proj,k_proj}.weight. Greedy, the largest merge first, until none is left.
  while (true) {
    std::map<std::pair<size_t, std::vector<std::string>>, std::vector<size_t>> groups;
    for (size_t i = 0; i < out.size(); ++i) {
      for (size_t at = 0; at < out[i].parts.size(); ++at) {
        if (!IsLiteral(out[i].parts[at])) continue;
        std::vector<std::string> key = out[i].parts;
        key[at] = "";
        groups[{at, key}].push_back(i);
      }
    }
    const std::vector<size_t>* best = nullptr;
    size_t best_at = 0;
    for (const auto& [key, members] : groups) {
      if (members.size() > 1 && (best == nullptr || members.size() > best->size())) {
        best = &members;
        best_at = key.first;
      }
    }
    if (best == nullptr) break;
    Family merged = out[(*best)[0]];
    std::vector<std::string> alternatives;
    merged.count = 0;
    merged.examples.clear();
    for (size_t i : *best) {
      alternatives.push_back(out[i].parts[best_at]);
      merged.count += out[i].count;
      for (const std::string& e : out[i].examples) {
        if (merged.examples.size() < 3) merged.examples.insert(e);
      }
    }
    std::sort(alternatives.begin(), alternatives.end());
    merged.parts[best_at] = absl::StrCat("{", absl::StrJoin(alternatives, ","), "}");
    std::vector<Family> rest;
    std::set<size_t> gone(best->begin(), best->end());
    for (size_t i = 0; i < out.size(); ++i) {
      if (!gone.count(i)) rest.push_back(std::move(out[i]));
    }
    rest.push_back(std::move(merged));
    out = std::move(rest);
  }
  std::sort(out.begin(), out.end(), [](const Family& a, const Family& b) { return a.parts < b.parts; });
  return out;
}

std::string Quoted(const std::string& s) { return nlohmann::json(s).dump(); }

// Tensors that do not fit listed by `spec lint` (the rest are counted).
constexpr size_t kMaxProblemsListed = 20;

}  // namespace

int RunSpecInit(std::span<const std::string> args) {
  auto fail = [](absl::string_view msg) {
    std::cerr << "refitctl spec init: " << msg << "\n";
    return kExitFailure;
  };
  const std::string checkpoint_path = absl::GetFlag(FLAGS_checkpoint);
  const bool from_engine = absl::GetFlag(FLAGS_engine);
  if (checkpoint_path.empty() && !from_engine) {
    return UsageError(kSpecInitCommand, "give --checkpoint, --engine, or both");
  }
  std::vector<std::string> names, engine_names;
  std::string source;
  if (!checkpoint_path.empty()) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(checkpoint_path);
    if (!checkpoint.ok()) return fail(checkpoint.status().message());
    for (const InputTensor& t : (*checkpoint)->tensors()) names.push_back(t.name);
    if (names.empty()) return fail(absl::StrCat(checkpoint_path, ": no tensors"));
    source = absl::StrCat("the ", names.size(), " tensors of ", checkpoint_path);
  }
  std::string daemon_model;
  if (from_engine) {
    const std::string address = DaemonAddress();
    absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(address);
    if (!c.ok()) return fail(c.status().message());
    absl::StatusOr<client::DaemonStatus> status = (*c)->Status();
    if (!status.ok()) return fail(status.status().message());
    if (!status->engine_registered) return fail(absl::StrCat("no engine is registered with refitd at ", address));
    daemon_model = status->model;
    auto sums = (*c)->Checksums();
    if (!sums.ok()) return fail(sums.status().message());
    for (const client::ParamChecksum& p : sums->second) engine_names.push_back(p.name);
    std::sort(engine_names.begin(), engine_names.end());
    const std::string engine_source = absl::StrCat("the ", engine_names.size(), " parameters of the engine at ", address);
    source = source.empty() ? engine_source : absl::StrCat(source, " and ", engine_source);
    if (names.empty()) names = engine_names;
  }
  absl::StatusOr<std::vector<Family>> families = Families(names);
  if (!families.ok()) return fail(families.status().message());
  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) model = daemon_model;
  if (model.empty()) {
    std::filesystem::path p = std::filesystem::absolute(checkpoint_path).lexically_normal();
    if (p.has_filename() && p.extension() == ".safetensors") p = p.parent_path();
    model = p.filename().string();
    if (model.empty()) model = "model";
  }

  std::string out;
  absl::StrAppend(&out, "# Model spec skeleton written by `refitctl spec init` from ", source, ".\n",
                  "# Every rule casts to the engine parameter's dtype (format: auto). Set `format:` (fp8_block128,\n",
                  "# mxfp8, nvfp4, ...) on the rules to quantize, `target:`/`fuse:`/`stack:` where the engine\n",
                  "# fuses or stacks parameters, and `refit: never` for tensors refits do not carry\n",
                  "# (docs/config.md). Check it with: refitctl spec lint SPEC --checkpoint CHECKPOINT\n");
  if (!checkpoint_path.empty() && !engine_names.empty()) {
    const std::set<std::string> in_checkpoint(names.begin(), names.end());
    std::vector<std::string> missing;
    for (const std::string& e : engine_names) {
      if (!in_checkpoint.count(e)) missing.push_back(e);
    }
    if (!missing.empty()) {
      absl::StrAppend(&out, "#\n# ", missing.size(), " engine parameter", missing.size() == 1 ? "" : "s",
                      " no checkpoint tensor names (a rule needs a `target:` for them):\n");
      for (size_t i = 0; i < missing.size() && i < 20; ++i) absl::StrAppend(&out, "#   ", missing[i], "\n");
      if (missing.size() > 20) absl::StrAppend(&out, "#   ... and ", missing.size() - 20, " more\n");
    }
  }
  absl::StrAppend(&out, "model: ", Quoted(model), "\ndefaults:\n  format: auto\nrules:\n");
  for (const Family& f : *families) {
    absl::StrAppend(&out, "  # ", f.count, " tensor", f.count == 1 ? "" : "s", ", e.g. ",
                    absl::StrJoin(f.examples, ", "), "\n  - match: ", Quoted(absl::StrJoin(f.parts, ".")),
                    "\n    format: auto\n");
  }
  // The skeleton must load as refitd would load it.
  absl::StatusOr<spec::ModelSpec> loaded = spec::ParseModelSpec(out, "spec init output");
  if (!loaded.ok()) return fail(absl::StrCat("the skeleton does not load: ", loaded.status().message()));
  for (const std::string& name : names) {
    absl::StatusOr<const spec::Rule*> rule = loaded->RuleFor(name);
    if (!rule.ok()) return fail(absl::StrCat("the skeleton's rules overlap: ", rule.status().message()));
    if (*rule == &loaded->defaults) return fail(absl::StrCat("tensor '", name, "': no rule of the skeleton matches it"));
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) {
    std::cout << out;
    return kExitOk;
  }
  std::ofstream file(output, std::ios::trunc);
  file << out;
  file.close();
  if (!file) return fail(absl::StrCat("cannot write ", output));
  std::cerr << "refitctl spec init: wrote " << output << " (" << families->size() << " rules for " << names.size()
            << " names)\n";
  return kExitOk;
}

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
  const std::string checkpoint_path = absl::GetFlag(FLAGS_checkpoint);
  absl::StatusOr<std::optional<spec::ModelConfig>> config = ModelConfigFor(checkpoint_path);
  if (!config.ok()) return fail(config.status().message());
  spec::LoadOptions options;
  options.model_config = *config ? &**config : nullptr;
  // The spec's text alone may leave sizes to a model config; matching a checkpoint needs them.
  options.allow_unresolved = checkpoint_path.empty();
  absl::StatusOr<spec::ModelSpec> spec = spec::LoadModelSpecFile(args[0], options);
  if (!spec.ok()) return fail(spec.status().message());
  if (checkpoint_path.empty()) {
    if (json_output) {
      std::cout << nlohmann::json{{"ok", true},
                                  {"model", spec->model},
                                  {"rules", spec->rules.size()},
                                  {"model_config", spec->model_config},
                                  {"tensor_parallel", spec::TensorParallelText(*spec)},
                                  {"sizes_from_the_model_config", spec->unresolved}}
                       .dump()
                << "\n";
    } else {
      std::cout << args[0] << ": model " << spec->model << ", " << spec->rules.size() << " rules, "
                << spec->groups.size() << " groups: loads\n";
      if (spec->tp_size_from_engine) {
        std::cout << "  tensor_parallel.size: engine (each engine rank registers it; the first fixes it)\n";
      } else if (spec->tp_size > 1) {
        std::cout << "  tensor_parallel: " << spec::TensorParallelText(*spec) << "\n";
      }
      if (!spec->unresolved.empty()) {
        std::cout << "  sizes from the model's config.json (check them with --model-config, or --checkpoint with a "
                     "config.json): "
                  << absl::StrJoin(spec->unresolved, ", ") << "\n";
      }
    }
    return kExitOk;
  }
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(checkpoint_path);
  if (!checkpoint.ok()) return fail(checkpoint.status().message());
  std::map<const spec::Rule*, size_t> hits;
  for (const spec::Rule& r : spec->rules) hits[&r] = 0;
  std::vector<std::string> unmatched, conflicts, problems;
  size_t problem_count = 0;
  for (const InputTensor& t : (*checkpoint)->tensors()) {
    if (const spec::Rule* never = spec->NeverRuleFor(t.name); never != nullptr) ++hits[never];
    absl::StatusOr<const spec::Rule*> rule = spec->RuleFor(t.name);
    if (!rule.ok()) {
      conflicts.push_back(std::string(rule.status().message()));
      continue;
    }
    if (*rule == &spec->defaults) {
      if (spec->NeverRuleFor(t.name) == nullptr) unmatched.push_back(t.name);
    } else {
      ++hits[*rule];
    }
    if ((*rule)->never) continue;
    // The tensor as refitd would plan it, at its real shape: expert index within the stack,
    // fused members on block boundaries, tensor-parallel splits, quantizable shapes.
    absl::StatusOr<Resolution> resolved = Resolve(*spec, t.name, t.dtype, t.shape);
    if (!resolved.ok()) {
      ++problem_count;
      if (problems.size() < kMaxProblemsListed) problems.push_back(std::string(resolved.status().message()));
    }
  }
  // A `refit: never` rule names tensors the engine keeps; a trainer checkpoint need not hold them.
  std::vector<std::string> unused, unused_never;
  for (const spec::Rule& r : spec->rules) {
    if (hits[&r] != 0) continue;
    (r.never ? unused_never : unused).push_back(absl::StrCat("line ", r.line, ": ", r.Describe()));
  }
  const bool ok = unused.empty() && conflicts.empty() && problem_count == 0;
  if (json_output) {
    std::cout << nlohmann::json{{"ok", ok},
                                {"model", spec->model},
                                {"model_config", spec->model_config},
                                {"tensors", (*checkpoint)->tensors().size()},
                                {"rules_matching_nothing", unused},
                                {"never_rules_matching_nothing", unused_never},
                                {"conflicts", conflicts},
                                {"problems", problems},
                                {"problem_count", problem_count},
                                {"tensors_taking_defaults", unmatched}}
                     .dump()
              << "\n";
  } else {
    std::cout << args[0] << ": " << (*checkpoint)->tensors().size() << " tensors of " << checkpoint_path << ", "
              << spec->rules.size() << " rules";
    if (!spec->model_config.empty()) std::cout << ", sizes from " << spec->model_config;
    std::cout << "\n";
    for (const std::string& u : unused) std::cout << "  rule matches no tensor: " << u << "\n";
    for (const std::string& u : unused_never) {
      std::cout << "  refit: never rule matches no tensor (fine: the engine keeps these): " << u << "\n";
    }
    for (const std::string& c : conflicts) std::cout << "  conflict: " << c << "\n";
    for (const std::string& p : problems) std::cout << "  does not fit: " << p << "\n";
    if (problem_count > problems.size()) {
      std::cout << "  ... and " << problem_count - problems.size() << " more tensors that do not fit\n";
    }
    for (const std::string& n : unmatched) std::cout << "  no rule, takes the defaults: " << n << "\n";
    std::cout << (ok ? "ok" : "the spec does not fit the checkpoint") << "\n";
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace refit::refitctl
