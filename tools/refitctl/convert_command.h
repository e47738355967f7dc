// `refitctl convert`: converts a trainer checkpoint under a model spec into the rollout
// checkpoint format, byte for byte what refitd stages for the same tensors.
#ifndef REFIT_TOOLS_REFITCTL_CONVERT_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_CONVERT_COMMAND_H_

#include <span>
#include <string_view>

#include "refitctl/command.h"

namespace refit::refitctl {

int RunConvert(std::span<const std::string> args);

inline constexpr std::string_view kConvertFlags[] = {"spec", "model_config",  "threads", "max_shard_size", "progress",
                                                     "json", "engine_layout", "tp_rank", "tp_size"};

inline constexpr Command kConvertCommand = {
    "convert",
    "IN OUT_DIR",
    2,
    2,
    kConvertFlags,
    "converts checkpoint IN (a directory of .safetensors or one file) as --spec says into OUT_DIR (the "
    "spec's sizes from --model-config, else IN's config.json), "
    "tensor by tensor on --threads workers with bounded memory: model.safetensors (HF names plus "
    "scales), or shards of --max-shard-size with model.safetensors.index.json, and the quantization "
    "metadata (config.json, hf_quant_config.json); progress on a terminal, JSON progress lines with "
    "--json; --engine-layout also writes engine.safetensors, the parameters an engine holds after "
    "refitting IN (fused, stacked, sharded, laid out, derived), of engine rank --tp-rank when given (of an engine of "
    "--tp-size ranks, needed when the spec's "
    "tensor_parallel.size is 'engine')",
    RunConvert,
};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_CONVERT_COMMAND_H_
