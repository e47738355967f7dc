#include "refit/megatron_source.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace refit {
namespace {

// What a refusal for a size the spec left to the model says (spec/model_config.h).
constexpr char kFromModelConfig[] =
    " (the model's config.json gives it: set refitd's model_config, or state it in the spec's source)";

enum class Kind : uint8_t {
  kRename, kQkv, kFc1, kVocab, kQkvDown, kOssFc1, kOssFc1Bias, kOssFc2, kOssFc2Bias, kGdnInProj, kGdnConv
};

struct Mapped {
  Kind kind = Kind::kRename;
  std::string target;  // kRename, kVocab, kOss*, kGdnConv: the checkpoint name; kQkv, kFc1, kQkvDown, kGdnInProj: the prefix before "{q,k,v}_proj." / "{gate,up}_proj." / "q_a_proj" / "in_proj_{qkvz,ba}"
  std::string suffix;  // kQkv, kFc1: "weight" or "bias"
  int64_t expert = 0;  // kOss*: the global expert
};

// "12." at the front of `rest` -> 12, consumed.
bool ConsumeIndex(absl::string_view& rest, int64_t& index) {
  size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || dot == 0) return false;
  if (!absl::SimpleAtoi(rest.substr(0, dot), &index) || index < 0) return false;
  rest.remove_prefix(dot + 1);
  return true;
}

// An expert tensor `rest` (after "mlp.experts."): SequentialMLP "local_experts.{E}.linear_fc{1,2}.{weight,bias}"
// or grouped-GEMM "linear_fc{1,2}.{weight,bias}{E}" -> fc, param ("weight" / "bias"), expert.
bool ParseExpert(absl::string_view rest, int& fc, std::string& param, int64_t& expert) {
  absl::string_view e = rest;
  if (absl::ConsumePrefix(&e, "local_experts.")) {
    if (!ConsumeIndex(e, expert)) return false;
    for (int f : {1, 2}) {
      for (const char* w : {"weight", "bias"}) {
        if (e == absl::StrCat("linear_fc", f, ".", w)) {
          fc = f;
          param = w;
          return true;
        }
      }
    }
    return false;
  }
  for (int f : {1, 2}) {
    for (const char* w : {"weight", "bias"}) {
      absl::string_view g = e;
      if (absl::ConsumePrefix(&g, absl::StrCat("linear_fc", f, ".", w)) && !g.empty() &&
          absl::SimpleAtoi(g, &expert) && expert >= 0) {
        fc = f;
        param = w;
        return true;
      }
    }
  }
  return false;
}

absl::Status Unknown(absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name),
                                                 "': no checkpoint name for this Megatron-core tensor "
                                                 "(source layout megatron)"));
}

