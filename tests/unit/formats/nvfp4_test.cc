// nvfp4 (ModelOpt NVFP4QTensor, FORMATS.md B §6.2) and nvfp4_te (B §6.3): the §12.2 golden
// block, transcriptions of both producers' fp32 arithmetic with oracle element casts, and the
// §12.3 edge cases.
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

struct Nvfp4Result {
  std::vector<uint8_t> packed, scales;
  float s2;
};

void Put(std::vector<uint8_t>* packed, size_t i, uint8_t code) {
  (*packed)[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? code : code << 4);
}

Nvfp4Result OracleModelOpt(const std::vector<float>& x, float a) {
  Nvfp4Result r{std::vector<uint8_t>(x.size() / 2, 0), std::vector<uint8_t>(x.size() / 16), a / 2688.0f};
  for (size_t b = 0; b < x.size() / 16; ++b) {
    float bmax = 0;
    for (int i = 0; i < 16; ++i) bmax = std::max(bmax, std::fabs(x[b * 16 + i]));
    float s = bmax / (6.0f * r.s2);
    if (s == 0) s = 1.0f;
    r.scales[b] = o::E4m3(s);
    const float d = static_cast<float>(o::E4m3Value(r.scales[b])) * r.s2;
    for (int i = 0; i < 16; ++i) {
      const float y = x[b * 16 + i] / d;
      Put(&r.packed, b * 16 + i, static_cast<uint8_t>((y < 0 ? 8 : 0) | o::E2m1Mag(y)));
    }
  }
  return r;
}

Nvfp4Result OracleTe(const std::vector<float>& x, float a) {
  float s_enc = 2688.0f / a;
  s_enc = std::min(s_enc, std::numeric_limits<float>::max());
  if (a == 0 || s_enc == 0) s_enc = 1.0f;
  Nvfp4Result r{std::vector<uint8_t>(x.size() / 2, 0), std::vector<uint8_t>(x.size() / 16), 1.0f / s_enc};
  const float t = s_enc * (1.0f / 6.0f);
  for (size_t b = 0; b < x.size() / 16; ++b) {
    float bmax = 0;
    for (int i = 0; i < 16; ++i) bmax = std::max(bmax, std::fabs(x[b * 16 + i]));
    r.scales[b] = o::E4m3(std::min(bmax * t, std::numeric_limits<float>::max()));
    const float enc = std::min(1.0f / (static_cast<float>(o::E4m3Value(r.scales[b])) * r.s2),
                               std::numeric_limits<float>::max());
    for (int i = 0; i < 16; ++i) {
      const float y = x[b * 16 + i] * enc;
      Put(&r.packed, b * 16 + i, static_cast<uint8_t>((std::signbit(y) ? 8 : 0) | o::E2m1Mag(y)));
    }
  }
  return r;
}

std::vector<float> GoldenRow() {
  std::vector<float> x = {0, -0.0f, 0.25f, -0.25f, 0.75f, 1.25f, 1.75f, 2.5f,
                          3.5f, 5, 6, -6, 0.1f, -0.1f, 3, -4};
  x.push_back(2688.0f);
  x.resize(32, 0.0f);
  return x;
}

TEST(Nvfp4Test, PlanShapesAndNames) {
  for (Format f : {Format::kNvfp4, Format::kNvfp4Te}) {
    absl::StatusOr<std::vector<OutputSpec>> p = PlanOutputs(f, DType::kBF16, {96, 64});
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->size(), 3u);
    EXPECT_EQ((*p)[0].suffix, "");
    EXPECT_EQ((*p)[0].dtype, DType::kU8);
    EXPECT_EQ((*p)[0].shape, (Shape{96, 32}));
    EXPECT_EQ((*p)[1].suffix, "_scale");
    EXPECT_EQ((*p)[1].dtype, DType::kF8E4M3);
    EXPECT_EQ((*p)[1].shape, (Shape{96, 4}));
    EXPECT_EQ((*p)[2].suffix, "_scale_2");
    EXPECT_EQ((*p)[2].dtype, DType::kF32);
    EXPECT_EQ((*p)[2].shape, Shape{});
    EXPECT_EQ((*p)[2].bytes, 4u);
    absl::StatusOr<std::vector<OutputSpec>> bad = PlanOutputs(f, DType::kBF16, {96, 40});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("K=40 is not a multiple of 16"), std::string::npos);
  }
}

// FORMATS.md §12.2 golden block.
TEST(Nvfp4Test, GoldenBlockModelOpt) {
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kNvfp4, {1, 32}, GoldenRow());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->As<float>(2)[0], 1.0f);
  EXPECT_EQ(q->parts[1], (std::vector<uint8_t>{0x38, 0x7E}));
  EXPECT_EQ(q->parts[0], (std::vector<uint8_t>{0x00, 0x80, 0x22, 0x44, 0x66, 0xF7, 0x80, 0xE5,
                                               0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}));
}

TEST(Nvfp4Test, GoldenBlockTe) {
  absl::StatusOr<Quantized> q = RunQuantizeF32(Format::kNvfp4Te, {1, 32}, GoldenRow());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->As<float>(2)[0], 1.0f);
  EXPECT_EQ(q->parts[1], (std::vector<uint8_t>{0x38, 0x7E}));
  // Sign-bit rule: -0.0 -> 8, as printed by the measurement.
  EXPECT_EQ(q->parts[0], (std::vector<uint8_t>{0x80, 0x80, 0x22, 0x44, 0x66, 0xF7, 0x80, 0xE5,
                                               0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}));
}

