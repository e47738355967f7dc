// `refitctl version` (and `refitctl --version`): this refitctl's version, and the version of the
// refitd at --address (DaemonStatus.daemonVersion/daemonCommit), or that it does not answer
// (exit 1, the client's version still printed).
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
    "show refitctl's version and the version of the daemon at --address (exit 1 if it does not answer)", &RunVersion};

// `refitctl help [COMMAND]`: handled by main.cc (no flags, no entry point).
inline constexpr Command kHelpCommand{"help", "[COMMAND]", 0, 2, {}, "show the commands, or one command's flags",
                                      nullptr};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_VERSION_COMMAND_H_
