// Engine layouts against transcriptions of the reference tensor programs (FORMATS.md B §8.1,
// §8.6): DeepGEMM's torch packing (index_select rows, bytes viewed as int32, MN-major
// TMA-aligned buffer) and the reshape/permute form of the 128x4 swizzle.
#include "formats/layout.h"

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace refit::formats {
namespace {

std::vector<float> RandomPow2Scales(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> s(n);
  for (float& v : s) v = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30);
  return s;
}

// The tensor program: rows = arange(mn) // gran; sf = sf[rows] ([mn, kb]); pad kb to 4*kp with
// zeros; bytes = bits >> 23 as uint8; view as int32 [mn, kp]; store transposed into an
// [kp, align(mn, 4)] buffer.
std::vector<int32_t> OraclePack(const std::vector<float>& sf, int64_t groups, int64_t mn, int64_t kb, int64_t gran) {
  const int64_t rows = (mn + gran - 1) / gran, kp = (kb + 3) / 4, a = (mn + 3) / 4 * 4;
  std::vector<int32_t> out(groups * a * kp, 0);
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<uint8_t> bytes(mn * kp * 4, 0);
    for (int64_t r = 0; r < mn; ++r) {
      for (int64_t c = 0; c < kb; ++c) {
        const float v = sf[(g * rows + r / gran) * kb + c];
        uint32_t b;
        std::memcpy(&b, &v, 4);
        bytes[r * kp * 4 + c] = static_cast<uint8_t>(b >> 23);
      }
    }
    for (int64_t r = 0; r < mn; ++r) {
      for (int64_t p = 0; p < kp; ++p) {
        int32_t word;
        std::memcpy(&word, &bytes[(r * kp + p) * 4], 4);  // little-endian host
        out[g * a * kp + p * a + r] = word;
      }
    }
  }
  return out;
}

struct PackCase {
  int64_t groups, mn, kb, gran;
};

class Ue8m0PackTest : public ::testing::TestWithParam<PackCase> {};

TEST_P(Ue8m0PackTest, MatchesTensorProgramAndRoundTrips) {
  const PackCase c = GetParam();
  Ue8m0PackGeometry g{c.groups, c.mn, c.kb, c.gran};
  std::vector<float> sf = RandomPow2Scales(g.ScaleCount(), static_cast<uint32_t>(c.mn));
  sf[0] = 0.0f;  // zero passes and packs to byte 0
  std::vector<int32_t> packed(g.PackedWords(), -1);
  ASSERT_TRUE(PackUe8m0(g, sf, packed).ok());
  EXPECT_EQ(packed, OraclePack(sf, c.groups, c.mn, c.kb, c.gran));
  std::vector<float> back(g.ScaleCount(), -1.0f);
  ASSERT_TRUE(UnpackUe8m0(g, packed, back).ok());
  EXPECT_EQ(back, sf);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Ue8m0PackTest,
                         ::testing::Values(PackCase{1, 2624, 56, 128},  // fused q_a + kv_a, A = 2624
                                           PackCase{1, 2112, 56, 128},
                                           PackCase{3, 130, 5, 128},    // partial K word, batched
                                           PackCase{1, 2623, 7, 128},   // padding row (A = 2624)
                                           PackCase{2, 37, 3, 1}));     // gran_mn = 1 (MX)

TEST(Ue8m0PackTest, GeometryFor2624Rows) {
  Ue8m0PackGeometry g{1, 2624, 56, 128};
  EXPECT_EQ(g.ScaleRows(), 21);
  EXPECT_EQ(g.Kp(), 14);
  EXPECT_EQ(g.AlignedMn(), 2624);
  EXPECT_EQ(g.PackedWords(), 2624 * 14);
}

TEST(Ue8m0PackTest, RejectsNonPowerOfTwoAndBadSizes) {
  Ue8m0PackGeometry g{1, 4, 4, 128};
  std::vector<float> sf = {1.0f, 0.75f, 2.0f, 4.0f};
  std::vector<int32_t> packed(g.PackedWords());
  absl::Status s = PackUe8m0(g, sf, packed);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("flat index 1"), std::string::npos) << s;
  sf[1] = -1.0f;
  EXPECT_FALSE(PackUe8m0(g, sf, packed).ok());
  sf[1] = 1.0f;
  std::vector<int32_t> small(g.PackedWords() - 1);
  EXPECT_FALSE(PackUe8m0(g, sf, small).ok());
}

// torchao to_blocked: pad to (Mp, Kp), view (Mp/128, 4, 32, Kp/4, 4), permute (0, 3, 2, 1, 4),
// flatten. Returns, for each output position, the source (m, k) or (-1) for padding.
std::vector<uint8_t> OracleSwizzle(const std::vector<uint8_t>& in, int64_t rows, int64_t cols) {
  const int64_t mp = (rows + 127) / 128 * 128, kp = (cols + 3) / 4 * 4;
  std::vector<uint8_t> out;
  for (int64_t rb = 0; rb < mp / 128; ++rb)
    for (int64_t cb = 0; cb < kp / 4; ++cb)
      for (int64_t r32 = 0; r32 < 32; ++r32)
        for (int64_t r4 = 0; r4 < 4; ++r4)
          for (int64_t c4 = 0; c4 < 4; ++c4) {
            const int64_t m = rb * 128 + r4 * 32 + r32, k = cb * 4 + c4;
            out.push_back(m < rows && k < cols ? in[m * cols + k] : 0);
          }
  return out;
}

TEST(Swizzle128x4Test, MatchesReshapePermuteAndRoundTrips) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{128, 4}, {256, 56}, {2624, 7}, {1, 1}, {130, 448}}) {
    Swizzle128x4Geometry g{2, rows, cols};
    std::vector<uint8_t> in(g.InputBytes());
    std::mt19937 rng(static_cast<uint32_t>(rows * 1000 + cols));
    for (uint8_t& b : in) b = static_cast<uint8_t>(1 + rng() % 255);  // nonzero: padding is visible
    std::vector<uint8_t> out(g.SwizzledBytes(), 0xEE);
    ASSERT_TRUE(Swizzle128x4(g, in, out).ok());
    const size_t per = g.PaddedRows() * g.PaddedCols();
    for (int64_t grp = 0; grp < 2; ++grp) {
      std::vector<uint8_t> gin(in.begin() + grp * rows * cols, in.begin() + (grp + 1) * rows * cols);
      std::vector<uint8_t> want = OracleSwizzle(gin, rows, cols);
      ASSERT_EQ(std::vector<uint8_t>(out.begin() + grp * per, out.begin() + (grp + 1) * per), want)
          << rows << "x" << cols;
    }
    std::vector<uint8_t> back(g.InputBytes());
    ASSERT_TRUE(Unswizzle128x4(g, out, back).ok());
    EXPECT_EQ(back, in);
  }
}

}  // namespace
}  // namespace refit::formats
