// Cross-format properties: names, input policy (BF16 vs exact FP32 byte identity,
// round_to_bf16, NaN/Inf rejection), output-buffer validation, casts, and
// dequant(quant(x)) error bounds for every format, and the format table itself. The per-format
// suites run over every row of the table (every_format.h); DequantizeErrorWithinBound's switch
// has no default, so a new enumerator without its error bound does not compile (-Wswitch).
#include "formats/format.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string_view>
#include <vector>

#include "every_format.h"
#include "formats/format_info.h"
#include "gtest/gtest.h"
#include "oracle.h"
#include "run_quantize.h"

namespace refit::formats {
namespace {

namespace o = oracle;
using testing::Quantized;
using testing::RunQuantize;
using testing::RunQuantizeF32;

using testing::FormatParamName;
using testing::FormatsWhere;

TEST(FormatTest, NamesRoundTrip) {
  for (const FormatInfo& row : AllFormats()) {
    EXPECT_EQ(std::string_view(FormatName(row.format)), row.name);
    absl::StatusOr<Format> f = ParseFormat(row.name);
    ASSERT_TRUE(f.ok()) << row.name << ": " << f.status();
    EXPECT_EQ(*f, row.format) << row.name;
    EXPECT_EQ(NeedsGlobalAmax(row.format), row.global_amax != GlobalAmax::kNone) << row.name;
  }
  // The names specs and checkpoints already use are a contract: a row must not rename them.
  EXPECT_EQ(ParseFormat("fp8_block128_ue8m0").value(), Format::kFp8Block128Ue8m0);
  EXPECT_EQ(ParseFormat("nvfp4_te").value(), Format::kNvfp4Te);
  EXPECT_FALSE(ParseFormat("fp8").ok());
}

TEST(FormatTableTest, OneRowPerFormatInEnumOrder) {
  ASSERT_EQ(AllFormats().size(), kFormatCount);
  for (size_t i = 0; i < kFormatCount; ++i) {
    const Format f = static_cast<Format>(i);
    const FormatInfo& row = AllFormats()[i];
    EXPECT_EQ(row.format, f);
    EXPECT_EQ(&Info(f), &row);
    EXPECT_NE(row.quantize, nullptr) << row.name;
    EXPECT_NE(row.dequantize, nullptr) << row.name;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(AllFormats()[j].name, row.name) << "two rows named " << row.name;
    // The row's roles are what PlanOutputs emits.
    absl::StatusOr<std::vector<OutputSpec>> plan = PlanOutputs(f, DType::kBF16, {256, 256});
    ASSERT_TRUE(plan.ok()) << row.name << ": " << plan.status();
    ASSERT_EQ(plan->size(), row.Outputs().size());
    for (size_t j = 0; j < plan->size(); ++j) {
      EXPECT_EQ((*plan)[j].suffix, row.Outputs()[j].suffix);
      EXPECT_EQ((*plan)[j].dtype, row.Outputs()[j].dtype);
    }
  }
}

TEST(FormatTableTest, GeometrySuffixesAndCasts) {
  EXPECT_EQ(BlockAlong(Format::kFp8Block128, 1, 2), 128);
  EXPECT_EQ(BlockAlong(Format::kFp8Block128Ue8m0, 0, 2), 128);
  EXPECT_EQ(BlockAlong(Format::kFp8Block128, 0, 3), 1);  // a batch (expert) dimension
  EXPECT_EQ(BlockAlong(Format::kNvfp4, 1, 2), 16);
  EXPECT_EQ(BlockAlong(Format::kNvfp4Te, 0, 2), 1);
  EXPECT_EQ(BlockAlong(Format::kMxfp8, 2, 3), 32);
  EXPECT_EQ(BlockAlong(Format::kMxfp4, 1, 3), 1);
  EXPECT_EQ(BlockAlong(Format::kBf16, 1, 2), 1);
  const std::vector<std::string_view> suffixes = AllOutputSuffixes();
  EXPECT_EQ(suffixes, (std::vector<std::string_view>{"_global_scale", "_scale_inv", "_scale_2", "_blocks", "_scales",
                                                     "_packed", "_scale", "_shape", ""}));
  // Per-channel and per-tensor scales span whole dimensions: no split along them keeps the bytes.
  EXPECT_EQ(BlockAlong(Format::kCtFp8Channel, 1, 2), kWholeDim);
  EXPECT_EQ(BlockAlong(Format::kCtFp8Channel, 0, 2), 1);
  EXPECT_EQ(BlockAlong(Format::kCtFp8Tensor, 0, 2), kWholeDim);
  EXPECT_EQ(BlockAlong(Format::kCtW4a16, 1, 2), 128);
  EXPECT_EQ(CastFormatFor(DType::kBF16), Format::kBf16);
  EXPECT_EQ(CastFormatFor(DType::kF16), Format::kFp16);
  EXPECT_EQ(CastFormatFor(DType::kF32), Format::kFp32);
  EXPECT_EQ(CastFormatFor(DType::kU8), std::nullopt);
}

TEST(FormatTableTest, PartialBlocksOnlyWhereTheGeometryPads) {
  // fp8_block128 zero-pads edge tiles; the 1xB formats refuse a K that is not whole blocks.
  absl::StatusOr<std::vector<OutputSpec>> fp8 = PlanOutputs(Format::kFp8Block128, DType::kBF16, {2, 130, 200});
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ((*fp8)[1].shape, (Shape{2, 2, 2}));
  EXPECT_FALSE(PlanOutputs(Format::kNvfp4Te, DType::kBF16, {4, 40}).ok());
  absl::StatusOr<std::vector<OutputSpec>> mx4 = PlanOutputs(Format::kMxfp4, DType::kF32, {3, 4, 64});
  ASSERT_TRUE(mx4.ok()) << mx4.status();
  EXPECT_EQ((*mx4)[0].shape, (Shape{3, 4, 2, 16}));
  EXPECT_EQ((*mx4)[1].shape, (Shape{3, 4, 2}));
  EXPECT_FALSE(PlanOutputs(Format::kMxfp8, DType::kBF16, {64}).ok());  // rank 1
  EXPECT_TRUE(PlanOutputs(Format::kFp16, DType::kBF16, {}).ok());      // casts take any rank
}

class EveryFormatTest : public ::testing::TestWithParam<Format> {};

TEST_P(EveryFormatTest, Bf16InputEqualsExactFp32Upcast) {
  const Format f = GetParam();
  std::vector<float> x = o::Weights(2 * 160 * 256, 71);
  std::vector<uint16_t> xb = o::ToBf16(x);
  absl::StatusOr<Quantized> from_f32 = RunQuantizeF32(f, {2, 160, 256}, x);
  absl::StatusOr<Quantized> from_bf16 = RunQuantize(f, DType::kBF16, {2, 160, 256}, xb.data());
  ASSERT_TRUE(from_f32.ok()) << from_f32.status();
  ASSERT_TRUE(from_bf16.ok()) << from_bf16.status();
  EXPECT_EQ(from_f32->parts, from_bf16->parts);
}

TEST_P(EveryFormatTest, RoundToBf16PolicyEqualsQuantizingTheBf16Rounding) {
  const Format f = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> master(64 * 128);
  for (float& v : master) v = normal(rng);  // not bf16-representable
  std::vector<uint16_t> rounded = o::ToBf16(master);
  QuantizeOptions opts;
  opts.fp32_input = Fp32InputPolicy::kRoundToBf16;
  absl::StatusOr<Quantized> a = RunQuantizeF32(f, {64, 128}, master, opts);
  absl::StatusOr<Quantized> b = RunQuantize(f, DType::kBF16, {64, 128}, rounded.data());
  ASSERT_TRUE(a.ok() && b.ok());
  if (f == Format::kFp32) {
    // fp32 output of round_to_bf16 is the bf16 value itself.
    for (size_t i = 0; i < master.size(); ++i) ASSERT_EQ(a->As<float>(0)[i], o::Bf16ToF32(rounded[i]));
  } else {
    EXPECT_EQ(a->parts, b->parts);
  }
  if (f != Format::kBf16) {
    absl::StatusOr<Quantized> exact = RunQuantizeF32(f, {64, 128}, master);
    ASSERT_TRUE(exact.ok());
    EXPECT_NE(exact->parts[0], a->parts[0]) << "fp32 masters must not be silently rounded";
  }
}

TEST_P(EveryFormatTest, RejectsNaNAndInfNamingTensorAndIndex) {
  const Format f = GetParam();
  // K = 128: every quantized format takes it (ct_w4a16's groups are 128 wide).
  std::vector<float> x(32 * 128, 0.5f);
  x[1234] = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<Quantized> q = testing::RunQuantize(f, DType::kF32, {32, 128}, x.data(), {}, std::nullopt,
                                                     "model.layers.3.mlp.down_proj.weight");
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("model.layers.3.mlp.down_proj.weight"), std::string::npos) << q.status();
  EXPECT_NE(q.status().message().find("flat index 1234"), std::string::npos) << q.status();
  x[1234] = 0.5f;
  x[77] = -std::numeric_limits<float>::infinity();
  std::vector<uint16_t> xb = o::ToBf16(std::vector<float>(x.size(), 0.5f));
  xb[77] = 0xFF80;  // bf16 -Inf
  q = testing::RunQuantize(f, DType::kBF16, {32, 128}, xb.data(), {}, std::nullopt, "w");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("flat index 77"), std::string::npos) << q.status();
  QuantizeOptions propagate;
  propagate.nonfinite = NonfinitePolicy::kPropagate;
  EXPECT_TRUE(RunQuantizeF32(f, {32, 128}, x, propagate).ok());
}

