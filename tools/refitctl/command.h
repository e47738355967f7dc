// A refitctl subcommand: its name, arguments, the flags it accepts, one line of help and an
// entry point. The dispatch table in main.cc lists every subcommand explicitly.
//
// Flags are Abseil flags (ABSL_FLAG in the file of the command that reads them; shared ones in
// common_flags.h), parsed by main.cc with src/common/command_line.h against `flags` before
// `run` is called, so `run` reads them with absl::GetFlag and gets only the positional
// arguments, already counted against min_args/max_args.
// Exit codes: 0 success, 1 failure (message on stderr), 2 usage error (usage on stderr).
#ifndef REFIT_TOOLS_REFITCTL_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_COMMAND_H_

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace refit::refitctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct Command {
  std::string_view name;       // "status", or two words: "spec lint"
  std::string_view arguments;  // positional arguments after the flags, e.g. "IN OUT_DIR"
  size_t min_args = 0;
  size_t max_args = 0;
  std::span<const std::string_view> flags;  // Abseil flag names (with '_') this command accepts
  std::string_view help;
  int (*run)(std::span<const std::string> args) = nullptr;
};

// "usage: refitctl NAME [flags] ARGUMENTS\n"
std::string CommandUsage(const Command& command);

// Prints "refitctl NAME: problem" and the command's usage to stderr; returns kExitUsage.
int UsageError(const Command& command, std::string_view problem);

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_COMMAND_H_
