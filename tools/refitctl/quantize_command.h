// `refitctl quantize`: converts a safetensors file to one checkpoint format.
#ifndef REFIT_TOOLS_REFITCTL_QUANTIZE_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_QUANTIZE_COMMAND_H_

#include "refitctl/command.h"

namespace refit::refitctl {

int RunQuantize(std::span<const std::string> args);

inline constexpr std::string_view kQuantizeFlags[] = {"format", "fp32_input", "nonfinite"};

inline constexpr Command kQuantizeCommand = {
    "quantize", "IN.safetensors OUT.safetensors", 2, 2, kQuantizeFlags,
    "quantize every eligible tensor of IN into --format (one of `refitctl formats`); copy the rest",
    RunQuantize,
};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_QUANTIZE_COMMAND_H_
