// The TRT-LLM / FlashInfer fused-MoE row shuffles and the scale interleave against goldens made by
// FlashInfer 0.7.2.post1's own functions on the CPU (block_scale_interleave: a transcription of
// its host implementation), tests/golden/make_layout_goldens.py.
#include "formats/moe_shuffle.h"

#include <cstring>
#include <vector>

#include "formats/layout.h"
#include "golden_file.h"
#include "gtest/gtest.h"

namespace refit::formats {
namespace {

using golden::FirstDiff;
using golden::Get;
using golden::GoldenTensor;

std::vector<int64_t> SwapHalves(int64_t rows) {
  std::vector<int64_t> s(static_cast<size_t>(rows));
  for (int64_t d = 0; d < rows; ++d) s[static_cast<size_t>(d)] = d < rows / 2 ? d + rows / 2 : d - rows / 2;
  return s;
}

std::vector<int64_t> SwapPairs(int64_t rows) {
  std::vector<int64_t> s(static_cast<size_t>(rows));
  for (int64_t d = 0; d < rows; ++d) s[static_cast<size_t>(d)] = d ^ 1;
  return s;
}

// [batch, rows, row_bytes] through each permutation in turn.
std::vector<uint8_t> Permute(const GoldenTensor& t, const std::vector<std::vector<int64_t>>& steps) {
  const int64_t rows = t.shape[t.shape.size() - 2];
  const uint64_t row_bytes = static_cast<uint64_t>(t.shape.back());
  const int64_t batch = t.shape.size() == 3 ? t.shape[0] : 1;
  std::vector<uint8_t> cur = t.bytes, next(cur.size());
  for (const std::vector<int64_t>& s : steps) {
    EXPECT_EQ(static_cast<int64_t>(s.size()), rows);
    EXPECT_TRUE(PermuteRows(batch, row_bytes, s, cur, next).ok());
    cur.swap(next);
  }
  return cur;
}

std::vector<uint8_t> Interleave(const Shape& shape, const std::vector<uint8_t>& in) {
  Swizzle128x4Geometry g{shape.size() == 3 ? shape[0] : 1, shape[shape.size() - 2], shape.back()};
  std::vector<uint8_t> out(static_cast<size_t>(g.SwizzledBytes()));
  EXPECT_TRUE(Swizzle128x4(g, in, out).ok());
  return out;
}

class MoeShuffleGolden : public ::testing::Test {
 public:
  void Expect(const std::string& name, const std::vector<uint8_t>& got) {
    GoldenTensor want = Get(*file_, name);
    EXPECT_EQ(got.size(), want.bytes.size()) << name;
    EXPECT_EQ(FirstDiff(got, want.bytes), -1) << name << ": first differing byte";
  }

