// `refitctl spec lint SPEC [--checkpoint FILE|DIR] [--model-config FILE]`: loads a model spec as
// refitd does (every error refitd would refuse it for, with its line), its sizes from the model's
// config.json (--model-config, else the checkpoint's config.json; without either the sizes it
// leaves to the model are listed), and, given a checkpoint, matches its tensor names against the
// rules and plans every tensor at its shape as refitd would: rules that match no tensor, names
// that two rules claim, and tensors the spec cannot plan (an expert beyond the stack's count, a
// tensor-parallel split or fusion that cuts a quantization block) are errors; tensors no rule
// matches take the spec's defaults and are listed, as are `refit: never` rules that match
// nothing (a trainer checkpoint need not hold what the engine keeps). Only the checkpoint's
// headers are read.
// Exit codes: 0 clean, 1 the spec does not load or does not fit the checkpoint, 2 usage.
#ifndef REFIT_TOOLS_REFITCTL_SPEC_COMMAND_H_
#define REFIT_TOOLS_REFITCTL_SPEC_COMMAND_H_

#include "refitctl/command.h"

namespace refit::refitctl {

int RunSpecLint(std::span<const std::string> args);

inline constexpr std::string_view kSpecLintFlags[] = {"checkpoint", "model_config", "json"};

inline constexpr Command kSpecLintCommand{
    "spec lint", "SPEC", 1, 1, kSpecLintFlags,
    "load a model spec as refitd would, its sizes from the model's config.json (--model-config, else the "
    "checkpoint's); with --checkpoint, report rules that match none of its tensors, tensors the spec cannot "
    "plan at their shapes, and tensors no rule matches",
    &RunSpecLint};

// `refitctl spec init [--checkpoint FILE|DIR] [--engine [--address ADDR]] [--model NAME]
// [--output FILE]`: writes a spec skeleton that `spec lint` passes against the same names. The
// names come from a checkpoint, or from the parameters of the engine registered with the
// daemon (its control plane's checksums call), or both (the checkpoint's names make the
// rules; engine parameters no checkpoint tensor names are listed in a comment: they need a
// `target:`). Numeric name components become captures ({L} the first, {E} the second, then
// {N3}...), names differing in one literal component merge into an alternation, and every
// rule reads `format: auto` for the user to change. Exit codes: 0 written, 1 unreadable
// checkpoint, unreachable daemon or no engine, a name no pattern can spell, 2 usage.
int RunSpecInit(std::span<const std::string> args);

inline constexpr std::string_view kSpecInitFlags[] = {"checkpoint", "engine", "address", "model", "output"};

inline constexpr Command kSpecInitCommand{
    "spec init", "", 0, 0, kSpecInitFlags,
    "write a model spec skeleton from a checkpoint's tensor names and/or the registered engine's parameters "
    "({L}/{E} patterns, one rule per family of names)",
    &RunSpecInit};

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_SPEC_COMMAND_H_
