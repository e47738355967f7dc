#include "client/trainer_convert.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "formats/format_info.h"
#include "refit/convert.h"
#if REFIT_CLIENT_KERNELS
#include <cuda_runtime_api.h>

#include "../cuda_device.h"
#endif

namespace refit::client {
namespace {

// BF16 bits of a random normal value times `scale`.
std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) {
    float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
  return out;
}

WirePlan PlanFor(formats::Format f, const Shape& shape, bool transpose) {
  Shape q = shape;
  if (transpose) std::swap(q[q.size() - 1], q[q.size() - 2]);
  WirePlan plan;
  WireTensor w;
  w.name = "w";
  w.format = formats::FormatName(f);
  w.transpose = transpose;
  const std::vector<formats::OutputSpec> specs = formats::PlanOutputs(f, DType::kBF16, q).value();
  for (const formats::OutputSpec& o : specs) w.outputs.push_back({o.suffix, o.dtype, o.shape});
  plan.tensors.push_back(w);
  return plan;
}

// The outputs refitd computes for the same tensor (refit::ConvertFull, the daemon's host path).
std::vector<std::vector<uint8_t>> Reference(formats::Format f, const Shape& shape, bool transpose, const void* data) {
  Shape q = shape;
  if (transpose) std::swap(q[q.size() - 1], q[q.size() - 2]);
  std::vector<std::vector<uint8_t>> out;
  std::vector<formats::MutableBytes> bufs;
  const std::vector<formats::OutputSpec> specs = formats::PlanOutputs(f, DType::kBF16, q).value();
  for (const formats::OutputSpec& o : specs) out.emplace_back(o.bytes);
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  EXPECT_TRUE(ConvertFull(ConvertStep{ConvertKind::kQuantize, f, transpose}, {DType::kBF16, shape, data}, {},
                          std::nullopt, bufs, "w")
                  .ok());
  return out;
}

struct Case {
  formats::Format format;
  Shape shape;
  bool transpose;
};

const Case kCases[] = {
    {formats::Format::kFp8Block128, {300, 200}, false},
    {formats::Format::kFp8Block128, {2, 256, 130}, true},
    {formats::Format::kFp8Block128Ue8m0, {256, 384}, false},
    {formats::Format::kMxfp8, {64, 96}, false},
    {formats::Format::kNvfp4, {2, 64, 48}, false},
    {formats::Format::kNvfp4Te, {32, 64}, true},
    {formats::Format::kMxfp4, {64, 128}, false},
    {formats::Format::kCtFp8Channel, {48, 100}, false},
    {formats::Format::kCtFp8Tensor, {2, 32, 64}, false},
    {formats::Format::kCtNvfp4, {32, 64}, true},
    {formats::Format::kCtW4a16, {16, 256}, false},
};

// kCases names formats by hand (each needs a shape it takes); every quantized row of the format
// table must have one, so that a new format is converted on the trainer's side too.
TEST(TrainerConvertTest, CasesCoverEveryQuantizedFormat) {
  for (const formats::FormatInfo& row : formats::AllFormats()) {
    if (!row.quantized) continue;
    bool found = false;
    for (const Case& c : kCases) found = found || c.format == row.format;
    EXPECT_TRUE(found) << "trainer_convert_test.cc kCases has no case for format " << row.name;
  }
}

TEST(TrainerConvertTest, HostConversionIsRefitdsConversion) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(formats::FormatName(c.format));
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    std::vector<uint16_t> in = RandomBf16(static_cast<size_t>(n), 7);
    absl::StatusOr<TrainerConverter> conv = TrainerConverter::Create(PlanFor(c.format, c.shape, c.transpose));
    ASSERT_TRUE(conv.ok()) << conv.status();
    const TrainerConverter::Entry* e = conv->Find("w");
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(conv->CheckInput(*e, DType::kBF16, c.shape).ok());
    std::vector<std::vector<uint8_t>> got;
    std::vector<formats::MutableBytes> bufs;
    for (const formats::OutputSpec& o : e->outputs) got.emplace_back(o.bytes);
    for (auto& o : got) bufs.push_back({o.data(), o.size()});
    ASSERT_TRUE(conv->ConvertHost(*e, DType::kBF16, c.shape, in.data(), bufs).ok());
    EXPECT_EQ(got, Reference(c.format, c.shape, c.transpose, in.data()));
  }
}