// A transformer layer's tensor `rest` (after "decoder.layers.{L}." or an MTP layer's
// "mtp.layers.{N}.transformer_layer.") -> its mapping, checkpoint names prefixed by `p`.
absl::StatusOr<std::optional<Mapped>> ParseLayer(const spec::MegatronSource& m, absl::string_view name,
                                                 const std::string& p, absl::string_view rest) {
  auto unknown = [&] { return Unknown(name); };
  auto rename = [&](absl::string_view to) { return Mapped{Kind::kRename, absl::StrCat(p, std::string(to)), "", 0}; };
  const bool mla = m.attention == spec::MegatronSource::Attention::kMla;
  const bool gated = m.attention == spec::MegatronSource::Attention::kGated;
  const bool oss = m.experts == spec::MegatronSource::Experts::kGptOss;
  if (gated) {
    // Gated delta-net (megatron/core/ssm/gated_delta_net.py) -> HF linear_attn.*.
    if (rest == "self_attention.in_proj.layer_norm_weight") return rename("input_layernorm.weight");
    if (rest == "self_attention.in_proj.weight") return Mapped{Kind::kGdnInProj, p + "linear_attn.", "", 0};
    if (rest == "self_attention.conv1d.weight") return Mapped{Kind::kGdnConv, p + "linear_attn.conv1d.weight", "", 0};
    if (rest == "self_attention.A_log") return rename("linear_attn.A_log");
    if (rest == "self_attention.dt_bias") return rename("linear_attn.dt_bias");
    if (rest == "self_attention.out_proj.weight") return rename("linear_attn.out_proj.weight");
    if (rest == "self_attention.out_norm.weight") {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", std::string(name), "': not mapped: Megatron-core's zero-centred out_norm holds the checkpoint's ",
          p, "linear_attn.norm.weight minus 1 (the checkpoint's gated norm is a plain RMSNorm); push that tensor "
          "under its checkpoint name, as out_norm.weight + 1"));
    }
  }
  if (rest == "self_attention.linear_qkv.layer_norm_weight" || rest == "input_layernorm.weight") {
    return rename("input_layernorm.weight");
  }
  if (mla) {
    // The layer norm a TE projection fuses is the one before it.
    if (rest == "self_attention.linear_q_down_proj.layer_norm_weight" ||
        rest == "self_attention.linear_kv_down_proj.layer_norm_weight" ||
        rest == "self_attention.linear_qkv_down_proj.layer_norm_weight" ||
        rest == "self_attention.linear_q_proj.layer_norm_weight") {
      return rename("input_layernorm.weight");
    }
    if (rest == "self_attention.linear_q_down_proj.weight") return rename("self_attn.q_a_proj.weight");
    if (rest == "self_attention.linear_q_up_proj.weight") return rename("self_attn.q_b_proj.weight");
    if (rest == "self_attention.linear_q_proj.weight") return rename("self_attn.q_proj.weight");
    if (rest == "self_attention.linear_kv_down_proj.weight") return rename("self_attn.kv_a_proj_with_mqa.weight");
    if (rest == "self_attention.linear_kv_up_proj.weight") return rename("self_attn.kv_b_proj.weight");
    if (rest == "self_attention.linear_qkv_down_proj.weight") return Mapped{Kind::kQkvDown, p + "self_attn.", "", 0};
    if (rest == "self_attention.linear_q_up_proj.layer_norm_weight" || rest == "self_attention.q_layernorm.weight") {
      return rename("self_attn.q_a_layernorm.weight");
    }
    if (rest == "self_attention.linear_kv_up_proj.layer_norm_weight" || rest == "self_attention.kv_layernorm.weight") {
      return rename("self_attn.kv_a_layernorm.weight");
    }
  } else {
    if (rest == "self_attention.linear_qkv.weight") return Mapped{Kind::kQkv, p + "self_attn.", "weight", 0};
    if (rest == "self_attention.linear_qkv.bias") return Mapped{Kind::kQkv, p + "self_attn.", "bias", 0};
    if (rest == "self_attention.q_layernorm.weight") return rename("self_attn.q_norm.weight");
    if (rest == "self_attention.k_layernorm.weight") return rename("self_attn.k_norm.weight");
  }
  if (rest == "self_attention.linear_proj.weight") return rename("self_attn.o_proj.weight");
  if (rest == "self_attention.linear_proj.bias") return rename("self_attn.o_proj.bias");
  if (rest == "self_attention.core_attention.softmax_offset") return rename("self_attn.sinks");
  if (rest == "mlp.linear_fc1.layer_norm_weight" || rest == "pre_mlp_layernorm.weight") {
    return rename("post_attention_layernorm.weight");
  }
  if (rest == "mlp.linear_fc1.weight") return Mapped{Kind::kFc1, p + "mlp.", "weight", 0};
  if (rest == "mlp.linear_fc2.weight") return rename("mlp.down_proj.weight");
  // Qwen3-Next / Qwen3.5 name the shared expert mlp.shared_expert, with its sigmoid gate beside it.
  const std::string shared = gated ? "mlp.shared_expert." : "mlp.shared_experts.";
  if (rest == "mlp.shared_experts.linear_fc1.weight") return Mapped{Kind::kFc1, p + shared, "weight", 0};
  if (rest == "mlp.shared_experts.linear_fc2.weight") return rename(shared + "down_proj.weight");
  if (gated && rest == "mlp.shared_experts.gate_weight") return rename("mlp.shared_expert_gate.weight");
  if (oss) {
    if (rest == "mlp.router.weight") return rename("mlp.router.weight");
    if (rest == "mlp.router.bias") return rename("mlp.router.bias");
  } else {
    if (rest == "mlp.router.weight") return rename("mlp.gate.weight");
    if (rest == "mlp.router.expert_bias") return rename("mlp.gate.e_score_correction_bias");
  }
  absl::string_view e = rest;
  int fc = 0;
  std::string param;
  int64_t expert = 0;
  if (!absl::ConsumePrefix(&e, "mlp.experts.") || !ParseExpert(e, fc, param, expert)) return unknown();
  if (oss) {
    if (m.num_experts == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name),
                                                     "': gpt-oss experts need source.num_experts", kFromModelConfig));
    }
    if (expert >= m.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name), "': expert ", expert,
                                                     " of source.num_experts ", m.num_experts));
    }
    const std::string base = p + (fc == 1 ? "mlp.experts.gate_up_proj" : "mlp.experts.down_proj");
    if (param == "weight") return Mapped{fc == 1 ? Kind::kOssFc1 : Kind::kOssFc2, base, "", expert};
    return Mapped{fc == 1 ? Kind::kOssFc1Bias : Kind::kOssFc2Bias, base + "_bias", "", expert};
  }
  if (param != "weight") return unknown();
  const std::string ep = absl::StrCat(p, "mlp.experts.", expert, ".");
  if (fc == 1) return Mapped{Kind::kFc1, ep, "weight", 0};
  return Mapped{Kind::kRename, ep + "down_proj.weight", "", 0};
}

