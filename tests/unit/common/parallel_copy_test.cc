// refit::ParallelCopy: every byte lands where memcpy would put it, for sizes around the split
// thresholds, unaligned ends and several callers at once.
#include "common/parallel_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace refit {
namespace {

std::vector<unsigned char> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
  }
  return v;
}

TEST(ParallelCopyTest, CopiesEveryByteAtEverySplit) {
  const size_t m = kParallelCopyMinPiece;
  for (size_t threads : {1, 2, 3, 4, 7}) {
    for (size_t n : {size_t{0}, size_t{1}, m - 1, 2 * m - 1, 2 * m, 2 * m + 13, 5 * m + 4097, 9 * m + 3}) {
      // Source and destination start at odd offsets: pieces need no alignment.
      const std::vector<unsigned char> src = Random(n + 3, n * 31 + threads);
      std::vector<unsigned char> dst(n + 5, 0xA5);
      ParallelCopy(dst.data() + 1, src.data() + 3, n, threads);
      EXPECT_EQ(dst[0], 0xA5) << "wrote before the destination: n=" << n << " threads=" << threads;
      for (size_t k = n + 1; k < dst.size(); ++k) {
        ASSERT_EQ(dst[k], 0xA5) << "wrote past the destination: n=" << n << " threads=" << threads;
      }
      EXPECT_EQ(std::memcmp(dst.data() + 1, src.data() + 3, n), 0) << "n=" << n << " threads=" << threads;
    }
  }
}

TEST(ParallelCopyTest, CallersAtOnceEachGetTheirOwnBytes) {
  constexpr int kCallers = 4;
  const size_t n = 3 * kParallelCopyMinPiece + 777;
  std::vector<std::vector<unsigned char>> src(kCallers), dst(kCallers);
  for (int c = 0; c < kCallers; ++c) {
    src[c] = Random(n, 1000 + c);
    dst[c].assign(n, 0);
  }
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 3; ++round) ParallelCopy(dst[c].data(), src[c].data(), n, 4);
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(dst[c], src[c]) << "caller " << c;
}

TEST(ParallelCopyTest, DefaultThreadsIsAtLeastOne) {
  EXPECT_GE(ParallelCopyThreads(), 1u);
  EXPECT_LE(ParallelCopyThreads(), 64u);
  const std::vector<unsigned char> src = Random(2 * kParallelCopyMinPiece + 1, 7);
  std::vector<unsigned char> dst(src.size());
  ParallelCopy(dst.data(), src.data(), src.size());
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace refit
