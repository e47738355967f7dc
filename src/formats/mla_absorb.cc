#include "formats/mla_absorb.h"

#include "absl/strings/str_cat.h"
#include "formats/bits.h"

namespace refit::formats {
namespace {

// Scatters kv_b_proj element (r, c), already in bf16, into w_kc [h, c, j] and w_vc [h, j, c].
template <typename Element>
void Scatter(const MlaAbsorbGeometry& g, Element element, std::span<uint16_t> w_kc, std::span<uint16_t> w_vc) {
  const int64_t nope = g.qk_nope_head_dim, v = g.v_head_dim, lora = g.kv_lora_rank, per_head = nope + v;
  for (int64_t h = 0; h < g.heads; ++h) {
    for (int64_t j = 0; j < per_head; ++j) {
      const int64_t r = h * per_head + j;
      if (j < nope) {
        for (int64_t c = 0; c < lora; ++c) w_kc[static_cast<size_t>((h * lora + c) * nope + j)] = element(r, c);
      } else {
        uint16_t* row = w_vc.data() + (h * v + (j - nope)) * lora;
        for (int64_t c = 0; c < lora; ++c) row[c] = element(r, c);
      }
    }
  }
}

absl::Status CheckSizes(const MlaAbsorbGeometry& g, size_t kv_b, size_t w_kc, size_t w_vc) {
  if (absl::Status st = CheckMlaAbsorbGeometry(g); !st.ok()) return st;
  if (kv_b != static_cast<size_t>(g.InputElements()) || w_kc != static_cast<size_t>(g.WkcElements()) ||
      w_vc != static_cast<size_t>(g.WvcElements())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mla absorb: kv_b_proj of ", kv_b, " elements, w_kc of ", w_kc, " and w_vc of ", w_vc, " for ", g.heads,
        " heads of qk_nope_head_dim ", g.qk_nope_head_dim, ", v_head_dim ", g.v_head_dim, ", kv_lora_rank ",
        g.kv_lora_rank, " (needs ", g.InputElements(), ", ", g.WkcElements(), ", ", g.WvcElements(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMlaAbsorbGeometry(const MlaAbsorbGeometry& g) {
  // Every dimension below 2^24, so heads * (n + v) cannot overflow; the product with the rank is
  // checked by division before any size is computed from it.
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  if (g.heads <= 0 || g.qk_nope_head_dim <= 0 || g.v_head_dim <= 0 || g.kv_lora_rank <= 0 || g.heads > kMaxDim ||
      g.qk_nope_head_dim > kMaxDim || g.v_head_dim > kMaxDim || g.kv_lora_rank > kMaxDim ||
      g.Rows() > kMaxElements / g.kv_lora_rank) {
    return absl::InvalidArgumentError(absl::StrCat("mla absorb: heads ", g.heads, ", qk_nope_head_dim ",
                                                   g.qk_nope_head_dim, ", v_head_dim ", g.v_head_dim, ", kv_lora_rank ",
                                                   g.kv_lora_rank, " must be positive, each below ", kMaxDim,
                                                   ", and give at most ", kMaxElements, " elements"));
  }
  return absl::OkStatus();
}

absl::Status MlaAbsorbBf16(const MlaAbsorbGeometry& g, std::span<const uint16_t> kv_b, std::span<uint16_t> w_kc,
                           std::span<uint16_t> w_vc) {
  if (absl::Status st = CheckSizes(g, kv_b.size(), w_kc.size(), w_vc.size()); !st.ok()) return st;
  const int64_t lora = g.kv_lora_rank;
  Scatter(
      g, [&](int64_t r, int64_t c) { return kv_b[static_cast<size_t>(r * lora + c)]; }, w_kc, w_vc);
  return absl::OkStatus();
}

absl::Status MlaAbsorbFp8Block128(const MlaAbsorbGeometry& g, std::span<const uint8_t> kv_b,
                                  std::span<const float> scale_inv, std::span<uint16_t> w_kc,
                                  std::span<uint16_t> w_vc) {
  if (absl::Status st = CheckSizes(g, kv_b.size(), w_kc.size(), w_vc.size()); !st.ok()) return st;
  if (scale_inv.size() != static_cast<size_t>(g.ScaleRows() * g.ScaleCols())) {
    return absl::InvalidArgumentError(absl::StrCat("mla absorb: weight_scale_inv of ", scale_inv.size(),
                                                   " elements; 128x128 blocks of [", g.Rows(), ", ", g.kv_lora_rank,
                                                   "] need [", g.ScaleRows(), ", ", g.ScaleCols(), "]"));
  }
  const int64_t lora = g.kv_lora_rank, scale_cols = g.ScaleCols();
  Scatter(
      g,
      [&](int64_t r, int64_t c) {
        const float s = scale_inv[static_cast<size_t>((r / 128) * scale_cols + c / 128)];
        return bits::F32ToBf16(bits::E4m3ToF32(kv_b[static_cast<size_t>(r * lora + c)]) * s);
      },
      w_kc, w_vc);
  return absl::OkStatus();
}

}  // namespace refit::formats
