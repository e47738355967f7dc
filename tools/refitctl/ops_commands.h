// refitctl operations commands, talking to a running refitd over its control plane:
//   status   the daemon, its engine, version, active session, staging memory, last refit
//   refit    push a safetensors checkpoint (file or directory of *.safetensors) as a trainer would
//   abort    abort the active session
//   verify   compare the engine's parameters with a converted checkpoint, by checksum
//   commit TAG, rollback, versions   versions kept in staging (hold: K, docs/versions.md)
// Each takes --address ADDR (default $REFITD_ADDRESS or unix:/run/refitd/refitd.sock) and --json.
// Exit codes: 0 ok, 1 failure, 2 usage, 3 refused or mismatch, 4 nothing to abort.
#ifndef REFIT_TOOLS_REFITCTL_OPS_COMMANDS_H_
#define REFIT_TOOLS_REFITCTL_OPS_COMMANDS_H_

#include "refitctl/command.h"

namespace refit::refitctl {

inline constexpr int kExitRefused = 3;
inline constexpr int kExitNothing = 4;

int RunStatus(std::span<const std::string> args);
int RunRefit(std::span<const std::string> args);
int RunAbort(std::span<const std::string> args);
int RunVerify(std::span<const std::string> args);
int RunCommitVersion(std::span<const std::string> args);
int RunRollback(std::span<const std::string> args);
int RunVersions(std::span<const std::string> args);

inline constexpr std::string_view kStatusFlags[] = {"address", "json", "members"};
inline constexpr std::string_view kRefitFlags[] = {"address", "json", "partial", "model", "progress", "tag",
                                                    "stage_only"};
inline constexpr std::string_view kVersionsFlags[] = {"address", "json"};
inline constexpr std::string_view kAbortFlags[] = {"address", "json", "reason"};
inline constexpr std::string_view kVerifyFlags[] = {"address", "json", "strict"};

inline constexpr Command kStatusCommand{"status", "", 0, 0, kStatusFlags,
                                        "show the daemon, engine, version, active session and last refit",
                                        &RunStatus};
inline constexpr Command kRefitCommand{
    "refit", "CHECKPOINT", 1, 1, kRefitFlags,
    "push a safetensors file or directory to refitd as a trainer would, then commit", &RunRefit};
inline constexpr Command kCommitCommand{"commit", "TAG", 1, 1, kVersionsFlags,
                                        "commit the held version TAG (hold: K, a stage-only refit) into the engine",
                                        &RunCommitVersion};
inline constexpr Command kRollbackCommand{
    "rollback", "", 0, 0, kVersionsFlags,
    "commit again the version committed before the current one, while it is still staged", &RunRollback};
inline constexpr Command kVersionsCommand{"versions", "", 0, 0, kVersionsFlags,
                                          "list the held, current and previous versions in staging with their "
                                          "checksums and sizes",
                                          &RunVersions};
inline constexpr Command kAbortCommand{"abort", "", 0, 0, kAbortFlags, "abort the active refit session", &RunAbort};
inline constexpr Command kVerifyCommand{
    "verify", "CONVERTED", 1, 1, kVerifyFlags,
    "compare the engine's parameters with a converted checkpoint (checksums)", &RunVerify};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_OPS_COMMANDS_H_
