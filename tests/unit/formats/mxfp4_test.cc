// mxfp4 (triton_kernels downcast_to_mxfp_torch ROUND_UP, FORMATS.md B §7.2) against an oracle
// written from the definition, plus gpt-oss naming and the §12.3 edge cases.
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

// Scale = smallest power of two >= amax/6 (0 for a zero block); code = nearest-even E2M1 of
// x / scale with the sign of x's sign bit; zero blocks encode x * 0.
void OracleMxfp4(const std::vector<float>& x, std::vector<uint8_t>* packed, std::vector<uint8_t>* s) {
  packed->assign(x.size() / 2, 0);
  s->resize(x.size() / 32);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 6.0f;
    int e = d == 0 ? -127 : o::CeilPow2Exp(d, -126, 128);
    (*s)[b] = static_cast<uint8_t>(e + 127);
    for (int i = 0; i < 32; ++i) {
      const float xi = x[b * 32 + i];
      const float y = d == 0 ? xi * 0.0f : xi * std::ldexp(1.0f, -e);
      const uint8_t code = static_cast<uint8_t>((std::signbit(y) ? 8 : 0) | o::E2m1Mag(y));
      (*packed)[(b * 32 + i) / 2] |= static_cast<uint8_t>(i % 2 == 0 ? code : code << 4);
    }
  }
}

TEST(Mxfp4Test, PlanUsesGptOssNames) {
  absl::StatusOr<std::vector<OutputSpec>> p = PlanOutputs(Format::kMxfp4, DType::kBF16, {4, 2880, 2880});
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].suffix, "_blocks");
  EXPECT_EQ((*p)[0].dtype, DType::kU8);
  EXPECT_EQ((*p)[0].shape, (Shape{4, 2880, 90, 16}));
  EXPECT_EQ((*p)[1].suffix, "_scales");
  EXPECT_EQ((*p)[1].dtype, DType::kU8);
  EXPECT_EQ((*p)[1].shape, (Shape{4, 2880, 90}));
  EXPECT_FALSE(PlanOutputs(Format::kMxfp4, DType::kBF16, {4, 48}).ok());
}

TEST(Mxfp4Test, MatchesOracleOnWeights) {
  std::vector<float> x = o::Weights(2 * 64 * 256, 41);
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kMxfp4, {2, 64, 256}, x);
  ASSERT_TRUE(q.ok());
  std::vector<uint8_t> wp, ws;
  OracleMxfp4(x, &wp, &ws);
  EXPECT_EQ(q->parts[0], wp);
  EXPECT_EQ(q->parts[1], ws);
}

TEST(Mxfp4Test, EdgeCases) {
  std::vector<float> x(32 * 5, 0.0f);
  // Block 0: zero -> scale byte 0 and codes 0.
  // Block 1: max 6 * 2^2 = 24 -> scale 2^2 (byte 129), top code 7; ties after the scale.
  x[32] = 24.0f;
  x[33] = 1.0f;   // 0.25 -> 0
  x[34] = 3.0f;   // 0.75 -> 1.0 (code 2)
  x[35] = 5.0f;   // 1.25 -> 1.0 (code 2)
  x[36] = 10.0f;  // 2.5 -> 2 (code 4)
  x[37] = 20.0f;  // 5 -> 4 (code 6)
  x[38] = -0.0f;  // sign bit -> 8
  x[39] = -1.0f;  // -0.25 -> 8
  // Block 2: one ulp above 24 -> scale steps to 2^3.
  x[64] = std::nextafter(24.0f, 100.0f);
  // Block 3: only -0.0 values: scale 0, codes 8 (x * 0 keeps the sign).
  for (int i = 96; i < 128; ++i) x[i] = -0.0f;
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kMxfp4, {1, 160}, x);
  ASSERT_TRUE(q.ok());
  const auto& p = q->parts[0];
  const auto& s = q->parts[1];
  EXPECT_EQ(s[0], 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(p[i], 0);
  EXPECT_EQ(s[1], 129);
  EXPECT_EQ(p[16], 0x07);  // 24 -> 7, 1 -> 0
  EXPECT_EQ(p[17], 0x22);
  EXPECT_EQ(p[18], 0x64);
  EXPECT_EQ(p[19], 0x88);
  EXPECT_EQ(s[2], 130);
  EXPECT_EQ(s[3], 0);
  EXPECT_EQ(p[48], 0x88);
  std::vector<uint8_t> wp, ws;
  OracleMxfp4(x, &wp, &ws);
  EXPECT_EQ(p, wp);
  EXPECT_EQ(s, ws);
}

TEST(Mxfp4Test, PropagateFollowsTritonForNaN) {
  std::vector<float> x(32, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  QuantizeOptions opts;
  opts.nonfinite = NonfinitePolicy::kPropagate;
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kMxfp4, {1, 32}, x, opts);
  ASSERT_TRUE(q.ok());
  // NaN amax -> (bits + 0x7FFFFF) & 0x7F800000 == 0 -> scale 0, multiplier 0: finite -> 0, NaN -> 7.
  EXPECT_EQ(q->parts[1][0], 0);
  EXPECT_EQ(q->parts[0][0], 0x00);
  EXPECT_EQ(q->parts[0][1] >> 4 & 7, 7);
}

}  // namespace
}  // namespace refit::formats
