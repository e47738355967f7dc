// Command-line parsing for refitd and refitctl on top of Abseil's flag registry.
//
// Flags are defined with ABSL_FLAG where they are used (typed values, defaults, help text and
// value parsing are Abseil's). Each program, or each refitctl subcommand, names the flags it
// accepts, and ParseFlags walks argv itself instead of absl::ParseCommandLine because:
//   - refitd's and refitctl's flags are spelled with '-' (--model-spec, --fp32-input) while an
//     Abseil flag name is an identifier (model_spec); both spellings are accepted here;
//   - a usage error must exit 2 after printing the usage and naming the offending flag, and
//     --help must exit 0 (Abseil 20220623 exits 1 for both, printing every linked flag);
//   - refitctl's subcommands accept disjoint sets of flags from one global registry.
// Accepted forms: --name=value, --name value, --name (bool: true), --name=true|false,
// --noname (bool: false). Flags and positional arguments may be interleaved; "--" ends the
// flags. --help / -h and --version are reported, not parsed as flags.
//
// Threading: call from main() before other threads read the flags.
#ifndef REFIT_COMMON_COMMAND_LINE_H_
#define REFIT_COMMON_COMMAND_LINE_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace refit::cli {

struct ParsedArgs {
  std::vector<std::string> positional;
  bool help = false;     // --help or -h was given
  bool version = false;  // --version was given
};

// Sets every flag in `args` that `accepted` names (Abseil names, with '_'). An unknown or not
// accepted flag, a missing or unparsable value is an InvalidArgument error naming the flag as
// the user spelled it.
// REQUIRES: every name in `accepted` is a defined Abseil flag.
absl::StatusOr<ParsedArgs> ParseFlags(std::span<const std::string_view> args,
                                      std::span<const std::string_view> accepted);

// "--model-spec": how a flag is spelled on the command line.
std::string Spelling(std::string_view flag_name);

// The usage synopsis of `accepted`: "[--address ADDRESS] [--json]" (bools without a value).
std::string FlagsSynopsis(std::span<const std::string_view> accepted);

// One entry per accepted flag: "  --address=ADDRESS  help text (default: ...)".
std::string FlagsHelp(std::span<const std::string_view> accepted);

}  // namespace refit::cli

#endif  // REFIT_COMMON_COMMAND_LINE_H_