// The checkpoint mapping of a Megatron-core name; nullopt: not one; error: a Megatron name
// refitd has no mapping for.
absl::StatusOr<std::optional<Mapped>> Parse(const spec::MegatronSource& m, absl::string_view name) {
  while (absl::ConsumePrefix(&name, "module.")) {
  }
  if (name == "embedding.word_embeddings.weight") return Mapped{Kind::kVocab, "model.embed_tokens.weight", "", 0};
  if (name == "output_layer.weight") return Mapped{Kind::kVocab, "lm_head.weight", "", 0};
  if (name == "decoder.final_layernorm.weight") return Mapped{Kind::kRename, "model.norm.weight", "", 0};
  absl::string_view rest = name;
  int64_t layer = 0;
  if (m.attention == spec::MegatronSource::Attention::kGated && absl::ConsumePrefix(&rest, "mtp.layers.")) {
    // Multi-token prediction (megatron/core/transformer/multi_token_prediction.py): the HF
    // checkpoint's one MTP layer is mtp.fc / mtp.pre_fc_norm_* / mtp.norm around mtp.layers.0.*.
    // Other mtp.* names are the checkpoint's own.
    if (!ConsumeIndex(rest, layer)) return std::optional<Mapped>();
    const std::pair<const char*, const char*> own[] = {{"eh_proj.weight", "mtp.fc.weight"},
                                                       {"enorm.weight", "mtp.pre_fc_norm_embedding.weight"},
                                                       {"hnorm.weight", "mtp.pre_fc_norm_hidden.weight"},
                                                       {"final_layernorm.weight", "mtp.norm.weight"}};
    for (const auto& [from, to] : own) {
      if (rest != from) continue;
      if (layer != 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name),
                                                       "': not mapped: the checkpoint has one MTP layer (", to, ")"));
      }
      return Mapped{Kind::kRename, to, "", 0};
    }
    if (!absl::ConsumePrefix(&rest, "transformer_layer.")) return std::optional<Mapped>();
    return ParseLayer(m, name, absl::StrCat("mtp.layers.", layer, "."), rest);
  }
  if (!absl::StartsWith(name, "embedding.") && !absl::StartsWith(name, "decoder.") &&
      !absl::StartsWith(name, "output_layer.")) {
    return std::optional<Mapped>();
  }
  if (!absl::ConsumePrefix(&rest, "decoder.layers.") || !ConsumeIndex(rest, layer)) return Unknown(name);
  return ParseLayer(m, name, absl::StrCat("model.layers.", layer, "."), rest);
}

struct Rows {
  uint64_t start = 0, count = 0, full = 0;  // along dim 0
  uint64_t row_bytes = 0;
  Shape inner;  // the dims after dim 0
};

absl::StatusOr<Rows> RowsOf(const TensorDesc& in) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", in.name, "': ", why));
  };
  if (in.shape.empty()) return bad("a Megatron-core tensor of rank 0");
  if (in.slice.present() && in.slice.dim != 0) {
    return bad(absl::StrCat("Megatron-core shards this tensor along dimension 0, not ", in.slice.dim));
  }
  if (in.slice.present() && in.slice.full_shape.size() != in.shape.size()) {
    return bad(absl::StrCat("slice of shape ", ShapeString(in.shape), " and full shape ", ShapeString(in.slice.full_shape),
                            " differ in rank"));
  }
  Rows r;
  r.count = static_cast<uint64_t>(in.shape[0]);
  r.start = in.slice.present() ? in.slice.start : 0;
  r.full = in.slice.present() ? static_cast<uint64_t>(in.slice.full_shape[0]) : r.count;
  if (r.count == 0 || r.start > r.full || r.count > r.full - r.start) {
    return bad(absl::StrCat("rows [", r.start, ", ", r.start + r.count, ") lie outside its ", r.full, " rows"));
  }
  r.inner.assign(in.shape.begin() + 1, in.shape.end());
  r.row_bytes = DTypeSize(in.dtype);
  for (int64_t d : r.inner) r.row_bytes *= static_cast<uint64_t>(d);
  return r;
}

