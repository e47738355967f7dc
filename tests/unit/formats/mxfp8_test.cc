// mxfp8 (TE RCEIL, FORMATS.md B §5.2) against an oracle written from the definition: scale =
// smallest power of two >= amax * fl(1/448) in [2^-127, 2^127], element = nearest-even E4M3.
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

void OracleMxfp8(const std::vector<float>& x, int64_t k, std::vector<uint8_t>* q, std::vector<uint8_t>* s) {
  q->resize(x.size());
  s->resize(x.size() / 32);
  const float rcp448 = 1.0f / 448.0f;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const int e = o::CeilPow2Exp(amax * rcp448, -127, 127);
    (*s)[b] = static_cast<uint8_t>(e + 127);
    // TE multiplies by 1 for scale byte 0 (ptx.cuh exp2f_rcp), not by 2^127.
    const float mult = e == -127 ? 1.0f : std::ldexp(1.0f, -e);
    for (int i = 0; i < 32; ++i) (*q)[b * 32 + i] = o::E4m3(x[b * 32 + i] * mult);
  }
}

TEST(Mxfp8Test, PlanAndKMultiple) {
  absl::StatusOr<std::vector<OutputSpec>> p = PlanOutputs(Format::kMxfp8, DType::kBF16, {4, 96, 64});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*p)[0].shape, (Shape{4, 96, 64}));
  EXPECT_EQ((*p)[1].suffix, "_scale_inv");
  EXPECT_EQ((*p)[1].dtype, DType::kU8);
  EXPECT_EQ((*p)[1].shape, (Shape{4, 96, 2}));
  absl::StatusOr<std::vector<OutputSpec>> bad = PlanOutputs(Format::kMxfp8, DType::kBF16, {16, 100});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("K=100 is not a multiple of 32"), std::string::npos) << bad.status();
}

TEST(Mxfp8Test, MatchesOracleOnWeights) {
  const int64_t n = 64, k = 512;
  std::vector<float> x = o::Weights(n * k, 31);
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kMxfp8, {n, k}, x);
  ASSERT_TRUE(q.ok());
  std::vector<uint8_t> wq, ws;
  OracleMxfp8(x, k, &wq, &ws);
  EXPECT_EQ(q->parts[0], wq);
  EXPECT_EQ(q->parts[1], ws);
}

TEST(Mxfp8Test, EdgeCases) {
  std::vector<float> x(32 * 8, 0.0f);
  // Block 0: all zero -> scale 0x00, data 0x00.
  // Block 1: max exactly 448 * 2^-3 -> scale 2^-3 (byte 124), top element 0x7E.
  x[32] = 56.0f;
  x[33] = -1.0f;
  // Block 2: one ulp above 448 * 2^-3 -> scale steps to 2^-2.
  x[64] = std::nextafter(56.0f, 100.0f);
  // Block 3: ties after a power-of-two scale (max 448 -> scale 1): 1.0625 -> 1.0, 1.1875 -> 1.25.
  x[96] = 448.0f;
  x[97] = 1.0625f;
  x[98] = 1.1875f;
  x[99] = -0.0f;
  x[100] = std::ldexp(1.0f, -10);                         // tie -> 0
  x[101] = std::nextafter(std::ldexp(1.0f, -10), 1.0f);  // -> 0x01
  // Block 4: tiny block, scale in the E8M0 bottom range.
  x[128] = 1e-38f;
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kMxfp8, {1, 256}, x);
  ASSERT_TRUE(q.ok());
  const auto& d = q->parts[0];
  const auto& s = q->parts[1];
  EXPECT_EQ(s[0], 0x00);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(d[i], 0x00);
  EXPECT_EQ(s[1], 124);
  EXPECT_EQ(d[32], 0x7E);
  EXPECT_EQ(d[33], o::E4m3(-8.0f));
  EXPECT_EQ(s[2], 125);
  EXPECT_EQ(s[3], 127);
  EXPECT_EQ(d[96], 0x7E);
  EXPECT_EQ(d[97], 0x38);
  EXPECT_EQ(d[98], 0x3A);
  EXPECT_EQ(d[99], 0x80);
  EXPECT_EQ(d[100], 0x00);
  EXPECT_EQ(d[101], 0x01);
  std::vector<uint8_t> wq, ws;
  OracleMxfp8(x, 256, &wq, &ws);
  EXPECT_EQ(d, wq);
  EXPECT_EQ(s, ws);
}

}  // namespace
}  // namespace refit::formats
