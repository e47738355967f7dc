// `refitctl spec lint SPEC [--checkpoint FILE|DIR]`: loads a model spec as refitd does (every
// error refitd would refuse it for, with its line), and, given a checkpoint, matches its tensor
// names against the rules: rules that match no tensor and names that two rules claim are
// errors; tensors no rule matches take the spec's defaults and are listed.
// Exit codes: 0 clean, 1 the spec does not load or does not fit the checkpoint, 2 usage.
#ifndef REFIT_TOOLS_REFITCTL_SPEC_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_SPEC_COMMAND_H_

#include "refitctl/command.h"

namespace refit::refitctl {

int RunSpecLint(std::span<const std::string> args);

inline constexpr std::string_view kSpecLintFlags[] = {"checkpoint", "json"};

inline constexpr Command kSpecLintCommand{
    "spec lint", "SPEC", 1, 1, kSpecLintFlags,
    "load a model spec as refitd would; with --checkpoint, report rules that match none of its tensors "
    "and tensors no rule matches",
    &RunSpecLint};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_SPEC_COMMAND_H_
