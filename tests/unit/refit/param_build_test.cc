#include "refit/param_build.h"

#include <cstring>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

spec::Rule RuleWith(std::vector<spec::LayoutStep> steps) {
  spec::Rule r;
  r.match = *spec::NamePattern::Parse("x");
  r.layout = std::move(steps);
  return r;
}

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(ParamBuildTest, SwapRowPairsAndHalves) {
  Built b{DType::kU8, {1, 4, 2}, Iota(8)};  // rows (0,1) (2,3) (4,5) (6,7)
  ASSERT_TRUE(ApplyLayout(RuleWith({{spec::LayoutOp::kSwapRowPairs, {""}, 1, 1, 1}}), "", -1, b).ok());
  EXPECT_EQ(b.bytes, (std::vector<uint8_t>{2, 3, 0, 1, 6, 7, 4, 5}));
  Built h{DType::kU8, {4, 2}, Iota(8)};
  ASSERT_TRUE(ApplyLayout(RuleWith({{spec::LayoutOp::kSwapHalves, {""}, 0, 1, 1}}), "", -1, h).ok());
  EXPECT_EQ(h.bytes, (std::vector<uint8_t>{4, 5, 6, 7, 0, 1, 2, 3}));
}

TEST(ParamBuildTest, PadAppendsZeroRows) {
  Built b{DType::kU8, {3, 2}, Iota(6)};
  ASSERT_TRUE(ApplyLayout(RuleWith({{spec::LayoutOp::kPad, {""}, 0, 4, 1}}), "", -1, b).ok());
  EXPECT_EQ(b.shape, (Shape{4, 2}));
  EXPECT_EQ(b.bytes, (std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 0, 0}));
}

// merge_dims is a view: gpt-oss's _blocks [E, N, K/32, 16] as the engines' [E, N, K/2].
TEST(ParamBuildTest, MergeDimsKeepsTheBytes) {
  Built b{DType::kU8, {2, 3, 4, 16}, Iota(2 * 3 * 4 * 16)};
  const std::vector<uint8_t> before = b.bytes;
  auto rule = RuleWith({{spec::LayoutOp::kMergeDims, {"_blocks"}, -2, 1, 1}});
  ASSERT_TRUE(ApplyLayout(rule, "_blocks", -1, b).ok());
  EXPECT_EQ(b.shape, (Shape{2, 3, 64}));
  EXPECT_EQ(b.dtype, DType::kU8);
  EXPECT_EQ(b.bytes, before);
  auto shape = LayoutShape(rule, "_blocks", DType::kU8, {5, 7, 16}, -1);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->second, (Shape{5, 112}));
  // The last dim has nothing after it to merge with.
  EXPECT_FALSE(LayoutShape(RuleWith({{spec::LayoutOp::kMergeDims, {""}, -1, 1, 1}}), "", DType::kU8, {5, 7}, -1).ok());
}

// view_dtype is a view: the TRT-LLM MXFP4 MoE's shuffled E8M0 scale bytes as the F8_E4M3 the
// engines register; the same bytes and shape, the dtype the spec states. A dtype of another width
// is refused, naming the step.
TEST(ParamBuildTest, ViewDtypeKeepsTheBytesAndTakesTheStatedDtype) {
  Built b{DType::kU8, {2, 128, 4}, Iota(2 * 128 * 4)};
  const std::vector<uint8_t> before = b.bytes;
  auto rule = RuleWith({{spec::LayoutOp::kViewDtype, {"_scales"}, 0, 1, 1, DType::kF8E4M3}});
  ASSERT_TRUE(ApplyLayout(rule, "_scales", -1, b).ok());
  EXPECT_EQ(b.dtype, DType::kF8E4M3);
  EXPECT_EQ(b.shape, (Shape{2, 128, 4}));
  EXPECT_EQ(b.bytes, before);
  auto shape = LayoutShape(rule, "_scales", DType::kU8, {5, 7}, -1);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->first, DType::kF8E4M3);
  EXPECT_EQ(shape->second, (Shape{5, 7}));
  EXPECT_TRUE(LayoutShape(rule, "_blocks", DType::kU8, {5, 7}, -1)->first == DType::kU8);  // not on _blocks
  auto wide = LayoutShape(rule, "_scales", DType::kBF16, {5, 7}, -1);
  EXPECT_THAT(wide.status().message(),
              ::testing::HasSubstr("view_dtype reads BF16[5,7] as F8_E4M3, a dtype of another width"));
}

// cast_f32: BF16 scales as vLLM holds compressed-tensors' weight_scale, exactly (F32 bits = BF16 << 16).
TEST(ParamBuildTest, CastF32WidensBf16Exactly) {
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC040, 0x0001, 0x7F7F, 0x3C00, 0x8000};
  Built b{DType::kBF16, {3, 2}, std::vector<uint8_t>(bf16.size() * 2)};
  std::memcpy(b.bytes.data(), bf16.data(), b.bytes.size());
  ASSERT_TRUE(ApplyLayout(RuleWith({{spec::LayoutOp::kCastF32, {"_scale"}, 0, 1, 1}}), "_scale", -1, b).ok());
  EXPECT_EQ(b.dtype, DType::kF32);
  EXPECT_EQ(b.shape, (Shape{3, 2}));
  ASSERT_EQ(b.bytes.size(), bf16.size() * 4);
  for (size_t i = 0; i < bf16.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, b.bytes.data() + i * 4, 4);
    EXPECT_EQ(bits, static_cast<uint32_t>(bf16[i]) << 16) << i;
  }
  EXPECT_FALSE(LayoutShape(RuleWith({{spec::LayoutOp::kCastF32, {""}, 0, 1, 1}}), "", DType::kU8, {3, 2}, -1).ok());
}

