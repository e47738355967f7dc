#include "demo_model.h"

#include <cmath>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"

namespace refit::demo {

std::vector<HfTensor> Tensors(const ModelShape& s) {
  const int64_t h = s.hidden, kv = s.kv_hidden, im = s.intermediate;
  std::vector<HfTensor> out = {{"model.embed_tokens.weight", {s.vocab, h}}};
  for (int l = 0; l < s.layers; ++l) {
    std::string p = absl::StrCat("model.layers.", l, ".");
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {h, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, h}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    if (s.experts > 0) {
      const int64_t mi = s.moe_intermediate;
      out.push_back({p + "mlp.gate.weight", {s.experts, h}});
      for (int e = 0; e < s.experts; ++e) {
        std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
        out.push_back({x + "gate_proj.weight", {mi, h}});
        out.push_back({x + "up_proj.weight", {mi, h}});
        out.push_back({x + "down_proj.weight", {h, mi}});
      }
      continue;
    }
    out.push_back({p + "mlp.gate_proj.weight", {im, h}});
    out.push_back({p + "mlp.up_proj.weight", {im, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, im}});
  }
  out.push_back({"model.norm.weight", {h}});
  out.push_back({"lm_head.weight", {s.vocab, h}});
  return out;
}

std::vector<uint16_t> Weights(uint64_t seed, const HfTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  // xorshift64*: fast enough for multi-GB benchmark models. Each value is the sum of two
  // uniforms on [-0.035, 0.035) (a triangular distribution of width ~0.07, sd ~0.02); norms ~1.
  uint64_t state = Checksum64(t.name.data(), t.name.size(), seed) | 1;
  auto next = [&state]() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1DULL;
  };
  const bool norm = t.shape.size() == 1;
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = next();
    float a = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    float b = static_cast<float>((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    float v = (a + b - 1.0f) * 0.035f + (norm ? 1.0f : 0.0f);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits += 0x7FFFu + ((bits >> 16) & 1u);  // RNE to bf16
    out[static_cast<size_t>(i)] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

bool ParseShapeFlag(int argc, char** argv, int& i, ModelShape& s) {
  std::string_view a = argv[i];
  int* target = a == "--layers" ? &s.layers
                : a == "--hidden" ? &s.hidden
                : a == "--intermediate" ? &s.intermediate
                : a == "--kv-hidden" ? &s.kv_hidden
                : a == "--vocab" ? &s.vocab
                : a == "--experts" ? &s.experts
                : a == "--moe-intermediate" ? &s.moe_intermediate
                                 : nullptr;
  if (target == nullptr || i + 1 >= argc) return false;
  *target = std::atoi(argv[++i]);
  return *target > 0;
}

}  // namespace refit::demo
