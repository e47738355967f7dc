// BatchCopy: one launch copies many regions exactly; bytes outside the regions stay untouched.
// Skips without a CUDA device.
#include "kernels/batch_copy.h"

#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "device_test_util.h"

namespace refit::kernels {
namespace {

TEST(BatchCopyTest, CopiesEveryRegionAndNothingElse) {
  REFIT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1234);
  // Sizes: empty, tiny, unaligned, one chunk, many chunks; offsets aligned and not.
  const std::vector<std::pair<uint64_t, uint64_t>> layout = {
      {0, 0}, {16, 1}, {64, 33}, {1024, 4096}, {8195, 131072}, {200000, 999999}, {1300000, 3}};
  const uint64_t total = 2400000;
  std::vector<uint8_t> src_host(total), dst_host(total, 0x5A);
  for (auto& b : src_host) b = static_cast<uint8_t>(rng());
  void *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, total), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, total), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, src_host.data(), total, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dst, dst_host.data(), total, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<CopyRegion> regions;
  std::vector<uint8_t> expected = dst_host;
  for (auto [offset, bytes] : layout) {
    // Source regions come from a shifted offset, so a wrong source pointer shows.
    const uint64_t src_off = (offset * 7 + 3) % (total - bytes);
    regions.push_back({static_cast<char*>(dst) + offset, static_cast<const char*>(src) + src_off, bytes});
    for (uint64_t i = 0; i < bytes; ++i) expected[offset + i] = src_host[src_off + i];
  }
  absl::StatusOr<std::unique_ptr<BatchCopy>> batch = BatchCopy::Create(regions.data(), regions.size(), nullptr);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_TRUE((*batch)->Launch(nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dst_host.data(), dst, total, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(dst_host, expected);
  uint64_t want = 0;
  for (auto [o, b] : layout) want += b;
  EXPECT_EQ((*batch)->bytes(), want);
  cudaFree(src);
  cudaFree(dst);
}

}  // namespace
}  // namespace refit::kernels
