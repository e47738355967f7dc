// The spec the committer and placement tests share: gate/up fused into one MXFP8 parameter whose
// scales are swizzled (a layout step), and a norm with a derived gemma_weight (add_one).
#ifndef REFIT_TESTS_UNIT_REFIT_FUSED_MXFP8_SPEC_H_
#define REFIT_TESTS_UNIT_REFIT_FUSED_MXFP8_SPEC_H_

namespace refit::testing {

inline constexpr char kFusedMxfp8Spec[] = R"(model: m
rules:
  - match: "l.{p:gate,up}_proj.weight"
    target: "l.gate_up_proj.weight"
    format: mxfp8
    fuse: {capture: p, order: [gate, up]}
    layout:
      - {op: swizzle_128x4, on: _scale_inv}
  - match: "l.norm.weight"
    partial: true
derived:
  - {target: "l.norm.gemma_weight", from: "l.norm.weight", op: add_one}
)";

}  // namespace refit::testing

#endif  // REFIT_TESTS_UNIT_REFIT_FUSED_MXFP8_SPEC_H_
