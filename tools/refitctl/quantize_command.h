// `refitctl quantize`: converts a safetensors file to one checkpoint format.
#ifndef REFIT_TOOLS_REFITCTL_QUANTIZE_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_QUANTIZE_COMMAND_H_

#include "refitctl/command.h"

namespace refit::refitctl {

int RunQuantize(std::span<const std::string_view> args);

inline constexpr Command kQuantizeCommand = {
    "quantize",
    "--format F [--fp32-input exact|round_to_bf16] [--nonfinite reject|propagate] "
    "IN.safetensors OUT.safetensors",
    "quantize every eligible tensor of IN into format F (bf16, fp16, fp32, fp8_block128, "
    "fp8_block128_ue8m0, mxfp8, nvfp4, nvfp4_te, mxfp4); copy the rest",
    RunQuantize,
};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_QUANTIZE_COMMAND_H_
