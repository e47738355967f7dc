#include "refit/megatron_source.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace refit {
namespace {

enum class Kind : uint8_t { kRename, kQkv, kFc1, kVocab };

struct Mapped {
  Kind kind = Kind::kRename;
  std::string target;  // kRename, kVocab: the checkpoint name; kQkv, kFc1: the prefix before "{q,k,v}_proj." / "{gate,up}_proj."
  std::string suffix;  // kQkv, kFc1: "weight" or "bias"
};

// "12." at the front of `rest` -> 12, consumed.
bool ConsumeIndex(absl::string_view& rest, int64_t& index) {
  size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || dot == 0) return false;
  if (!absl::SimpleAtoi(rest.substr(0, dot), &index) || index < 0) return false;
  rest.remove_prefix(dot + 1);
  return true;
}

// The checkpoint mapping of a Megatron-core name; nullopt: not one; error: a Megatron name
// refitd has no mapping for.
absl::StatusOr<std::optional<Mapped>> Parse(absl::string_view name) {
  while (absl::ConsumePrefix(&name, "module.")) {
  }
  if (name == "embedding.word_embeddings.weight") return Mapped{Kind::kVocab, "model.embed_tokens.weight", ""};
  if (name == "output_layer.weight") return Mapped{Kind::kVocab, "lm_head.weight", ""};
  if (name == "decoder.final_layernorm.weight") return Mapped{Kind::kRename, "model.norm.weight", ""};
  if (!absl::StartsWith(name, "embedding.") && !absl::StartsWith(name, "decoder.") &&
      !absl::StartsWith(name, "output_layer.")) {
    return std::optional<Mapped>();
  }
  auto unknown = [&] {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name),
                                                   "': no checkpoint name for this Megatron-core tensor "
                                                   "(source layout megatron)"));
  };
  absl::string_view rest = name;
  int64_t layer = 0;
  if (!absl::ConsumePrefix(&rest, "decoder.layers.") || !ConsumeIndex(rest, layer)) return unknown();
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  auto rename = [&](absl::string_view to) { return Mapped{Kind::kRename, absl::StrCat(p, std::string(to)), ""}; };
  if (rest == "self_attention.linear_qkv.layer_norm_weight" || rest == "input_layernorm.weight") {
    return rename("input_layernorm.weight");
  }
  if (rest == "self_attention.linear_qkv.weight") return Mapped{Kind::kQkv, p + "self_attn.", "weight"};
  if (rest == "self_attention.linear_qkv.bias") return Mapped{Kind::kQkv, p + "self_attn.", "bias"};
  if (rest == "self_attention.linear_proj.weight") return rename("self_attn.o_proj.weight");
  if (rest == "self_attention.linear_proj.bias") return rename("self_attn.o_proj.bias");
  if (rest == "self_attention.q_layernorm.weight") return rename("self_attn.q_norm.weight");
  if (rest == "self_attention.k_layernorm.weight") return rename("self_attn.k_norm.weight");
  if (rest == "mlp.linear_fc1.layer_norm_weight" || rest == "pre_mlp_layernorm.weight") {
    return rename("post_attention_layernorm.weight");
  }
  if (rest == "mlp.linear_fc1.weight") return Mapped{Kind::kFc1, p + "mlp.", "weight"};
  if (rest == "mlp.linear_fc2.weight") return rename("mlp.down_proj.weight");
  if (rest == "mlp.router.weight") return rename("mlp.gate.weight");
  int64_t expert = 0;
  absl::string_view e = rest;
  if (absl::ConsumePrefix(&e, "mlp.experts.local_experts.") && ConsumeIndex(e, expert)) {
    const std::string ep = absl::StrCat(p, "mlp.experts.", expert, ".");
    if (e == "linear_fc1.weight") return Mapped{Kind::kFc1, ep, "weight"};
    if (e == "linear_fc2.weight") return Mapped{Kind::kRename, ep + "down_proj.weight", ""};
    return unknown();
  }
  e = rest;
  for (int fc : {1, 2}) {
    absl::string_view g = e;
    if (absl::ConsumePrefix(&g, absl::StrCat("mlp.experts.linear_fc", fc, ".weight")) && !g.empty() &&
        absl::SimpleAtoi(g, &expert) && expert >= 0) {
      const std::string ep = absl::StrCat(p, "mlp.experts.", expert, ".");
      if (fc == 1) return Mapped{Kind::kFc1, ep, "weight"};
      return Mapped{Kind::kRename, ep + "down_proj.weight", ""};
    }
  }
  return unknown();
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

}  // namespace

absl::StatusOr<std::optional<std::vector<SourcePiece>>> MapMegatron(const spec::MegatronSource& m,
                                                                      const TensorDesc& in) {
  absl::StatusOr<std::optional<Mapped>> parsed = Parse(in.name);
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
  absl::StatusOr<Rows> rows = RowsOf(in);
  if (!rows.ok()) return rows.status();
  const Rows& r = *rows;
  const uint64_t end = r.start + r.count;
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
    const uint64_t hd = static_cast<uint64_t>(m.head_dim), groups = static_cast<uint64_t>(m.num_query_groups);
    const uint64_t qpg = static_cast<uint64_t>(m.num_attention_heads) / groups;
    const uint64_t per_group = (qpg + 2) * hd;
    if (r.full != groups * per_group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", in.name, "': ", r.full, " rows in all, but ", m.num_attention_heads, " heads in ", groups,
          " query groups of head_dim ", hd, " (source section) make ", groups * per_group));
    }
    // Per group g: [q rows of its qpg heads; k rows; v rows]; each part's intersection with
    // the pushed rows is one piece of q_proj / k_proj / v_proj.
    struct Part {
      const char* proj;
      uint64_t offset, length, full;
    };
    for (uint64_t g = r.start / per_group; g < groups && g * per_group < end; ++g) {
      const Part parts[] = {{"q_proj.", 0, qpg * hd, groups * qpg * hd},
                            {"k_proj.", qpg * hd, hd, groups * hd},
                            {"v_proj.", (qpg + 1) * hd, hd, groups * hd}};
      for (const Part& part : parts) {
        const uint64_t lo = std::max(r.start, g * per_group + part.offset);
        const uint64_t hi = std::min(end, g * per_group + part.offset + part.length);
        if (lo >= hi) continue;
        const uint64_t at = (part.full / groups) * g + (lo - g * per_group - part.offset);
        out.push_back(Piece(in, r, absl::StrCat(mp.target, part.proj, mp.suffix), at, hi - lo, part.full, lo - r.start));
      }
    }
    return std::optional<std::vector<SourcePiece>>(std::move(out));
  }
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
