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

// CopyRegions: regions in the kernel's parameters, more than one launch's worth (300 > 128),
// sizes from empty to several blocks, aligned and unaligned: every region copied, nothing else.
TEST(BatchCopyTest, CopyRegionsCopiesEveryRegionOverSeveralLaunches) {
  REFIT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(99);
  const uint64_t total = 64ull << 20;
  std::vector<uint8_t> src_host(total), dst_host(total, 0xA5);
  for (auto& b : src_host) b = static_cast<uint8_t>(rng());
  void *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, total), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, total), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, src_host.data(), total, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dst, dst_host.data(), total, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<CopyRegion> regions;
  std::vector<uint8_t> expected = dst_host;
  uint64_t offset = 0;
  for (int i = 0; i < 300; ++i) {
    // Mostly scale-sized pieces (96 KiB), some empty, tiny, unaligned or several blocks long.
    uint64_t bytes = i % 50 == 7 ? 0 : i % 10 == 3 ? rng() % 100 : i % 25 == 1 ? (1u << 20) + 5 : 98304;
    offset += i % 3 == 0 ? 16 : 1 + rng() % 15;
    ASSERT_LT(offset + bytes, total);
    const uint64_t src_off = (offset * 13 + 7) % (total - bytes);
    regions.push_back({static_cast<char*>(dst) + offset, static_cast<const char*>(src) + src_off, bytes});
    for (uint64_t k = 0; k < bytes; ++k) expected[offset + k] = src_host[src_off + k];
    offset += bytes;
  }
  ASSERT_TRUE(CopyRegions(regions.data(), regions.size(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dst_host.data(), dst, total, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(dst_host, expected);
  cudaFree(src);
  cudaFree(dst);
}

}  // namespace
}  // namespace refit::kernels
