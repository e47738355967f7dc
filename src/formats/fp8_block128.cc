#include "formats/fp8_block128.h"

#include <algorithm>

#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::fp8_block128 {

void Quantize(const ConstTensor& in, Fp32InputPolicy policy, float /*global_amax*/,
              std::span<const MutableBytes> outs) {
  QuantizeTiles(in, policy, /*ue8m0=*/false, outs);
}

void QuantizeTiles(const ConstTensor& in, Fp32InputPolicy policy, bool ue8m0,
                   std::span<const MutableBytes> outs) {
  const size_t rank = in.shape.size();
  const int64_t batch = BatchCount(in.shape);
  const int64_t n = in.shape[rank - 2];
  const int64_t k = in.shape[rank - 1];
  const int64_t nt = (n + kTile - 1) / kTile;
  const int64_t kt = (k + kTile - 1) / kTile;
  auto* q_all = static_cast<uint8_t*>(outs[0].data);
  auto* s_all = static_cast<float*>(outs[1].data);
  std::vector<float> rows_f32(static_cast<size_t>(std::min(n, kTile) * k));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t ti = 0; ti < nt; ++ti) {
      const int64_t r0 = ti * kTile;
      const int64_t rows = std::min(kTile, n - r0);
      const int64_t flat0 = (b * n + r0) * k;
      LoadF32(in, policy, flat0, rows * k, rows_f32.data());
      for (int64_t tj = 0; tj < kt; ++tj) {
        const int64_t c0 = tj * kTile;
        const int64_t cols = std::min(kTile, k - c0);
        // Zero padding never raises max|x|, so the amax is over the valid elements only.
        float amax = 0.0f;
        for (int64_t r = 0; r < rows; ++r) {
          const float* x = rows_f32.data() + r * k + c0;
          for (int64_t c = 0; c < cols; ++c) amax = bits::AbsMaxNan(amax, x[c]);
        }
        if (!bits::IsNan(amax) && amax < 1e-4f) amax = 1e-4f;
        float s = amax / 448.0f;
        if (ue8m0) s = bits::CeilToUe8m0DeepGemm(s);
        const float rcp = 1.0f / s;
        uint8_t* q_tile = q_all + flat0 + c0;
        for (int64_t r = 0; r < rows; ++r) {
          const float* x = rows_f32.data() + r * k + c0;
          uint8_t* q = q_tile + r * k;
          for (int64_t c = 0; c < cols; ++c) q[c] = bits::F32ToE4m3(x[c] * rcp);
        }
        if (ue8m0) CanonicalizeUe8m0Tile(q_tile, rows, cols, k, &s);
        s_all[(b * nt + ti) * kt + tj] = s;
      }
    }
  }
}

void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out) {
  const size_t rank = shape.size();
  const int64_t batch = BatchCount(shape);
  const int64_t n = shape[rank - 2];
  const int64_t k = shape[rank - 1];
  const int64_t nt = (n + kTile - 1) / kTile;
  const int64_t kt = (k + kTile - 1) / kTile;
  const auto* q = static_cast<const uint8_t*>(parts[0].data);
  const auto* s = static_cast<const float*>(parts[1].data);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < n; ++r) {
      const float* srow = s + (b * nt + r / kTile) * kt;
      const int64_t base = (b * n + r) * k;
      for (int64_t c = 0; c < k; ++c) out[base + c] = bits::E4m3ToF32(q[base + c]) * srow[c / kTile];
    }
  }
}

}  // namespace refit::formats::fp8_block128