// |x - dequant(quant(x))| within each format's element precision (FORMATS.md §2): E4M3 keeps
// 3 mantissa bits (rel 2^-4) plus the subnormal step; E2M1 keeps at most rel 1/4 plus a
// quarter of the block step; casts keep 8 / 11 / 24 bits.
// Element `i` of a BF16 tensor's bytes.
double Bf16At(const std::vector<uint8_t>& bytes, int64_t i) {
  uint16_t h = 0;
  std::memcpy(&h, bytes.data() + i * 2, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST_P(EveryFormatTest, DequantizeErrorWithinBound) {
  const Format f = GetParam();
  const Shape shape = {2, 130, 256};
  std::vector<float> x = o::Weights(2 * 130 * 256, 83);
  absl::StatusOr<Quantized> q = RunQuantizeF32(f, shape, x);
  ASSERT_TRUE(q.ok());
  absl::StatusOr<std::vector<float>> y = testing::RunDequantize(f, shape, *q);
  ASSERT_TRUE(y.ok()) << y.status();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t k = 256, row = static_cast<int64_t>(i) / k, col = static_cast<int64_t>(i) % k;
    double step = 0, rel = 0;  // allowed |err| = rel*|x| + step
    switch (f) {
      case Format::kBf16: rel = std::ldexp(1.0, -8); break;
      case Format::kFp16: rel = std::ldexp(1.0, -11); step = std::ldexp(1.0, -24); break;
      case Format::kFp32: break;
      case Format::kFp8Block128:
      case Format::kFp8Block128Ue8m0: {
        const int64_t b = row / 130, r = row % 130;
        rel = 1.0 / 16;
        step = q->As<float>(1)[(b * 2 + r / 128) * 2 + col / 128] * std::ldexp(1.0, -10);
        // Canonicalization may halve s after the first pass rounded against 2s.
        if (f == Format::kFp8Block128Ue8m0) step *= 2;
        break;
      }
      case Format::kMxfp8:
        rel = 1.0 / 16;
        step = std::ldexp(1.0, q->parts[1][i / 32] - 127) * std::ldexp(1.0, -10);
        break;
      case Format::kNvfp4:
      case Format::kNvfp4Te:
        rel = 0.25;
        step = 0.25 * o::E4m3Value(q->parts[1][i / 16]) * q->As<float>(2)[0];
        break;
      case Format::kMxfp4:
        rel = 0.25;
        step = 0.25 * std::ldexp(1.0, q->parts[1][i / 32] - 127);
        break;
      case Format::kCtFp8Channel:
      case Format::kCtFp8Tensor: {
        // E4M3 of the quotient rounded through BF16 first.
        rel = 1.0 / 16 + 1.0 / 128;
        step = Bf16At(q->parts[1], f == Format::kCtFp8Channel ? row : 0) * std::ldexp(1.0, -9);
        break;
      }
      case Format::kCtNvfp4:
        rel = 0.25;
        step = 0.25 * o::E4m3Value(q->parts[1][i / 16]) / q->As<float>(2)[0];
        break;
      case Format::kCtW4a16:
        rel = 1.0 / 128;
        step = 0.5 * Bf16At(q->parts[1], static_cast<int64_t>(i) / 128);
        break;
    }
    const double err = std::fabs(static_cast<double>(x[i]) - (*y)[i]);
    ASSERT_LE(err, rel * std::fabs(x[i]) + step * 1.0000001) << FormatName(f) << " i=" << i << " x=" << x[i];
    if (x[i] != 0) worst = std::max(worst, err / std::fabs(x[i]));
  }
  if (f == Format::kFp32) {
    EXPECT_EQ(worst, 0.0);
  }
}

TEST_P(EveryFormatTest, ValidatesOutputBuffers) {
  const Format f = GetParam();
  std::vector<float> x(64 * 128, 1.0f);
  absl::StatusOr<std::vector<OutputSpec>> plan = PlanOutputs(f, DType::kF32, {64, 128});
  ASSERT_TRUE(plan.ok());
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<MutableBytes> outs;
  for (const OutputSpec& s : *plan) bufs.emplace_back(s.bytes);
  for (auto& b : bufs) outs.push_back({b.data(), b.size()});
  outs.back().bytes -= 1;
  absl::Status s = Quantize(f, ConstTensor{DType::kF32, {64, 128}, x.data()}, {}, std::nullopt, outs, "w.x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("w.x"), std::string::npos) << s;
  outs.pop_back();
  EXPECT_FALSE(Quantize(f, ConstTensor{DType::kF32, {64, 128}, x.data()}, {}, std::nullopt, outs, "w").ok());
}

INSTANTIATE_TEST_SUITE_P(Table, EveryFormatTest, ::testing::ValuesIn(FormatsWhere(testing::AnyFormat)),
                         FormatParamName);

TEST(CastTest, PassthroughAndRneCasts) {
  std::vector<uint16_t> xb = {0x3F80, 0x8000, 0x7F7F, 0x0001};
  absl::StatusOr<Quantized> q = RunQuantize(Format::kBf16, DType::kBF16, {4}, xb.data());
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(std::memcmp(q->parts[0].data(), xb.data(), 8), 0);
  std::vector<float> x = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -0.0f, 65520.0f};
  q = RunQuantizeF32(Format::kBf16, {4}, x);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->As<uint16_t>(0)[0], 0x3F80);
  EXPECT_EQ(q->As<uint16_t>(0)[1], 0x3F82);
  EXPECT_EQ(q->As<uint16_t>(0)[2], 0x8000);
  q = RunQuantizeF32(Format::kFp16, {4}, x);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->As<uint16_t>(0)[0], 0x3C04);  // 1 + 2^-8 is exact in fp16
  EXPECT_EQ(q->As<uint16_t>(0)[3], 0x7C00);  // 65520 rounds to Inf under RNE
  EXPECT_FALSE(PlanOutputs(Format::kBf16, DType::kI32, {4}).ok());
}

}  // namespace
}  // namespace refit::formats
