#include "refitctl/quantize_command.h"

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "formats/quantize_file.h"

ABSL_FLAG(std::string, format, "", "the output format (required): a name `refitctl formats` lists");
ABSL_FLAG(std::string, fp32_input, "exact", "FP32 input tensors: exact, or round_to_bf16 first");
ABSL_FLAG(std::string, nonfinite, "reject", "NaN/Inf in an input: reject (fail, naming the tensor) or propagate");

namespace refit::refitctl {

int RunQuantize(std::span<const std::string> paths) {
  const std::string format_name = absl::GetFlag(FLAGS_format);
  if (format_name.empty()) return UsageError(kQuantizeCommand, "--format is required");
  absl::StatusOr<formats::Format> format = formats::ParseFormat(format_name);
  if (!format.ok()) return UsageError(kQuantizeCommand, std::string(format.status().message()));
  formats::QuantizeFileOptions options;
  const std::string fp32_input = absl::GetFlag(FLAGS_fp32_input);
  if (fp32_input == "exact") {
    options.quantize.fp32_input = formats::Fp32InputPolicy::kExact;
  } else if (fp32_input == "round_to_bf16") {
    options.quantize.fp32_input = formats::Fp32InputPolicy::kRoundToBf16;
  } else {
    return UsageError(kQuantizeCommand, "--fp32-input takes exact or round_to_bf16, got '" + fp32_input + "'");
  }
  const std::string nonfinite = absl::GetFlag(FLAGS_nonfinite);
  if (nonfinite == "reject") {
    options.quantize.nonfinite = formats::NonfinitePolicy::kReject;
  } else if (nonfinite == "propagate") {
    options.quantize.nonfinite = formats::NonfinitePolicy::kPropagate;
  } else {
    return UsageError(kQuantizeCommand, "--nonfinite takes reject or propagate, got '" + nonfinite + "'");
  }
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
