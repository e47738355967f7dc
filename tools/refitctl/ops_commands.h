// refitctl operations commands, talking to a running refitd over its control plane:
//   status   the daemon, its engine, version, active session, staging memory, last refit
//   refit    push a safetensors checkpoint (file or directory of *.safetensors) as a trainer would
//   abort    abort the active session
//   verify   compare the engine's parameters with a converted checkpoint, by checksum
// Each takes --address ADDR (default $REFITD_ADDRESS or unix:/run/refitd/refitd.sock) and --json.
// Exit codes: 0 ok, 1 failure, 2 usage, 3 refused or mismatch, 4 nothing to abort.
#ifndef REFIT_TOOLS_REFITCTL_OPS_COMMANDS_H_
#define REFIT_TOOLS_REFITCTL_OPS_COMMANDS_H_

#include "refitctl/command.h"

namespace refit::refitctl {

inline constexpr int kExitRefused = 3;
inline constexpr int kExitNothing = 4;

int RunStatus(std::span<const std::string_view> args);
int RunRefit(std::span<const std::string_view> args);
int RunAbort(std::span<const std::string_view> args);
int RunVerify(std::span<const std::string_view> args);

inline constexpr Command kStatusCommand{"status", "[--address ADDR] [--json]",
                                        "show the daemon, engine, version, active session and last refit",
                                        &RunStatus};
inline constexpr Command kRefitCommand{
    "refit", "[--address ADDR] [--json] [--partial] [--model NAME] CHECKPOINT",
    "push a safetensors file or directory to refitd as a trainer would, then commit", &RunRefit};
inline constexpr Command kAbortCommand{"abort", "[--address ADDR] [--json] [--reason TEXT]",
                                       "abort the active refit session", &RunAbort};
inline constexpr Command kVerifyCommand{
    "verify", "[--address ADDR] [--json] [--strict] CONVERTED",
    "compare the engine's parameters with a converted checkpoint (checksums)", &RunVerify};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_OPS_COMMANDS_H_
