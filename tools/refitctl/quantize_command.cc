#include "refitctl/quantize_command.h"

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "formats/quantize_file.h"

namespace refit::refitctl {
namespace {

int Usage(std::string_view problem) {
  std::cerr << "refitctl quantize: " << problem << "\nusage: refitctl quantize "
            << kQuantizeCommand.usage << "\n";
  return kExitUsage;
}

}  // namespace

int RunQuantize(std::span<const std::string_view> args) {
  std::optional<formats::Format> format;
  formats::QuantizeFileOptions options;
  std::vector<std::string> paths;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--format" || a == "--fp32-input" || a == "--nonfinite") {
      if (i + 1 >= args.size()) return Usage(std::string(a) + " needs a value");
      const std::string_view v = args[++i];
      if (a == "--format") {
        absl::StatusOr<formats::Format> f = formats::ParseFormat(v);
        if (!f.ok()) return Usage(std::string(f.status().message()));
        format = *f;
      } else if (a == "--fp32-input") {
        if (v == "exact") {
          options.quantize.fp32_input = formats::Fp32InputPolicy::kExact;
        } else if (v == "round_to_bf16") {
          options.quantize.fp32_input = formats::Fp32InputPolicy::kRoundToBf16;
        } else {
          return Usage("--fp32-input takes exact or round_to_bf16, got '" + std::string(v) + "'");
        }
      } else {
        if (v == "reject") {
          options.quantize.nonfinite = formats::NonfinitePolicy::kReject;
        } else if (v == "propagate") {
          options.quantize.nonfinite = formats::NonfinitePolicy::kPropagate;
        } else {
          return Usage("--nonfinite takes reject or propagate, got '" + std::string(v) + "'");
        }
      }
    } else if (a.size() > 1 && a[0] == '-') {
      return Usage("unknown option '" + std::string(a) + "'");
    } else {
      paths.emplace_back(a);
    }
  }
  if (!format) return Usage("--format is required");
  if (paths.size() != 2) return Usage("expected IN.safetensors and OUT.safetensors");
  options.format = *format;
  absl::StatusOr<std::vector<formats::TensorReport>> reports =
      formats::QuantizeFile(paths[0], paths[1], options);
  if (!reports.ok()) {
    std::cerr << "refitctl quantize: " << reports.status().message() << "\n";
    return kExitFailure;
  }
  for (const formats::TensorReport& r : *reports) {
    if (r.action == formats::TensorReport::Action::kQuantized) {
      std::cout << "quantized " << r.name << " -> " << absl::StrJoin(r.outputs, ", ") << "\n";
    } else {
      std::cout << "copied " << r.name << ": " << r.reason << "\n";
    }
  }
  return kExitOk;
}

}  // namespace refit::refitctl
