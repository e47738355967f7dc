// `refitctl formats`: the checkpoint formats this build converts to, one line each, from the
// format table (formats/format_info.h): the names --format, specs' `format:` and the golden and
// docs completeness test (tests/golden/format_lists.py) take as the list of formats.
#ifndef REFIT_TOOLS_REFITCTL_FORMATS_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_FORMATS_COMMAND_H_

#include "refitctl/command.h"

namespace refit::refitctl {

int RunFormats(std::span<const std::string> args);

inline constexpr std::string_view kFormatsFlags[] = {"json"};

inline constexpr Command kFormatsCommand = {
    "formats", "", 0, 0, kFormatsFlags,
    "list the output formats (name, quantized or cast, scale block, emitted tensors); --json for a machine-readable list",
    RunFormats,
};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_FORMATS_COMMAND_H_