TEST(TrainerConvertTest, RefusesPushesAndPlansItCannotConvert) {
  absl::StatusOr<TrainerConverter> conv = TrainerConverter::Create(PlanFor(formats::Format::kMxfp8, {64, 96}, false));
  ASSERT_TRUE(conv.ok());
  absl::Status st = conv->CheckInput(*conv->Find("w"), DType::kBF16, {64, 64});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'w': pushed as BF16[64,64]"), std::string::npos) << st;
  EXPECT_EQ(conv->Find("other"), nullptr);
  WirePlan bad = PlanFor(formats::Format::kMxfp8, {64, 96}, false);
  bad.tensors[0].format = "int3";
  EXPECT_EQ(TrainerConverter::Create(bad).status().code(), absl::StatusCode::kUnimplemented);
  bad = PlanFor(formats::Format::kMxfp8, {64, 96}, false);
  bad.tensors[0].outputs.pop_back();
  EXPECT_EQ(TrainerConverter::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainerConvertTest, BlockAlignedSlicesConvertOnTheirOwnAndCuttingSlicesAreRefused) {
  const Shape full = {384, 256};
  std::vector<uint16_t> in = RandomBf16(384 * 256, 5);
  absl::StatusOr<TrainerConverter> conv = TrainerConverter::Create(PlanFor(formats::Format::kFp8Block128, full, false));
  ASSERT_TRUE(conv.ok());
  const TrainerConverter::Entry& e = *conv->Find("w");
  std::vector<std::vector<uint8_t>> whole = Reference(formats::Format::kFp8Block128, full, false, in.data());
  // Rows [256, 384): data rows 256.., scale row 2 of the whole outputs.
  const Shape part = {128, 256};
  absl::StatusOr<std::vector<TrainerConverter::SliceOutput>> outs = conv->SliceOutputs(e, DType::kBF16, part, {0, 256, full});
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_EQ(outs->size(), 2u);
  EXPECT_EQ((*outs)[0].slice.start, 256u);
  EXPECT_EQ((*outs)[1].slice.start, 2u);
  EXPECT_EQ((*outs)[1].shape, (Shape{1, 2}));
  std::vector<uint8_t> data(128 * 256), scale(8);
  std::vector<formats::MutableBytes> bufs = {{data.data(), data.size()}, {scale.data(), scale.size()}};
  ASSERT_TRUE(conv->ConvertHost(e, DType::kBF16, part, in.data() + 256 * 256, bufs).ok());
  EXPECT_EQ(data, std::vector<uint8_t>(whole[0].begin() + 256 * 256, whole[0].end()));
  EXPECT_EQ(scale, std::vector<uint8_t>(whole[1].begin() + 16, whole[1].end()));
  absl::Status cut = conv->SliceOutputs(e, DType::kBF16, {64, 256}, {0, 64, full}).status();
  EXPECT_EQ(cut.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cut.message().find("must not cut its 128-element blocks"), std::string::npos) << cut;
}

TEST(TrainerConvertTest, Nvfp4SlicesEncodeAgainstTheWholeTensorsAmax) {
  // Rows [32, 64) of a [64, 64] NVFP4 tensor, converted with the whole tensor's amax (as the ranks
  // holding it reduce it): the whole outputs' rows, and the whole tensor's global scale, unsliced.
  const Shape full = {64, 64};
  std::vector<uint16_t> in = RandomBf16(64 * 64, 7, 3.0f);
  absl::StatusOr<TrainerConverter> nv = TrainerConverter::Create(PlanFor(formats::Format::kNvfp4, full, false));
  ASSERT_TRUE(nv.ok());
  const TrainerConverter::Entry& e = *nv->Find("w");
  EXPECT_FALSE(TrainerConverter::NeedsReducedAmax(e, false));
  EXPECT_TRUE(TrainerConverter::NeedsReducedAmax(e, true));
  absl::StatusOr<std::vector<TrainerConverter::SliceOutput>> outs =
      nv->SliceOutputs(e, DType::kBF16, {32, 64}, {0, 32, full});
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_EQ(outs->size(), 3u);
  EXPECT_EQ((*outs)[0].slice.start, 32u);
  EXPECT_EQ((*outs)[1].slice.start, 32u);
  EXPECT_FALSE((*outs)[2].slice.present());
  std::vector<std::vector<uint8_t>> whole = Reference(formats::Format::kNvfp4, full, false, in.data());
  const float amax = TensorAmax({DType::kBF16, full, in.data()}, {}, "w").value();
  std::vector<uint8_t> data(32 * 32), scale(32 * 4), scale_2(4);
  std::vector<formats::MutableBytes> bufs = {{data.data(), data.size()}, {scale.data(), scale.size()},
                                             {scale_2.data(), scale_2.size()}};
  ASSERT_TRUE(nv->ConvertHost(e, DType::kBF16, {32, 64}, in.data() + 32 * 64, bufs, amax).ok());
  EXPECT_EQ(data, std::vector<uint8_t>(whole[0].begin() + 32 * 32, whole[0].end()));
  EXPECT_EQ(scale, std::vector<uint8_t>(whole[1].begin() + 32 * 4, whole[1].end()));
  EXPECT_EQ(scale_2, whole[2]);
  // An amax below the bytes' own max|x| is refused naming the tensor.
  absl::Status low = nv->ConvertHost(e, DType::kBF16, {32, 64}, in.data() + 32 * 64, bufs, amax / 4);
  EXPECT_EQ(low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(low.message().find("'w'"), std::string::npos) << low;
  // A fused group member always needs the group's amax.
  WirePlan grouped = PlanFor(formats::Format::kNvfp4, full, false);
  grouped.tensors[0].amax_group = {"w", "w2"};
  absl::StatusOr<TrainerConverter> g = TrainerConverter::Create(grouped);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(TrainerConverter::NeedsReducedAmax(*g->Find("w"), false));
  EXPECT_EQ(g->Find("w")->amax_group, (std::vector<std::string>{"w", "w2"}));
}

TEST(TrainerConvertTest, DeviceConversionEqualsHostByteForByte) {
#if REFIT_CLIENT_KERNELS
  REFIT_SKIP_WITHOUT_GPU();
  for (const Case& c : kCases) {
    SCOPED_TRACE(formats::FormatName(c.format));
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    std::vector<uint16_t> in = RandomBf16(static_cast<size_t>(n), 11, 3.0f);
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, in.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, in.data(), in.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    absl::StatusOr<TrainerConverter> conv = TrainerConverter::Create(PlanFor(c.format, c.shape, c.transpose));
    ASSERT_TRUE(conv.ok());
    absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> outs =
        conv->ConvertDevice(*conv->Find("w"), DType::kBF16, c.shape, dev);
    ASSERT_TRUE(outs.ok()) << outs.status();
    std::vector<std::vector<uint8_t>> want = Reference(c.format, c.shape, c.transpose, in.data());
    ASSERT_EQ(outs->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      std::vector<uint8_t> got(want[i].size());
      ASSERT_EQ(cudaMemcpy(got.data(), (*outs)[i].get(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, want[i]) << "output " << i;
    }
    cudaFree(dev);
  }
  std::printf("trainer-side GPU conversion equals the CPU reference for %zu cases\n", std::size(kCases));
#else
  std::printf("skipped: built without CUDA kernels\n");
  GTEST_SKIP() << "built without CUDA kernels";
#endif
}

}  // namespace
}  // namespace refit::client
