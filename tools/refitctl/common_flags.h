// Flags that several refitctl commands accept: --address (which refitd), --json (output) and
// --model-config (the config.json a model spec's sizes come from).
#ifndef REFIT_TOOLS_REFITCTL_COMMON_FLAGS_H_
#define REFIT_TOOLS_REFITCTL_COMMON_FLAGS_H_

#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "spec/model_config.h"

ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, model_config);

namespace refit::refitctl {

// --address, else $REFITD_ADDRESS, else unix:/run/refitd/refitd.sock.
std::string DaemonAddress();

// The model config a spec's sizes come from: --model-config, else the config.json next to the
// checkpoint at `checkpoint` (in it when a directory, beside it when a file) when there is one,
// else none. Errors name the file.
// The model config.json a checkpoint command reads: --model-config, else the config.json beside
// `checkpoint` (in its directory) when there is one; "" when neither.
std::string ModelConfigPathFor(const std::string& checkpoint);
absl::StatusOr<std::optional<spec::ModelConfig>> ModelConfigFor(const std::string& checkpoint);

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_COMMON_FLAGS_H_
