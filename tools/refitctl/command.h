// A refitctl subcommand: its name, one line of help and an entry point. The dispatch table in
// main.cc lists every subcommand explicitly.
// Exit codes: 0 success, 1 failure (message on stderr), 2 usage error.
#ifndef REFIT_TOOLS_REFITCTL_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_COMMAND_H_

#include <span>
#include <string_view>

namespace refit::refitctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct Command {
  std::string_view name;
  std::string_view usage;  // arguments after the name
  std::string_view help;
  // `args` excludes the program and subcommand names.
  int (*run)(std::span<const std::string_view> args);
};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_COMMAND_H_
