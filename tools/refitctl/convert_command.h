// `refitctl convert`: converts a trainer checkpoint under a model spec into the rollout
// checkpoint format, byte for byte what refitd stages for the same tensors.
#ifndef REFIT_TOOLS_REFITCTL_CONVERT_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_CONVERT_COMMAND_H_

#include <span>
#include <string_view>

#include "refitctl/command.h"

namespace refit::refitctl {

int RunConvert(std::span<const std::string_view> args);

inline constexpr Command kConvertCommand = {
    "convert",
    "--spec SPEC.yaml [--engine-layout] IN OUT_DIR",
    "converts checkpoint IN (a directory of .safetensors or one file) as SPEC says into OUT_DIR: "
    "model.safetensors (HF names plus scales) and the quantization metadata (config.json, "
    "hf_quant_config.json); --engine-layout also writes engine.safetensors, the parameters an "
    "engine holds after refitting IN (fused, stacked, sharded, laid out, derived)",
    RunConvert,
};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_CONVERT_COMMAND_H_