// Rows [start, start + count) of checkpoint tensor `name` of `full` rows, at source row `from`.
SourcePiece Piece(const TensorDesc& in, const Rows& r, std::string name, uint64_t start, uint64_t count,
                  uint64_t full, uint64_t from) {
  SourcePiece p;
  p.desc.name = std::move(name);
  p.desc.dtype = in.dtype;
  p.desc.shape.push_back(static_cast<int64_t>(count));
  p.desc.shape.insert(p.desc.shape.end(), r.inner.begin(), r.inner.end());
  p.desc.nbytes = count * r.row_bytes;
  if (start != 0 || count != full) {
    p.desc.slice.dim = 0;
    p.desc.slice.start = start;
    p.desc.slice.full_shape = p.desc.shape;
    p.desc.slice.full_shape[0] = static_cast<int64_t>(full);
  }
  p.src_offset = from * r.row_bytes;
  return p;
}

// gpt-oss: expert e's Megatron-core linear_fc1 ([gate; up] rows, [2I, H]) / linear_fc2 ([H, I])
// weight or bias -> entry e of the checkpoint's stacked [E, in, out] tensor, reordered.
absl::StatusOr<std::optional<std::vector<SourcePiece>>> OssExpert(const spec::MegatronSource& m, const TensorDesc& in,
                                                                  const Mapped& mp) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", in.name, "': ", why));
  };
  if (in.slice.present()) {
    return bad("gpt-oss experts are pushed whole (expert tensor-parallel size 1): the stacked checkpoint tensor "
               "holds a tensor-parallel shard of an expert in two dimensions");
  }
  const bool weight = mp.kind == Kind::kOssFc1 || mp.kind == Kind::kOssFc2;
  if (in.shape.size() != (weight ? 2u : 1u)) {
    return bad(absl::StrCat("a gpt-oss expert ", weight ? "weight" : "bias", " of shape ", ShapeString(in.shape)));
  }
  SourcePiece p;
  p.desc.name = mp.target;
  p.desc.dtype = in.dtype;
  p.desc.nbytes = in.nbytes;
  p.rows = static_cast<uint64_t>(in.shape[0]);
  p.cols = weight ? static_cast<uint64_t>(in.shape[1]) : 1;
  const bool fc1 = mp.kind == Kind::kOssFc1 || mp.kind == Kind::kOssFc1Bias;
  if (fc1 && p.rows % 2 != 0) return bad(absl::StrCat(p.rows, " rows: not [gate; up] halves"));
  switch (mp.kind) {
    case Kind::kOssFc1:
      p.reorder = Reorder::kGluInterleaveT;
      p.desc.shape = {1, in.shape[1], in.shape[0]};
      break;
    case Kind::kOssFc2:
      p.reorder = Reorder::kTranspose;
      p.desc.shape = {1, in.shape[1], in.shape[0]};
      break;
    case Kind::kOssFc1Bias:
      p.reorder = Reorder::kGluInterleave;
      p.desc.shape = {1, in.shape[0]};
      break;
    default:
      p.desc.shape = {1, in.shape[0]};
      break;
  }
  p.desc.slice.dim = 0;
  p.desc.slice.start = static_cast<uint64_t>(mp.expert);
  p.desc.slice.full_shape = p.desc.shape;
  p.desc.slice.full_shape[0] = m.num_experts;
  std::vector<SourcePiece> out;
  out.push_back(std::move(p));
  return std::optional<std::vector<SourcePiece>>(std::move(out));
}

