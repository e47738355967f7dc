// fp8_block128 / fp8_block128_ue8m0 against a transcription of DeepGEMM per_block_cast_to_fp8
// (FORMATS.md B §4.2) using the oracle element cast, plus the §12.3 edge cases.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "oracle.h"
#include "run_quantize.h"

namespace refit::formats {
namespace {

namespace o = oracle;
using testing::Quantized;
using testing::RunQuantizeF32;

// DeepGEMM ceil_to_ue8m0 from its definition: 2^ceil(log2 v), clamped to [2^-126, 2^127].
float OracleCeilUe8m0(float v) { return std::ldexp(1.0f, o::CeilPow2Exp(v, -126, 127)); }

struct Fp8Result {
  std::vector<uint8_t> q;
  std::vector<float> s;
};

// per_block_cast_to_fp8 on one [n, k] matrix.
Fp8Result OracleBlock(const std::vector<float>& x, int64_t n, int64_t k, bool ue8m0) {
  const int64_t nt = (n + 127) / 128, kt = (k + 127) / 128;
  Fp8Result r{std::vector<uint8_t>(x.size()), std::vector<float>(nt * kt)};
  for (int64_t ti = 0; ti < nt; ++ti) {
    for (int64_t tj = 0; tj < kt; ++tj) {
      float amax = 0;
      for (int64_t i = ti * 128; i < std::min(n, ti * 128 + 128); ++i)
        for (int64_t j = tj * 128; j < std::min(k, tj * 128 + 128); ++j) amax = std::max(amax, std::fabs(x[i * k + j]));
      amax = std::max(amax, 1e-4f);
      float s = amax / 448.0f;
      if (ue8m0) s = OracleCeilUe8m0(s);
      const float rcp = 1.0f / s;
      for (int64_t i = ti * 128; i < std::min(n, ti * 128 + 128); ++i)
        for (int64_t j = tj * 128; j < std::min(k, tj * 128 + 128); ++j) r.q[i * k + j] = o::E4m3(x[i * k + j] * rcp);
      r.s[ti * kt + tj] = s;
    }
  }
  return r;
}

// What an engine holds after dequantizing to bf16 and requantizing with use_ue8m0 (B §4.4).
Fp8Result OracleUe8m0Canonical(const std::vector<float>& x, int64_t n, int64_t k) {
  Fp8Result first = OracleBlock(x, n, k, true);
  const int64_t kt = (k + 127) / 128;
  std::vector<float> deq(x.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const float v = static_cast<float>(o::E4m3Value(first.q[i * k + j])) * first.s[(i / 128) * kt + j / 128];
      deq[i * k + j] = o::Bf16ToF32(o::Bf16(v));
    }
  return OracleBlock(deq, n, k, true);
}

TEST(Fp8Block128Test, PlanShapesIncluding2624Rows) {
  absl::StatusOr<std::vector<OutputSpec>> p = PlanOutputs(Format::kFp8Block128, DType::kBF16, {2624, 7168});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].suffix, "");
  EXPECT_EQ((*p)[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*p)[0].shape, (Shape{2624, 7168}));
  EXPECT_EQ((*p)[1].suffix, "_scale_inv");
  EXPECT_EQ((*p)[1].dtype, DType::kF32);
  EXPECT_EQ((*p)[1].shape, (Shape{21, 56}));
  EXPECT_EQ((*p)[1].bytes, 21u * 56 * 4);
  p = PlanOutputs(Format::kFp8Block128Ue8m0, DType::kF32, {8, 300, 129});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[1].shape, (Shape{8, 3, 2}));
  EXPECT_FALSE(PlanOutputs(Format::kFp8Block128, DType::kBF16, {128}).ok());
  EXPECT_FALSE(PlanOutputs(Format::kFp8Block128, DType::kF16, {128, 128}).ok());
}

class Fp8Block128OracleTest : public ::testing::TestWithParam<bool> {};

TEST_P(Fp8Block128OracleTest, MatchesDeepGemmTranscriptionWithPartialTiles) {
  const bool ue8m0 = GetParam();
  const Format f = ue8m0 ? Format::kFp8Block128Ue8m0 : Format::kFp8Block128;
  const int64_t e = 2, n = 300, k = 260;  // partial tiles in both directions, batched
  std::vector<float> x = o::Weights(e * n * k, 17);
  // One tile far smaller than the rest (subnormal E4M3 outputs) and one zero tile.
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t j = 128; j < 256; ++j) {
      x[i * k + j] *= 1e-3f;
      x[(n * k) + i * k + j] = 0.0f;
    }
  absl::StatusOr<Quantized> q = RunQuantizeF32(f, {e, n, k}, x);
  ASSERT_TRUE(q.ok()) << q.status();
  const int64_t per_scale = ((n + 127) / 128) * ((k + 127) / 128);
  for (int64_t b = 0; b < e; ++b) {
    std::vector<float> xb(x.begin() + b * n * k, x.begin() + (b + 1) * n * k);
    Fp8Result want = ue8m0 ? OracleUe8m0Canonical(xb, n, k) : OracleBlock(xb, n, k, false);
    for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(q->parts[0][b * n * k + i], want.q[i]) << "b=" << b << " i=" << i;
    for (int64_t i = 0; i < per_scale; ++i) ASSERT_EQ(q->As<float>(1)[b * per_scale + i], want.s[i]) << i;
  }
  // Zero tile: amax clamped at 1e-4 (FORMATS.md B §4.2), data all zero.
  const float zero_scale = q->As<float>(1)[per_scale + 1];
  EXPECT_EQ(zero_scale, ue8m0 ? std::ldexp(1.0f, -22) : 1e-4f / 448.0f);
  if (!ue8m0) {
    EXPECT_EQ(zero_scale, 2.2321428e-07f);
  }
}

