// Derived engine parameters (spec `derived:` entries) as pure functions of their sources'
// staged checkpoint-format values: the dtype and shape each op gives, and its bytes. The
// committer (online) and the offline engine layout both call these, so a derived parameter is
// always recomputed from staged data, never from what the engine holds (invariant 4).
// Ops: add_one (Gemma norm), layout (a laid-out copy, e.g. the TRT-LLM shuffled MoE weights
// beside the checkpoint-layout ones), mla_w_kc / mla_w_vc (SGLang's absorbed MLA weights from a
// BF16 or block-FP8 kv_b_proj, formats/mla_absorb.h).
// Thread-safe: pure functions.
#ifndef REFIT_REFIT_DERIVED_BUILD_H_
#define REFIT_REFIT_DERIVED_BUILD_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "refit/param_build.h"
#include "spec/model_spec.h"

namespace refit {

struct DerivedSource {
  DType dtype;
  Shape shape;
};

// The dtype and shape of derived parameter `name` computed by `d` from a source of `from`
// (and, for an FP8 kv_b_proj, its block scales `scale`). InvalidArgument naming `name` and the
// reason when the sources cannot give it.
absl::StatusOr<std::pair<DType, Shape>> DerivedShape(const spec::Derived& d, const std::string& name,
                                                     const DerivedSource& from,
                                                     const std::optional<DerivedSource>& scale);

// Its bytes. `scale` is required exactly when `d` names one.
absl::StatusOr<Built> BuildDerived(const spec::Derived& d, const std::string& name, const Built& from,
                                   const Built* scale);

}  // namespace refit

#endif  // REFIT_REFIT_DERIVED_BUILD_H_