// A gated delta-net's in_proj or conv1d weight, one whole TP shard (megatron/core/ssm/
// gated_delta_net.py): TP rank t of tp holds key heads [t * nk / tp, ...) and value heads
// [t * nv / tp, ...); its in_proj rows are [q; k; v; z; b; a] of those heads (q, k: key_head_dim
// per key head; v, z: value_head_dim per value head; b, a: one per value head), its conv1d
// channels [q; k; v]. The checkpoint (HF Qwen3-Next) groups in_proj_qkvz per key head as
// [q; k; v; z] of that head and its nv / nk value heads, in_proj_ba per key head as [b; a] of its
// value heads; conv1d.weight is [q; k; v] of all heads.
absl::StatusOr<std::optional<std::vector<SourcePiece>>> GdnPieces(const spec::MegatronSource& m, const TensorDesc& in,
                                                                  const Rows& r, const Mapped& mp) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", in.name, "': ", why));
  };
  if (m.linear_num_key_heads <= 0 || m.linear_key_head_dim <= 0 || m.linear_num_value_heads <= 0 ||
      m.linear_value_head_dim <= 0) {
    return bad(absl::StrCat("a gated delta-net in_proj / conv1d needs source.linear_num_key_heads, linear_key_head_dim, "
                            "linear_num_value_heads and linear_value_head_dim",
                            kFromModelConfig));
  }
  const uint64_t nk = static_cast<uint64_t>(m.linear_num_key_heads), dk = static_cast<uint64_t>(m.linear_key_head_dim);
  const uint64_t nv = static_cast<uint64_t>(m.linear_num_value_heads),
                 dv = static_cast<uint64_t>(m.linear_value_head_dim);
  const bool conv = mp.kind == Kind::kGdnConv;
  const uint64_t qk = nk * dk, vd = nv * dv;
  const uint64_t total = conv ? 2 * qk + vd : 2 * qk + 2 * vd + 2 * nv;
  if (r.full != total) {
    return bad(absl::StrCat(r.full, " rows in all, but ", nk, " key heads of ", dk, " and ", nv, " value heads of ",
                            dv, " (source section) make ", total));
  }
  if (r.full % r.count != 0 || r.start % r.count != 0) {
    return bad(absl::StrCat("rows [", r.start, ", ", r.start + r.count, ") of ", r.full,
                            " are not one of equal tensor-parallel shards (each holds its heads' parts of all)"));
  }
  const uint64_t tp = r.full / r.count, t = r.start / r.count;
  if (nk % tp != 0 || nv % tp != 0) {
    return bad(absl::StrCat(tp, " tensor-parallel shards of ", nk, " key and ", nv, " value heads"));
  }
  const uint64_t nkl = nk / tp, nvl = nv / tp, ratio = nv / nk;
  std::vector<SourcePiece> out;
  if (conv) {
    out.push_back(Piece(in, r, mp.target, t * nkl * dk, nkl * dk, total, 0));
    out.push_back(Piece(in, r, mp.target, qk + t * nkl * dk, nkl * dk, total, nkl * dk));
    out.push_back(Piece(in, r, mp.target, 2 * qk + t * nvl * dv, nvl * dv, total, 2 * nkl * dk));
    return std::optional<std::vector<SourcePiece>>(std::move(out));
  }
  const uint64_t per_head = 2 * dk + 2 * ratio * dv;  // in_proj_qkvz rows of one key head
  const uint64_t lk = nkl * dk, lv = 2 * nkl * dk, lz = lv + nvl * dv, lb = lz + nvl * dv, la = lb + nvl;
  const std::string qkvz = mp.target + "in_proj_qkvz.weight", ba = mp.target + "in_proj_ba.weight";
  for (uint64_t i = 0; i < nkl; ++i) {
    const uint64_t h = t * nkl + i;
    out.push_back(Piece(in, r, qkvz, h * per_head, dk, nk * per_head, i * dk));
    out.push_back(Piece(in, r, qkvz, h * per_head + dk, dk, nk * per_head, lk + i * dk));
    out.push_back(Piece(in, r, qkvz, h * per_head + 2 * dk, ratio * dv, nk * per_head, lv + i * ratio * dv));
    out.push_back(Piece(in, r, qkvz, h * per_head + 2 * dk + ratio * dv, ratio * dv, nk * per_head, lz + i * ratio * dv));
    out.push_back(Piece(in, r, ba, h * 2 * ratio, ratio, 2 * nv, lb + i * ratio));
    out.push_back(Piece(in, r, ba, h * 2 * ratio + ratio, ratio, 2 * nv, la + i * ratio));
  }
  return std::optional<std::vector<SourcePiece>>(std::move(out));
}

}  // namespace

