// Element and scale conversions against the measured tables of FORMATS.md §2.1-§2.5 and
// against exhaustive nearest-value oracles.
#include "formats/bits.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "oracle.h"

namespace refit::formats::bits {
namespace {

namespace o = ::refit::formats::oracle;

float Next(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float Prev(float x) { return std::nextafter(x, -std::numeric_limits<float>::infinity()); }

// FORMATS.md §2.1, CUDA __nv_cvt_float_to_fp8 SATFINITE column (refitd clamps before the cast).
TEST(E4m3Test, MeasuredTable) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(F32ToE4m3(0.0f), 0x00);
  EXPECT_EQ(F32ToE4m3(-0.0f), 0x80);
  EXPECT_EQ(F32ToE4m3(std::ldexp(1.0f, -10)), 0x00);        // tie -> even (0)
  EXPECT_EQ(F32ToE4m3(Next(std::ldexp(1.0f, -10))), 0x01);  // just above the tie
  EXPECT_EQ(F32ToE4m3(1.0625f), 0x38);
  EXPECT_EQ(F32ToE4m3(1.1875f), 0x3A);
  EXPECT_EQ(F32ToE4m3(248.0f), 0x78);
  EXPECT_EQ(F32ToE4m3(448.0f), 0x7E);
  EXPECT_EQ(F32ToE4m3(464.0f), 0x7E);
  EXPECT_EQ(F32ToE4m3(Next(464.0f)), 0x7E);
  EXPECT_EQ(F32ToE4m3(479.0f), 0x7E);
  EXPECT_EQ(F32ToE4m3(480.0f), 0x7E);
  EXPECT_EQ(F32ToE4m3(1000.0f), 0x7E);
  EXPECT_EQ(F32ToE4m3(1e30f), 0x7E);
  EXPECT_EQ(F32ToE4m3(-1000.0f), 0xFE);
  EXPECT_EQ(F32ToE4m3(inf), 0x7E);
  EXPECT_EQ(F32ToE4m3(-inf), 0xFE);
  EXPECT_EQ(F32ToE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(F32ToE4m3(std::ldexp(1.0f, -6)), 0x08);  // min normal
  EXPECT_EQ(F32ToE4m3(std::ldexp(1.0f, -9)), 0x01);  // min subnormal
}

TEST(E4m3Test, DecodesEveryCodeByDefinition) {
  for (int c = 0; c < 256; ++c) {
    const float v = E4m3ToF32(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), o::E4m3Value(c & 0x7F) * ((c & 0x80) ? -1 : 1)) << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << c;
    EXPECT_EQ(F32ToE4m3(v), c) << c;
  }
}

TEST(E4m3Test, MatchesNearestEvenOracleOnRandomAndTieInputs) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp_dist(-14.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(exp_dist(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    ASSERT_EQ(F32ToE4m3(x), o::E4m3(x)) << x;
  }
  // Every midpoint between adjacent codes, and one ulp either side.
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = static_cast<float>((o::E4m3Value(c) + o::E4m3Value(c + 1)) / 2);
    for (float x : {mid, Next(mid), Prev(mid)}) ASSERT_EQ(F32ToE4m3(x), o::E4m3(x)) << x;
  }
}

// FORMATS.md §2.3 CUDA RoundPosInf + SATFINITE column and measured points.
TEST(E8m0Test, CeilTeMeasuredTable) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(E8m0CeilTe(0.0f), 0x00);
  EXPECT_EQ(E8m0CeilTe(-0.0f), 0x00);
  EXPECT_EQ(E8m0CeilTe(1.0f), 0x7F);
  EXPECT_EQ(E8m0CeilTe(1.25f), 0x80);
  EXPECT_EQ(E8m0CeilTe(Prev(1.5f)), 0x80);
  EXPECT_EQ(E8m0CeilTe(1.5f), 0x80);
  EXPECT_EQ(E8m0CeilTe(3.0f), 0x81);
  EXPECT_EQ(E8m0CeilTe(3e38f), 0xFE);
  EXPECT_EQ(E8m0CeilTe(inf), 0xFE);
  EXPECT_EQ(E8m0CeilTe(std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(E8m0CeilTe(0.25f), 0x7D);
  EXPECT_EQ(E8m0CeilTe(0.75f), 0x7F);
  EXPECT_EQ(E8m0CeilTe(1.0625f), 0x80);
  EXPECT_EQ(E8m0CeilTe(1.75f), 0x80);
  EXPECT_EQ(E8m0CeilTe(3.5f), 0x81);
  EXPECT_EQ(E8m0CeilTe(5.0f), 0x82);
  EXPECT_EQ(E8m0CeilTe(7.0f), 0x82);
  EXPECT_EQ(E8m0CeilTe(-0.1f), 0x7C);
}

TEST(E8m0Test, CeilFlavoursAgreeAboveSubnormalsAndDifferBelow) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exp_dist(-125.0f, 126.0f);
  for (int i = 0; i < 100000; ++i) {
    const float v = std::exp2(exp_dist(rng));
    const int k = o::CeilPow2Exp(v, -127, 127);
    ASSERT_EQ(E8m0CeilTe(v), k + 127) << v;
    ASSERT_EQ(E8m0CeilTritonBits(v) >> 23, static_cast<uint32_t>(k + 127)) << v;
    ASSERT_EQ(CeilToUe8m0DeepGemm(v), std::ldexp(1.0f, k)) << v;
  }
  // fp32 subnormal v (FORMATS.md §2.5): TE sends v <= 2^-127 to byte 0, triton to byte 1.
  const float tiny = std::ldexp(1.0f, -130);
  EXPECT_EQ(E8m0CeilTe(tiny), 0);
  EXPECT_EQ(E8m0CeilTritonBits(tiny) >> 23, 1u);
  EXPECT_EQ(E8m0CeilTe(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(E8m0CeilTe(Next(std::ldexp(1.0f, -127))), 1);
  EXPECT_EQ(E8m0CeilTritonBits(0.0f), 0u);
  // DeepGEMM clamps at 2^-126 and never produces 2^-127.
  EXPECT_EQ(CeilToUe8m0DeepGemm(0.0f), std::ldexp(1.0f, -126));
}

TEST(E8m0Test, DecodeAndReciprocal) {
  EXPECT_EQ(F32Bits(E8m0ToF32(0)), 0x00400000u);
  EXPECT_TRUE(std::isnan(E8m0ToF32(255)));
  for (int b = 1; b < 255; ++b) EXPECT_EQ(E8m0ToF32(static_cast<uint8_t>(b)), std::ldexp(1.0f, b - 127));
  EXPECT_EQ(Exp2Rcp(0), 1.0f);  // TE ptx.cuh: byte 0 multiplies by 1
  for (int e = 1; e < 255; ++e) {
    EXPECT_EQ(Exp2Rcp(static_cast<uint8_t>(e)), std::ldexp(1.0f, 127 - e)) << e;
  }
  EXPECT_TRUE(std::isnan(Exp2Rcp(255)));
}

// FORMATS.md §2.4: RNE tie points, saturation, and the two sign rules.
TEST(E2m1Test, TiesSaturationAndSigns) {
  const std::pair<float, int> ties[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4},
                                        {2.5f, 4},  {3.5f, 6},  {5.0f, 6}, {6.0f, 7},
                                        {7.0f, 7},  {1e30f, 7}, {0.0f, 0}, {0.5f, 1}};
  for (auto [x, code] : ties) {
    EXPECT_EQ(F32ToE2m1SignBit(x), code) << x;
    EXPECT_EQ(F32ToE2m1SignBit(-x), code | 8) << x;
    EXPECT_EQ(F32ToE2m1SignLess(x), code) << x;
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(F32ToE2m1SignBit(-0.0f), 8);
  EXPECT_EQ(F32ToE2m1SignLess(-0.0f), 0);
  EXPECT_EQ(F32ToE2m1SignBit(-0.1f), 8);
  EXPECT_EQ(F32ToE2m1SignLess(-0.1f), 8);
  EXPECT_EQ(F32ToE2m1SignBit(nan), 7);
  EXPECT_EQ(F32ToE2m1SignLess(nan), 7);
  EXPECT_EQ(F32ToE2m1SignBit(inf), 7);
  EXPECT_EQ(F32ToE2m1SignBit(-inf), 0xF);
  EXPECT_EQ(F32ToE2m1SignLess(-inf), 0xF);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng);
    ASSERT_EQ(E2m1Magnitude(x), o::E2m1Mag(x)) << x;
  }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(E2m1ToF32(static_cast<uint8_t>(c)), o::E2m1Value(c)) << c;
}

TEST(Bf16Test, RoundToNearestEvenAgainstOracle) {
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie -> even
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to Inf
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const float x = o::FromBits(rng() & 0xFF7FFFFFu);  // finite
    ASSERT_EQ(F32ToBf16(x), o::Bf16(x)) << x;
    ASSERT_EQ(Bf16ToF32(F32ToBf16(x)), o::Bf16ToF32(o::Bf16(x)));
  }
}

TEST(F16Test, MatchesCompilerFloat16) {
  std::mt19937 rng(9);
  for (int i = 0; i < 300000; ++i) {
    const float x = o::FromBits(rng());
    if (std::isnan(x)) continue;
    const _Float16 h = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(F32ToF16(x), want) << x;
  }
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    _Float16 h;
    std::memcpy(&h, &code, 2);
    const float want = static_cast<float>(h);
    const float got = F16ToF32(code);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(F32Bits(got), F32Bits(want)) << c;
    }
  }
}

}  // namespace
}  // namespace refit::formats::bits