TEST(ParamBuildTest, SwizzleFollowsThe128x4Formula) {
  const int64_t rows = 130, cols = 6;
  Built b{DType::kU8, {rows, cols}, std::vector<uint8_t>(rows * cols)};
  for (int64_t i = 0; i < rows * cols; ++i) b.bytes[i] = static_cast<uint8_t>(1 + i % 251);
  ASSERT_TRUE(ApplyLayout(RuleWith({{spec::LayoutOp::kSwizzle128x4, {"_scale"}, 0, 1, 1}}), "_scale", -1, b).ok());
  ASSERT_EQ(b.shape, (Shape{256, 8}));
  const int64_t kp = 8;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < cols; ++k) {
      int64_t off = ((m / 128) * (kp / 4) + k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + k % 4;
      ASSERT_EQ(b.bytes[off], 1 + (m * cols + k) % 251) << m << "," << k;
    }
  }
}

TEST(ParamBuildTest, PackUe8m0NeedsRowsThatTheScalesCover) {
  Built s{DType::kF32, {3, 1}, std::vector<uint8_t>(12, 0)};
  auto rule = RuleWith({{spec::LayoutOp::kPackUe8m0, {"_scale_inv"}, 0, 1, 1}});
  EXPECT_FALSE(ApplyLayout(rule, "_scale_inv", 2624, s).ok());  // 2624 rows need 21 scale rows
  auto shape = LayoutShape(rule, "_scale_inv", DType::kF32, {21, 2}, 2624);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->first, DType::kI32);
  EXPECT_EQ(shape->second, (Shape{1, 2624}));
}

TEST(ParamBuildTest, SliceAndTranspose) {
  std::vector<uint8_t> src = Iota(12), dst(6);  // [3, 4]
  SliceDim(src.data(), {3, 4}, 1, 1, 2, 1, dst.data());
  EXPECT_EQ(dst, (std::vector<uint8_t>{2, 3, 6, 7, 10, 11}));
  std::vector<uint8_t> t(12);
  TransposeLast2(src.data(), {3, 4}, 1, t.data());
  EXPECT_EQ(t, (std::vector<uint8_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
}

TEST(ParamBuildTest, AssembledShapeOfFusedAndStackedSlots) {
  spec::Rule r = RuleWith({});
  r.fuse = spec::Fuse{"p", {"gate", "up"}};
  r.stack = spec::Stack{"E", 2};
  auto s = AssembledShape(r, {{3, 4}, {5, 4}, {3, 4}, {5, 4}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (Shape{2, 8, 4}));
  EXPECT_EQ(*AssembledShape(r, {{}, {}, {}, {}}), (Shape{2, 2}));  // 0-d global scales
  EXPECT_FALSE(AssembledShape(r, {{3, 4}, {5, 2}, {3, 4}, {5, 4}}).ok());
}

TEST(ParamBuildTest, AssembledShapeNamesWhatDisagrees) {
  spec::Rule fused = RuleWith({});
  fused.fuse = spec::Fuse{"p", {"gate", "up"}};
  fused.stack = spec::Stack{"E", 2};
  absl::StatusOr<Shape> s = AssembledShape(fused, {{3, 4}, {5, 2}, {3, 4}, {5, 4}});
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("fused members disagree beyond dim 0: [3,4] and [5,2]"));
  // Entry 1's gate and up agree with each other, not with entry 0's total rows.
  s = AssembledShape(fused, {{3, 4}, {5, 4}, {3, 4}, {4, 4}});
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("stacked entry 1 is [7,4], entry 0 is [8,4]"));
  // Unfused stacked slots: a leading dim, each slot whole; 0-d slots stack into a vector.
  spec::Rule stacked = RuleWith({});
  stacked.stack = spec::Stack{"E", 2};
  EXPECT_EQ(*AssembledShape(stacked, {{2, 3}, {2, 3}}), (Shape{2, 2, 3}));
  EXPECT_EQ(*AssembledShape(stacked, {{}, {}}), (Shape{2}));
  s = AssembledShape(stacked, {{2, 3}, {3, 3}});
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("stacked entry 1 is [3,3], entry 0 is [2,3]"));
  s = AssembledShape(stacked, {{2, 3}, {2, 3, 1}});
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("stacked entry 1 is [2,3,1], entry 0 is [2,3]"));
  // The slot shapes by pointer (what the commit passes) give the same answers.
  const Shape a{3, 4}, b{5, 4};
  const std::vector<const Shape*> slots{&a, &b, &a, &b};
  EXPECT_EQ(*AssembledShape(fused, slots), (Shape{2, 8, 4}));
}

}  // namespace
}  // namespace refit