void ReorderPiece(const SourcePiece& p, const uint8_t* src, uint8_t* dst) {
  const size_t es = DTypeSize(p.desc.dtype);
  const uint64_t rows = p.rows, cols = p.cols;
  switch (p.reorder) {
    case Reorder::kNone:
      std::memcpy(dst, src, p.desc.nbytes);
      return;
    case Reorder::kTranspose:
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t c = 0; c < cols; ++c) std::memcpy(dst + (c * rows + r) * es, src + (r * cols + c) * es, es);
      }
      return;
    case Reorder::kGluInterleaveT: {
      const uint64_t half = rows / 2;
      for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t out_col = r < half ? 2 * r : 2 * (r - half) + 1;
        for (uint64_t c = 0; c < cols; ++c) std::memcpy(dst + (c * rows + out_col) * es, src + (r * cols + c) * es, es);
      }
      return;
    }
    case Reorder::kGluInterleave: {
      const uint64_t half = rows / 2;
      for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t at = r < half ? 2 * r : 2 * (r - half) + 1;
        std::memcpy(dst + at * es, src + r * es, es);
      }
      return;
    }
  }
}

absl::StatusOr<std::optional<std::vector<SourcePiece>>> MapMegatron(const spec::MegatronSource& m,
                                                                      const TensorDesc& in) {
  absl::StatusOr<std::optional<Mapped>> parsed = Parse(m, in.name);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_value()) return std::optional<std::vector<SourcePiece>>();
  const Mapped& mp = **parsed;
  std::vector<SourcePiece> out;
  if (mp.kind == Kind::kRename) {
    SourcePiece p{in, 0};
    p.desc.name = mp.target;
    p.desc.offset = 0;
    out.push_back(std::move(p));
    return std::optional<std::vector<SourcePiece>>(std::move(out));
  }
  if (mp.kind == Kind::kOssFc1 || mp.kind == Kind::kOssFc1Bias || mp.kind == Kind::kOssFc2 ||
      mp.kind == Kind::kOssFc2Bias) {
    return OssExpert(m, in, mp);
  }
  absl::StatusOr<Rows> rows = RowsOf(in);
  if (!rows.ok()) return rows.status();
  const Rows& r = *rows;
  const uint64_t end = r.start + r.count;
  if (mp.kind == Kind::kQkvDown) {
    // MLA's fused down projection: rows [q_a_proj (q_lora_rank); kv_a_proj_with_mqa].
    const uint64_t q = static_cast<uint64_t>(m.q_lora_rank);
    if (q == 0 || q >= r.full) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", in.name, "': a fused linear_qkv_down_proj of ", r.full,
          " rows needs source.q_lora_rank (the q_a_proj rows at its front) below that",
          q == 0 ? kFromModelConfig : ""));
    }
    const std::pair<const char*, std::pair<uint64_t, uint64_t>> parts[] = {{"q_a_proj.weight", {0, q}},
                                                                           {"kv_a_proj_with_mqa.weight", {q, r.full}}};
    for (const auto& [proj, range] : parts) {
      const uint64_t lo = std::max(r.start, range.first), hi = std::min(end, range.second);
      if (lo >= hi) continue;
      out.push_back(Piece(in, r, mp.target + proj, lo - range.first, hi - lo, range.second - range.first, lo - r.start));
    }
    return std::optional<std::vector<SourcePiece>>(std::move(out));
  }
  if (mp.kind == Kind::kVocab) {
    const uint64_t vocab = m.vocab_size > 0 ? static_cast<uint64_t>(m.vocab_size) : r.full;
    if (r.full < vocab) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", in.name, "': ", r.full,
                                                     " vocabulary rows, fewer than source.vocab_size ", vocab));
    }
    if (r.start < vocab) out.push_back(Piece(in, r, mp.target, r.start, std::min(end, vocab) - r.start, vocab, 0));
    return std::optional<std::vector<SourcePiece>>(std::move(out));  // rows past vocab: padding, dropped
  }
  if (mp.kind == Kind::kQkv) {
    if (m.num_query_groups <= 0 || m.head_dim <= 0 || m.num_attention_heads <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", in.name, "': linear_qkv needs source.num_attention_heads, num_query_groups and head_dim",
          kFromModelConfig));
    }
    const uint64_t hd = static_cast<uint64_t>(m.head_dim), groups = static_cast<uint64_t>(m.num_query_groups);
    const uint64_t qpg = static_cast<uint64_t>(m.num_attention_heads) / groups, heads = qpg * groups;
    const bool gated = m.attention == spec::MegatronSource::Attention::kGated;
    const uint64_t q_rows = (gated ? 2 : 1) * qpg * hd;  // a group's query (and output gate) rows
    const uint64_t per_group = q_rows + 2 * hd;
    if (r.full != groups * per_group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", in.name, "': ", r.full, " rows in all, but ", m.num_attention_heads, " heads in ", groups,
          " query groups of head_dim ", hd, gated ? " with an output gate per head" : "", " (source section) make ",
          groups * per_group));
    }
    // Per group g: [q rows of its qpg heads; (gated: their output gate rows;) k rows; v rows];
    // each part's intersection with the pushed rows is one piece of q_proj / k_proj / v_proj.
    // Gated, HF's q_proj holds per head [q; gate] (head_dim rows each).
    struct Part {
      const char* proj;
      uint64_t offset, length, dst, full;  // rows in the group; where they go in the checkpoint tensor of `full` rows
    };
    std::vector<Part> parts;
    for (uint64_t g = r.start / per_group; g < groups && g * per_group < end; ++g) {
      parts.clear();
      if (gated) {
        for (uint64_t j = 0; j < qpg; ++j) {
          parts.push_back({"q_proj.", j * hd, hd, (g * qpg + j) * 2 * hd, 2 * heads * hd});
          parts.push_back({"q_proj.", (qpg + j) * hd, hd, (g * qpg + j) * 2 * hd + hd, 2 * heads * hd});
        }
      } else {
        parts.push_back({"q_proj.", 0, qpg * hd, g * qpg * hd, heads * hd});
      }
      parts.push_back({"k_proj.", q_rows, hd, g * hd, groups * hd});
      parts.push_back({"v_proj.", q_rows + hd, hd, g * hd, groups * hd});
      for (const Part& part : parts) {
        const uint64_t lo = std::max(r.start, g * per_group + part.offset);
        const uint64_t hi = std::min(end, g * per_group + part.offset + part.length);
        if (lo >= hi) continue;
        const uint64_t at = part.dst + (lo - g * per_group - part.offset);
        out.push_back(Piece(in, r, absl::StrCat(mp.target, part.proj, mp.suffix), at, hi - lo, part.full, lo - r.start));
      }
    }
    return std::optional<std::vector<SourcePiece>>(std::move(out));
  }
  if (mp.kind == Kind::kGdnInProj || mp.kind == Kind::kGdnConv) return GdnPieces(m, in, r, mp);
  // kFc1: this TP rank's [gate shard; up shard], shards of equal size.
  if (r.count % 2 != 0 || r.full % r.count != 0 || r.start % r.count != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", in.name, "': rows [", r.start, ", ", end, ") of ", r.full,
        " are not one of equal tensor-parallel shards of [gate; up] (linear_fc1 holds both halves per rank)"));
  }
  const uint64_t half = r.count / 2, tp_rank = r.start / r.count;
  out.push_back(Piece(in, r, absl::StrCat(mp.target, "gate_proj.", mp.suffix), tp_rank * half, half, r.full / 2, 0));
  out.push_back(Piece(in, r, absl::StrCat(mp.target, "up_proj.", mp.suffix), tp_rank * half, half, r.full / 2, half));
  return std::optional<std::vector<SourcePiece>>(std::move(out));
}

absl::StatusOr<std::vector<TensorDesc>> MapMegatronManifest(const spec::MegatronSource& m, const TensorDesc& entry) {
  TensorDesc whole = entry;
  if (whole.slice.present()) {
    whole.shape = whole.slice.full_shape;
    whole.slice = {};
  }
  absl::StatusOr<std::optional<std::vector<SourcePiece>>> pieces = MapMegatron(m, whole);
  if (!pieces.ok()) return pieces.status();
  if (!pieces->has_value()) return std::vector<TensorDesc>{entry};
  std::vector<TensorDesc> out;
  std::set<std::string> seen;
  for (const SourcePiece& p : **pieces) {
    if (!seen.insert(p.desc.name).second) continue;
    TensorDesc t = p.desc;
    if (t.slice.present()) t.shape = t.slice.full_shape;
    t.slice = {};
    absl::StatusOr<uint64_t> bytes = DenseBytes(t.dtype, t.shape);
    t.nbytes = bytes.ok() ? *bytes : 0;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace refit
