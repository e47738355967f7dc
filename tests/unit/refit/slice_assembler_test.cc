// SliceAssembler against an independent oracle: slices cut from a whole tensor by index
// arithmetic written here must reassemble to exactly its bytes, whatever the arrival order;
// gaps, overlaps, inconsistent and out-of-range slices are refused naming the tensor.
#include "refit/slice_assembler.h"

#include <cstring>
#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/memory.h"

namespace refit {
namespace {

using ::testing::HasSubstr;

// Element (i0, i1, ..., ) of a row-major tensor: 2-byte elements numbered in order.
std::vector<uint8_t> Whole(const Shape& shape) {
  int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  std::vector<uint8_t> out(static_cast<size_t>(n) * 2);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t v = static_cast<uint16_t>(i * 7919 + 13);
    std::memcpy(out.data() + i * 2, &v, 2);
  }
  return out;
}

// Cuts rows [start, start+len) of dimension `dim` by walking every element's multi-index.
std::vector<uint8_t> Cut(const std::vector<uint8_t>& whole, const Shape& shape, size_t dim, int64_t start, int64_t len) {
  std::vector<uint8_t> out;
  int64_t n = static_cast<int64_t>(whole.size() / 2);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rem = flat, idx_dim = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      int64_t idx = rem % shape[d];
      rem /= shape[d];
      if (d == dim) idx_dim = idx;
    }
    if (idx_dim >= start && idx_dim < start + len) {
      out.push_back(whole[static_cast<size_t>(flat) * 2]);
      out.push_back(whole[static_cast<size_t>(flat) * 2 + 1]);
    }
  }
  return out;
}

TensorDesc SliceDesc(const std::string& name, Shape full, size_t dim, int64_t start, int64_t len) {
  TensorDesc d;
  d.name = name;
  d.dtype = DType::kBF16;
  d.shape = full;
  d.shape[dim] = len;
  d.nbytes = static_cast<uint64_t>(std::accumulate(d.shape.begin(), d.shape.end(), int64_t{1}, std::multiplies<>())) * 2;
  d.slice.dim = static_cast<int32_t>(dim);
  d.slice.start = static_cast<uint64_t>(start);
  d.slice.full_shape = full;
  return d;
}

class SliceAssemblerTest : public ::testing::Test {
 protected:
  std::unique_ptr<storage::Memory> memory_ = storage::NewHostMemory();
};

TEST_F(SliceAssemblerTest, ReassemblesAlongEveryDimensionInAnyOrder) {
  const Shape full = {6, 10, 4};
  const std::vector<uint8_t> whole = Whole(full);
  for (size_t dim = 0; dim < full.size(); ++dim) {
    // Uneven parts, shuffled.
    std::vector<std::pair<int64_t, int64_t>> parts;
    for (int64_t at = 0; at < full[dim];) {
      int64_t len = std::min<int64_t>(full[dim] - at, 1 + (at % 3));
      parts.push_back({at, len});
      at += len;
    }
    std::mt19937 rng(static_cast<unsigned>(dim));
    std::shuffle(parts.begin(), parts.end(), rng);
    SliceAssembler assembler(*memory_, 1 << 20);
    std::optional<SliceAssembler::Whole> got;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::vector<uint8_t> bytes = Cut(whole, full, dim, parts[i].first, parts[i].second);
      absl::StatusOr<std::optional<SliceAssembler::Whole>> r =
          assembler.Add(SliceDesc("w", full, dim, parts[i].first, parts[i].second), bytes.data());
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->has_value(), i + 1 == parts.size()) << "dim " << dim << " part " << i;
      if (r->has_value()) got = std::move(**r);
    }
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->desc.name, "w");
    EXPECT_EQ(got->desc.shape, full);
    EXPECT_FALSE(got->desc.slice.present());
    ASSERT_EQ(got->desc.nbytes, whole.size());
    EXPECT_EQ(std::memcmp(got->data.get(), whole.data(), whole.size()), 0) << "dim " << dim;
    EXPECT_TRUE(assembler.Incomplete().empty());
    EXPECT_EQ(assembler.held_bytes(), 0u);
  }
}

