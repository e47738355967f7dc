// `refitctl version` (and `refitctl --version`): this refitctl's version, and whether the refitd
// at --address answers. The control plane's DaemonStatus carries no daemon build version yet;
// the daemon's admin endpoint serves it at GET /version.
#ifndef REFIT_TOOLS_REFITCTL_VERSION_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_VERSION_COMMAND_H_

#include "refitctl/command.h"

namespace refit::refitctl {

int RunVersion(std::span<const std::string> args);
// Prints the client version line only; returns kExitOk.
int RunVersionLine();

inline constexpr std::string_view kVersionFlags[] = {"address", "json"};

inline constexpr Command kVersionCommand{
    "version", "", 0, 0, kVersionFlags,
    "show refitctl's version and whether the daemon at --address is reachable (exit 1 if not)", &RunVersion};

// `refitctl help [COMMAND]`: handled by main.cc (no flags, no entry point).
inline constexpr Command kHelpCommand{"help", "[COMMAND]", 0, 2, {}, "show the commands, or one command's flags",
                                      nullptr};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_VERSION_COMMAND_H_
