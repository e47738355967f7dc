#include "refit/derived_build.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/mla_absorb.h"
#include "refit/committer.h"

namespace refit {
namespace {

// The layout steps of a `layout` op, as a rule's steps on the data tensor.
spec::Rule LayoutRule(const spec::Derived& d) {
  spec::Rule r;
  r.match = d.target;
  r.layout = d.layout;
  r.line = d.line;
  return r;
}

absl::StatusOr<formats::MlaAbsorbGeometry> MlaGeometry(const spec::Derived& d, const std::string& name,
                                                       const DerivedSource& from,
                                                       const std::optional<DerivedSource>& scale) {
  const std::string where =
      absl::StrCat("derived parameter '", name, "' (", d.op == spec::DerivedOp::kMlaWkc ? "mla_w_kc" : "mla_w_vc",
                   ", line ", d.line, ")");
  if (from.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(where,
                                                   ": kv_b_proj must be [heads * (qk_nope_head_dim + v_head_dim), "
                                                   "kv_lora_rank], not ",
                                                   ShapeString(from.shape)));
  }
  const int64_t per_head = d.qk_nope_head_dim + d.v_head_dim;
  if (d.qk_nope_head_dim <= 0 || d.v_head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where,
                                                   ": qk_nope_head_dim and v_head_dim are not known (give them in "
                                                   "the spec or a model config)"));
  }
  if (from.shape[0] % per_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": kv_b_proj's ", from.shape[0],
                                                   " rows are not whole heads of ", per_head, " (qk_nope_head_dim ",
                                                   d.qk_nope_head_dim, " + v_head_dim ", d.v_head_dim, ")"));
  }
  formats::MlaAbsorbGeometry g{from.shape[0] / per_head, d.qk_nope_head_dim, d.v_head_dim, from.shape[1]};
  REFIT_RETURN_IF_ERROR(formats::CheckMlaAbsorbGeometry(g));
  if (d.scale) {
    if (from.dtype != DType::kF8E4M3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": with a 'scale', kv_b_proj must be F8_E4M3, not ", DTypeName(from.dtype)));
    }
    if (!scale || scale->dtype != DType::kF32 || scale->shape != Shape{g.ScaleRows(), g.ScaleCols()}) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": its scale must be F32[", g.ScaleRows(), ",", g.ScaleCols(),
                       "] (128x128 blocks of kv_b_proj ", ShapeString(from.shape), "), not ",
                       scale ? absl::StrCat(DTypeName(scale->dtype), ShapeString(scale->shape)) : "absent"));
    }
  } else if (from.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": kv_b_proj must be BF16 (or F8_E4M3 with a 'scale'), not ", DTypeName(from.dtype)));
  }
  return g;
}

}  // namespace

absl::StatusOr<std::pair<DType, Shape>> DerivedShape(const spec::Derived& d, const std::string& name,
                                                     const DerivedSource& from,
                                                     const std::optional<DerivedSource>& scale) {
  switch (d.op) {
    case spec::DerivedOp::kAddOne: return std::make_pair(from.dtype, from.shape);
    case spec::DerivedOp::kLayout: {
      absl::StatusOr<std::pair<DType, Shape>> s = LayoutShape(LayoutRule(d), "", from.dtype, from.shape, -1);
      if (!s.ok())
        return absl::InvalidArgumentError(absl::StrCat("derived parameter '", name, "': ", s.status().message()));
      return s;
    }
    case spec::DerivedOp::kMlaWkc:
    case spec::DerivedOp::kMlaWvc: {
      REFIT_ASSIGN_OR_RETURN(formats::MlaAbsorbGeometry g, MlaGeometry(d, name, from, scale));
      if (d.op == spec::DerivedOp::kMlaWkc)
        return std::make_pair(DType::kBF16, Shape{g.heads, g.kv_lora_rank, g.qk_nope_head_dim});
      return std::make_pair(DType::kBF16, Shape{g.heads, g.v_head_dim, g.kv_lora_rank});
    }
  }
  return absl::InternalError("unknown derived op");
}

absl::StatusOr<Built> BuildDerived(const spec::Derived& d, const std::string& name, const Built& from,
                                   const Built* scale) {
  std::optional<DerivedSource> scale_source;
  if (scale != nullptr) scale_source = DerivedSource{scale->dtype, scale->shape};
  REFIT_ASSIGN_OR_RETURN(auto shape, DerivedShape(d, name, {from.dtype, from.shape}, scale_source));
  Built out{shape.first, shape.second, {}};
  switch (d.op) {
    case spec::DerivedOp::kAddOne: {
      REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(from.dtype, from.shape));
      out.bytes.resize(n);
      storage::ParamInfo info{name, from.dtype, from.shape, n};
      REFIT_RETURN_IF_ERROR(ComputeDerived(d.op, info, from.bytes.data(), out.bytes.data()));
      return out;
    }
    case spec::DerivedOp::kLayout: {
      Built b = from;
      REFIT_RETURN_IF_ERROR(ApplyLayout(LayoutRule(d), "", -1, b));
      return b;
    }
    case spec::DerivedOp::kMlaWkc:
    case spec::DerivedOp::kMlaWvc: {
      REFIT_ASSIGN_OR_RETURN(formats::MlaAbsorbGeometry g,
                             MlaGeometry(d, name, {from.dtype, from.shape}, scale_source));
      std::vector<uint16_t> kc(static_cast<size_t>(g.WkcElements())), vc(static_cast<size_t>(g.WvcElements()));
      if (d.scale) {
        std::vector<float> s(scale->bytes.size() / 4);
        std::memcpy(s.data(), scale->bytes.data(), s.size() * 4);
        REFIT_RETURN_IF_ERROR(formats::MlaAbsorbFp8Block128(g, from.bytes, s, kc, vc));
      } else {
        std::vector<uint16_t> w(from.bytes.size() / 2);
        std::memcpy(w.data(), from.bytes.data(), w.size() * 2);
        REFIT_RETURN_IF_ERROR(formats::MlaAbsorbBf16(g, w, kc, vc));
      }
      const std::vector<uint16_t>& v = d.op == spec::DerivedOp::kMlaWkc ? kc : vc;
      out.bytes.resize(v.size() * 2);
      std::memcpy(out.bytes.data(), v.data(), out.bytes.size());
      return out;
    }
  }
  return absl::InternalError("unknown derived op");
}

}  // namespace refit