INSTANTIATE_TEST_SUITE_P(Both, Fp8Block128OracleTest, ::testing::Bool());

TEST(Fp8Block128Test, NegativeZeroAndSaturationPoint) {
  std::vector<float> x(128 * 128, 0.0f);
  x[0] = -0.0f;
  x[1] = 448.0f;
  x[2] = -448.0f;
  x[3] = 1.0f;
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kFp8Block128, {128, 128}, x);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->parts[0][0], 0x80);
  EXPECT_EQ(q->parts[0][1], 0x7E);
  EXPECT_EQ(q->parts[0][2], 0xFE);
  EXPECT_EQ(q->parts[0][3], 0x38);
  EXPECT_EQ(q->As<float>(1)[0], 1.0f);
}

// FORMATS.md B §4.4: a tile whose largest |q| is 224 after the first pass gets s/2 and q*2.
TEST(Fp8Block128Test, Ue8m0CanonicalizationOf224Tiles) {
  std::vector<float> x(128 * 256, 0.0f);
  // Tile 0: max 228 -> s = 2^ceil(log2(228/448)) = 1, and 228 rounds down to q = 224.
  x[0] = 228.0f;
  x[1] = -3.0f;
  x[2] = 0.015625f;  // 2^-6
  // Tile 1: max 300 -> s = 1, q = 288: no change.
  x[128] = 300.0f;
  x[129] = 3.0f;
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kFp8Block128Ue8m0, {128, 256}, x);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->As<float>(1)[0], 0.5f);
  EXPECT_EQ(q->parts[0][0], 0x7E);                 // 448
  EXPECT_EQ(q->parts[0][1], o::E4m3(-6.0f));       // -3 * 2
  EXPECT_EQ(q->parts[0][2], o::E4m3(0.03125f));    // 2^-6 * 2
  EXPECT_EQ(q->As<float>(1)[1], 1.0f);
  EXPECT_EQ(q->parts[0][128], o::E4m3(300.0f));
  // Without canonicalization the plain UE8M0 pass would have kept s = 1, q = 224.
  EXPECT_EQ(OracleBlock(x, 128, 256, true).s[0], 1.0f);
  EXPECT_EQ(o::E4m3Value(OracleBlock(x, 128, 256, true).q[0]), 224.0);
  // A second pass over the dequantized values is a no-op.
  absl::StatusOr<std::vector<float>> deq = testing::RunDequantize(Format::kFp8Block128Ue8m0, {128, 256}, *q);
  ASSERT_TRUE(deq.ok());
  absl::StatusOr<Quantized> again = RunQuantizeF32(Format::kFp8Block128Ue8m0, {128, 256}, *deq);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->parts, q->parts);
}

// A NaN tile under the propagate policy: s = 2^127 from the NaN amax, canonicalization's factor
// overflows to +Inf, and the zero codes become 0 * Inf. That NaN is written as the positive code
// 0x7F on every platform (x86 makes it negative; the CUDA kernel, which must equal this, makes it
// positive). Before the fix every such byte was 0xFF here.
TEST(Fp8Block128Test, Ue8m0NanTileUnderPropagateWritesThePositiveNanCode) {
  std::vector<float> x(128 * 128, 0.0f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[6] = 1.5f;
  QuantizeOptions propagate;
  propagate.nonfinite = NonfinitePolicy::kPropagate;
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kFp8Block128Ue8m0, {128, 128}, x, propagate);
  ASSERT_TRUE(q.ok()) << q.status();
  for (size_t i : {size_t{0}, size_t{5}, size_t{6}, size_t{100}, x.size() - 1}) {
    EXPECT_EQ(q->parts[0][i], 0x7F) << i;
  }
}

TEST(Fp8Block128Test, Rows2624QuantizeWithOwnPartialTile) {
  const int64_t n = 2624, k = 256;
  std::vector<float> x = o::Weights(n * k, 23);
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kFp8Block128, {n, k}, x);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->plan[1].shape, (Shape{21, 2}));
  Fp8Result want = OracleBlock(x, n, k, false);
  EXPECT_EQ(q->parts[0], want.q);
  for (int i = 0; i < 42; ++i) EXPECT_EQ(q->As<float>(1)[i], want.s[i]);
}

}  // namespace
}  // namespace refit::formats