class Nvfp4OracleTest : public ::testing::TestWithParam<Format> {};

TEST_P(Nvfp4OracleTest, MatchesProducerTranscription) {
  const Format f = GetParam();
  std::vector<float> x = o::Weights(64 * 256, 53);
  // A block far below the tensor amax (scale in the E4M3 subnormal range) and a zero block.
  for (int i = 0; i < 16; ++i) {
    x[256 + i] *= 1e-3f;
    x[512 + i] = 0.0f;
  }
  float a = 0;
  for (float v : x) a = std::max(a, std::fabs(v));
  absl::StatusOr<Quantized> q = RunQuantizeF32(f, {64, 256}, x);
  ASSERT_TRUE(q.ok());
  Nvfp4Result want = f == Format::kNvfp4 ? OracleModelOpt(x, a) : OracleTe(x, a);
  EXPECT_EQ(q->parts[0], want.packed);
  EXPECT_EQ(q->parts[1], want.scales);
  EXPECT_EQ(q->As<float>(2)[0], want.s2);
  // Zero block: 0x38 (ModelOpt) vs 0x00 (TE), codes 0 either way.
  EXPECT_EQ(q->parts[1][512 / 16], f == Format::kNvfp4 ? 0x38 : 0x00);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q->parts[0][256 + i], 0);
  // The subnormal-scale block really is subnormal.
  EXPECT_LT(q->parts[1][256 / 16], 0x08);
}

INSTANTIATE_TEST_SUITE_P(Producers, Nvfp4OracleTest, ::testing::Values(Format::kNvfp4, Format::kNvfp4Te));

TEST(Nvfp4Test, GlobalAmaxSharedByFusedGroup) {
  std::vector<float> q_proj = o::Weights(32 * 64, 61, 0.02f);
  std::vector<float> k_proj = o::Weights(32 * 64, 62, 0.05f);
  float a = 0;
  for (float v : q_proj) a = std::max(a, std::fabs(v));
  for (float v : k_proj) a = std::max(a, std::fabs(v));
  for (Format f : {Format::kNvfp4, Format::kNvfp4Te}) {
    absl::StatusOr<Quantized> qa = RunQuantizeF32(f, {32, 64}, q_proj, {}, a);
    absl::StatusOr<Quantized> qb = RunQuantizeF32(f, {32, 64}, k_proj, {}, a);
    ASSERT_TRUE(qa.ok() && qb.ok());
    EXPECT_EQ(qa->parts[2], qb->parts[2]);  // identical weight_scale_2 bits
    Nvfp4Result want = f == Format::kNvfp4 ? OracleModelOpt(q_proj, a) : OracleTe(q_proj, a);
    EXPECT_EQ(qa->parts[0], want.packed);
    EXPECT_EQ(qa->parts[1], want.scales);
  }
  // A group amax below the tensor's own max is a caller error.
  absl::StatusOr<Quantized> bad = RunQuantizeF32(Format::kNvfp4, {32, 64}, k_proj, {}, 1e-3f);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("below the tensor's own"), std::string::npos) << bad.status();
}

TEST(Nvfp4Test, ScaleAtSaturationAndUnderflow) {
  // Block 0 holds A (b_j = A -> S = 448, code 7). Block 1 is ~1e-7 * A: ModelOpt's scale rounds
  // to 0x00 and x / 0 gives codes 7 / F (0/0 -> 7); TE gives 0x00 and codes 7/F/0.
  std::vector<float> x(32, 0.0f);
  x[0] = 2688.0f;
  x[16] = 1e-4f;
  x[17] = -1e-4f;
  absl::StatusOr<Quantized> m = RunQuantizeF32(Format::kNvfp4, {1, 32}, x);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->parts[1][0], 0x7E);
  EXPECT_EQ(m->parts[0][0] & 0xF, 7);
  EXPECT_EQ(m->parts[1][1], 0x00);
  EXPECT_EQ(m->parts[0][8], 0xF7);
  EXPECT_EQ(m->parts[0][9], 0x77);
  absl::StatusOr<Quantized> t = RunQuantizeF32(Format::kNvfp4Te, {1, 32}, x);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->parts[1][0], 0x7E);
  EXPECT_EQ(t->parts[1][1], 0x00);
  EXPECT_EQ(t->parts[0][8], 0xF7);
  EXPECT_EQ(t->parts[0][9], 0x00);
}

TEST(Nvfp4Test, AllZeroTensor) {
  std::vector<float> x(64, 0.0f);
  absl::StatusOr<Quantized> m = RunQuantizeF32(Format::kNvfp4, {2, 32}, x);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("amax is 0"), std::string::npos);
  absl::StatusOr<Quantized> t = RunQuantizeF32(Format::kNvfp4Te, {2, 32}, x);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->As<float>(2)[0], 1.0f);  // S_enc = 1 when A == 0
  for (uint8_t b : t->parts[0]) EXPECT_EQ(b, 0);
  for (uint8_t b : t->parts[1]) EXPECT_EQ(b, 0);
}

}  // namespace
}  // namespace refit::formats