TEST_F(SliceAssemblerTest, GapIsReportedWithTheMissingRange) {
  const Shape full = {8, 4};
  const std::vector<uint8_t> whole = Whole(full);
  SliceAssembler assembler(*memory_, 1 << 20);
  for (auto [start, len] : {std::pair<int64_t, int64_t>{0, 2}, {5, 3}}) {
    std::vector<uint8_t> bytes = Cut(whole, full, 0, start, len);
    auto r = assembler.Add(SliceDesc("layer.0.q", full, 0, start, len), bytes.data());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->has_value());
  }
  std::vector<std::string> incomplete = assembler.Incomplete();
  ASSERT_EQ(incomplete.size(), 1u);
  EXPECT_THAT(incomplete[0], HasSubstr("'layer.0.q'"));
  EXPECT_THAT(incomplete[0], HasSubstr("cover 5 of 8 rows of dimension 0"));
  EXPECT_THAT(incomplete[0], HasSubstr("missing [2, 5)"));
}

TEST_F(SliceAssemblerTest, OverlapIsRefusedAndTheTensorDropped) {
  const Shape full = {8, 4};
  const std::vector<uint8_t> whole = Whole(full);
  SliceAssembler assembler(*memory_, 1 << 20);
  std::vector<uint8_t> a = Cut(whole, full, 0, 0, 5), b = Cut(whole, full, 0, 4, 4), c = Cut(whole, full, 0, 5, 3);
  ASSERT_TRUE(assembler.Add(SliceDesc("w", full, 0, 0, 5), a.data()).ok());
  auto r = assembler.Add(SliceDesc("w", full, 0, 4, 4), b.data());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("'w'"));
  EXPECT_THAT(r.status().message(), HasSubstr("[4, 8) of dimension 0 overlaps the slice [0, 5)"));
  // The tensor is dropped: even a slice that would have completed it is refused.
  r = assembler.Add(SliceDesc("w", full, 0, 5, 3), c.data());
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(assembler.Incomplete().empty());
  EXPECT_EQ(assembler.held_bytes(), 0u);
}

TEST_F(SliceAssemblerTest, InconsistentOrOutOfRangeSlicesAreRefused) {
  const Shape full = {8, 4};
  const std::vector<uint8_t> bytes(64);
  SliceAssembler assembler(*memory_, 1 << 20);
  auto r = assembler.Add(SliceDesc("a", full, 0, 6, 4), bytes.data());
  EXPECT_THAT(r.status().message(), HasSubstr("[6, 10) of dimension 0 lies outside its 8 rows"));
  TensorDesc rank = SliceDesc("b", full, 0, 0, 2);
  rank.slice.full_shape = {8, 4, 1};
  EXPECT_THAT(assembler.Add(rank, bytes.data()).status().message(), HasSubstr("rank"));
  TensorDesc other = SliceDesc("c", full, 0, 0, 2);
  other.shape[1] = 3;
  EXPECT_THAT(assembler.Add(other, bytes.data()).status().message(), HasSubstr("outside dimension 0"));
  ASSERT_TRUE(assembler.Add(SliceDesc("d", full, 0, 0, 2), bytes.data()).ok());
  auto mixed = assembler.Add(SliceDesc("d", full, 1, 0, 2), bytes.data());
  EXPECT_THAT(mixed.status().message(), HasSubstr("disagrees with earlier slices"));
}

TEST_F(SliceAssemblerTest, AssemblyMemoryIsBounded) {
  SliceAssembler assembler(*memory_, 100);
  const std::vector<uint8_t> bytes(64);
  auto r = assembler.Add(SliceDesc("big", {8, 8}, 0, 0, 4), bytes.data());  // needs 128 bytes
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("'big'"));
}

}  // namespace
}  // namespace refit
