// The model spec of the demo model (a small Llama-shaped model): FP8 block-128 for attention and
// MLP projections, everything else as the engine holds it. refitd's embedded default config uses
// it; tools/demo and the integration tests run against it.
#ifndef REFIT_SPEC_DEMO_SPEC_H_
#define REFIT_SPEC_DEMO_SPEC_H_

namespace refit::spec {

inline constexpr char kDemoModelSpec[] = R"(model: demo-llama
defaults:
  format: auto
rules:
  - match: "model.layers.{L}.self_attn.{q,k,v,o}_proj.weight"
    format: fp8_block128
  - match: "model.layers.{L}.mlp.{gate,up,down}_proj.weight"
    format: fp8_block128
groups:
  - name: qkv
    members: ["model.layers.{L}.self_attn.q_proj.weight", "model.layers.{L}.self_attn.k_proj.weight",
              "model.layers.{L}.self_attn.v_proj.weight"]
  - name: gate_up
    members: ["model.layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.up_proj.weight"]
)";

}  // namespace refit::spec

#endif  // REFIT_SPEC_DEMO_SPEC_H_
