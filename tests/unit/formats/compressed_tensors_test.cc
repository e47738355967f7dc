// The compressed-tensors formats (compressed_tensors.h): hand-worked cases of the package's
// arithmetic — BF16 rounding of scales and quotients (double rounding before the E4M3 cast), the
// zero point turning -0.0 into +0, eps scales, NVFP4's reciprocal-then-product global scale,
// torch.sign's E2M1 sign rule, and W4A16's half-to-even rounding and nibble order. The golden
// tests (tests/golden, golden_ct_*) check the bytes against the package itself.
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/format_info.h"
#include "gtest/gtest.h"
#include "run_quantize.h"

namespace refit::formats {
namespace {

using testing::RunQuantizeF32;

uint16_t Bf16Bits(const std::vector<uint8_t>& bytes, size_t i) {
  uint16_t h = 0;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return h;
}

TEST(CompressedTensorsTest, Fp8ChannelScalesQuotientsThroughBf16) {
  // Row 0: amax 896 -> s = 2. Row 1: zero -> s = bf16 eps. Row 2: amax 448 -> s = 1, and
  // 1.0625 + 2^-20 rounds to the BF16 tie 1.0625 first, which E4M3 then rounds to even (1.0);
  // rounded once it would give 1.125.
  const std::vector<float> x = {896.0f, -448.0f, 0.5f, -0.0f, 0, 0, 0, 0, 448.0f, 1.0625f + 0x1p-20f, -0.0f, 0};
  absl::StatusOr<testing::Quantized> q = RunQuantizeF32(Format::kCtFp8Channel, {3, 4}, x);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->parts[0], (std::vector<uint8_t>{0x7E, 0xF6, 0x28, 0x00, 0, 0, 0, 0, 0x7E, 0x38, 0x00, 0x00}));
  EXPECT_EQ(q->plan[1].shape, (Shape{3, 1}));
  EXPECT_EQ(Bf16Bits(q->parts[1], 0), 0x4000);  // 2.0
  EXPECT_EQ(Bf16Bits(q->parts[1], 1), 0x3C00);  // 2^-7
  EXPECT_EQ(Bf16Bits(q->parts[1], 2), 0x3F80);  // 1.0
}

TEST(CompressedTensorsTest, Fp8TensorOneScaleShapedOne) {
  const std::vector<float> x = {1.0f, -2.0f, 0.25f, 4.0f, 0, 0, 0, 0};
  absl::StatusOr<testing::Quantized> q = RunQuantizeF32(Format::kCtFp8Tensor, {2, 4}, x);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->plan[1].shape, (Shape{1}));
  // s = bf16(4 / 448) = bf16(0.00892857) = 0x3C12 (0.0089111328125).
  EXPECT_EQ(Bf16Bits(q->parts[1], 0), 0x3C12);
  EXPECT_EQ(q->parts[0][3], 0x7E);  // 4 / s = 448.876..., bf16 448 -> 448
}

TEST(CompressedTensorsTest, Nvfp4GlobalScaleIsReciprocalThenProduct) {
  // A = 0.0693359375 (bf16): bf16(2688 / A) = 38656, but the package's bf16(bf16(1/A) * 2688)
  // is 38912 (measured with compressed-tensors 0.20.0 / torch 2.15).
  std::vector<float> x(32, 0.0f);
  x[0] = 0.0693359375f;
  x[17] = -1e-30f;  // a negative value that rounds to zero: code 8
  x[18] = -0.0f;    // -0.0: code 0
  absl::StatusOr<testing::Quantized> q = RunQuantizeF32(Format::kCtNvfp4, {1, 32}, x);
  ASSERT_TRUE(q.ok()) << q.status();
  float g = 0;
  std::memcpy(&g, q->parts[2].data(), 4);
  EXPECT_EQ(g, 38912.0f);
  EXPECT_EQ(q->plan[2].shape, (Shape{1}));
  EXPECT_EQ(q->parts[0][0] & 0xF, 7);  // the amax encodes as 6
  EXPECT_EQ(q->parts[0][8], 0x80);     // elements 16 (0) and 17 (-tiny -> 8)
  EXPECT_EQ(q->parts[0][9], 0x00);     // elements 18 (-0.0) and 19
  EXPECT_EQ(q->parts[1][1], 0x20);     // the zero block's scale: 0.125
  // A = 0: G = 1 and every scale 0.125.
  q = RunQuantizeF32(Format::kCtNvfp4, {1, 16}, std::vector<float>(16, 0.0f));
  ASSERT_TRUE(q.ok()) << q.status();
  std::memcpy(&g, q->parts[2].data(), 4);
  EXPECT_EQ(g, 1.0f);
  EXPECT_EQ(q->parts[1][0], 0x20);
}

TEST(CompressedTensorsTest, W4a16PacksEightNibblesLowFirstWithHalfToEven) {
  // amax 7.5 -> s = 1: 7.5 clamps to 7 (nibble 15), -7.5 rounds to -8 (0), 2.5 -> 2, -0.0 -> 0,
  // 0.5 -> 0, 1.5 -> 2, -2.5 -> -2, 3 -> 3.
  std::vector<float> x(128, 0.0f);
  const float head[8] = {7.5f, -7.5f, 2.5f, -0.0f, 0.5f, 1.5f, -2.5f, 3.0f};
  for (int i = 0; i < 8; ++i) x[static_cast<size_t>(i)] = head[i];
  absl::StatusOr<testing::Quantized> q = RunQuantizeF32(Format::kCtW4a16, {1, 128}, x);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->plan[0].shape, (Shape{1, 16}));
  uint32_t w0 = 0, w1 = 0;
  std::memcpy(&w0, q->parts[0].data(), 4);
  std::memcpy(&w1, q->parts[0].data() + 4, 4);
  EXPECT_EQ(w0, 0xB6A88A0Fu);
  EXPECT_EQ(w1, 0x88888888u);
  EXPECT_EQ(Bf16Bits(q->parts[1], 0), 0x3F80);
  int64_t shape[2] = {0, 0};
  std::memcpy(shape, q->parts[2].data(), sizeof(shape));
  EXPECT_EQ(shape[0], 1);
  EXPECT_EQ(shape[1], 128);
}

TEST(CompressedTensorsTest, WholeDimensionScalesRefuseNothingButRank) {
  // Any K for the FP8 formats (the block is the whole row); ct_w4a16 needs K % 128.
  EXPECT_TRUE(PlanOutputs(Format::kCtFp8Channel, DType::kBF16, {3, 7}).ok());
  EXPECT_TRUE(PlanOutputs(Format::kCtFp8Tensor, DType::kBF16, {3, 7}).ok());
  EXPECT_FALSE(PlanOutputs(Format::kCtW4a16, DType::kBF16, {3, 64}).ok());
  EXPECT_FALSE(PlanOutputs(Format::kCtFp8Channel, DType::kBF16, {64}).ok());
}

}  // namespace
}  // namespace refit::formats