 protected:
  void SetUp() override {
    file_ = golden::OpenLayoutGolden("moe_shuffle.safetensors");
    ASSERT_NE(file_, nullptr);
  }
  std::unique_ptr<SafetensorsFile> file_;
};

// FC1 in the checkpoint's [w1; w3] order -> [w3; w1], gated reorder, shuffle (FlashInfer
// _maybe_get_cached_w3_w1_permute_indices); scales: the same rows, then the 128x4 interleave.
void CheckW13(MoeShuffleGolden& t, const SafetensorsFile& f, const std::string& c) {
  for (const char* part : {"data", "scale"}) {
    GoldenTensor in = Get(f, "in." + c + "." + part);
    const int64_t rows = in.shape[1];
    auto gated = GatedActRowSource(rows);
    auto shuffle = ShuffleMatrixARowSource(rows, 128);
    ASSERT_TRUE(gated.ok() && shuffle.ok());
    std::vector<uint8_t> got = Permute(in, {SwapHalves(rows), *gated, *shuffle});
    if (std::string(part) == "scale") got = Interleave(in.shape, got);
    t.Expect("out." + c + "." + part, got);
  }
}

// FC2: shuffle only; scales shuffled and interleaved.
void CheckW2(MoeShuffleGolden& t, const SafetensorsFile& f, const std::string& c) {
  for (const char* part : {"data", "scale"}) {
    GoldenTensor in = Get(f, "in." + c + "." + part);
    auto shuffle = ShuffleMatrixARowSource(in.shape[1], 128);
    ASSERT_TRUE(shuffle.ok());
    std::vector<uint8_t> got = Permute(in, {*shuffle});
    if (std::string(part) == "scale") got = Interleave(in.shape, got);
    t.Expect("out." + c + "." + part, got);
  }
}

TEST_F(MoeShuffleGolden, Nvfp4W13) { CheckW13(*this, *file_, "nvfp4_w13"); }
TEST_F(MoeShuffleGolden, Mxfp4W13) { CheckW13(*this, *file_, "mxfp4_w13"); }
TEST_F(MoeShuffleGolden, Nvfp4W2) { CheckW2(*this, *file_, "nvfp4_w2"); }
TEST_F(MoeShuffleGolden, Mxfp4W2) { CheckW2(*this, *file_, "mxfp4_w2"); }
TEST_F(MoeShuffleGolden, Nvfp4W2ScaleColumnsPadded) { CheckW2(*this, *file_, "nvfp4_w2_padcols"); }

// gpt-oss on the TRT-LLM MXFP4 MoE: row pairs (g, u) -> (u, g), then the shuffle only.
TEST_F(MoeShuffleGolden, GptOssW13) {
  for (const char* part : {"data", "scale"}) {
    GoldenTensor in = Get(*file_, std::string("in.gptoss_w13.") + part);
    auto shuffle = ShuffleMatrixARowSource(in.shape[1], 128);
    ASSERT_TRUE(shuffle.ok());
    std::vector<uint8_t> got = Permute(in, {SwapPairs(in.shape[1]), *shuffle});
    if (std::string(part) == "scale") got = Interleave(in.shape, got);
    Expect(std::string("out.gptoss_w13.") + part, got);
  }
}

TEST_F(MoeShuffleGolden, EpilogueTile64ShufflesBlocksOf16) {
  GoldenTensor in = Get(*file_, "in.shuffle_tile64.data");
  auto shuffle = ShuffleMatrixARowSource(in.shape[0], 64);
  ASSERT_TRUE(shuffle.ok());
  Expect("out.shuffle_tile64.data", Permute(in, {*shuffle}));
}

TEST_F(MoeShuffleGolden, GatedReorderAlone) {
  GoldenTensor in = Get(*file_, "in.gated_reorder.data");
  auto gated = GatedActRowSource(in.shape[0]);
  ASSERT_TRUE(gated.ok());
  Expect("out.gated_reorder.data", Permute(in, {*gated}));
}

TEST(MoeShuffle, RefusesRowCountsTheKernelsRefuse) {
  auto a = ShuffleMatrixARowSource(48, 128);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("48 rows are not a multiple of 32"), std::string_view::npos) << a.status();
  EXPECT_TRUE(ShuffleMatrixARowSource(48, 64).ok());
  EXPECT_FALSE(ShuffleMatrixARowSource(32, 0).ok());
  auto g = GatedActRowSource(7);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("7 rows are odd"), std::string_view::npos);
}

TEST(MoeShuffle, PermutationsAreBijections) {
  for (int64_t tile : {128, 64}) {
    auto s = ShuffleMatrixARowSource(256, tile);
    ASSERT_TRUE(s.ok());
    std::vector<int> seen(256, 0);
    for (int64_t v : *s) ++seen[static_cast<size_t>(v)];
    for (int n : seen) EXPECT_EQ(n, 1);
  }
}

TEST(MoeShuffle, PermuteRowsChecksSizesAndIndices) {
  std::vector<uint8_t> in(8), out(8);
  std::vector<int64_t> bad = {0, 4};
  EXPECT_FALSE(PermuteRows(1, 4, bad, in, out).ok());
  std::vector<int64_t> ok = {1, 0};
  EXPECT_FALSE(PermuteRows(2, 4, ok, in, out).ok());
  EXPECT_TRUE(PermuteRows(1, 4, ok, in, out).ok());
}

}  // namespace
}  // namespace refit::formats
