// refit::ParallelChecksum64: its documented definition on small inputs, and the properties a
// corruption detector needs (every byte, every position, the length and the seed matter).
#include "common/parallel_checksum.h"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace refit {
namespace {

// The header's definition, spelled out word by word with shifts (no memcpy, no loop fusion).
uint64_t ByDefinition(const std::vector<uint8_t>& d, uint64_t seed) {
  uint64_t s = 0;
  for (size_t i = 0; 8 * i < d.size(); ++i) {
    uint64_t w = 0;
    for (size_t j = 0; j < 8; ++j) {
      if (8 * i + j < d.size()) w |= static_cast<uint64_t>(d[8 * i + j]) << (8 * j);
    }
    s += ParallelChecksumMix(w + (i + 1) * 0x9E3779B97F4A7C15ULL);
  }
  return ParallelChecksumMix(s ^ ParallelChecksumMix(seed + d.size()));
}

TEST(ParallelChecksumTest, MatchesDefinition) {
  std::mt19937_64 rng(std::random_device{}());
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 100, 4096}) {
    std::vector<uint8_t> d(n);
    for (auto& b : d) b = static_cast<uint8_t>(rng());
    const uint64_t seed = rng();
    EXPECT_EQ(ParallelChecksum64(d.data(), n, seed), ByDefinition(d, seed)) << n;
  }
}

TEST(ParallelChecksumTest, EveryByteLengthAndSeedMatter) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> d(1000);
  for (auto& b : d) b = static_cast<uint8_t>(rng());
  const uint64_t base = ParallelChecksum64(d.data(), d.size());
  for (size_t i = 0; i < d.size(); i += 37) {
    d[i] ^= 1;
    EXPECT_NE(ParallelChecksum64(d.data(), d.size()), base) << i;
    d[i] ^= 1;
  }
  EXPECT_EQ(ParallelChecksum64(d.data(), d.size()), base);
  EXPECT_NE(ParallelChecksum64(d.data(), d.size(), 1), base);
  // Appending a zero byte changes the value although the zero-padded words are identical.
  d.push_back(0);
  EXPECT_NE(ParallelChecksum64(d.data(), d.size()), base);
}

TEST(ParallelChecksumTest, SwappedWordsDiffer) {
  std::vector<uint8_t> d(64);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(i);
  const uint64_t base = ParallelChecksum64(d.data(), d.size());
  std::vector<uint8_t> e = d;
  std::memcpy(e.data(), d.data() + 8, 8);
  std::memcpy(e.data() + 8, d.data(), 8);
  EXPECT_NE(ParallelChecksum64(e.data(), e.size()), base);
}

// The threaded value equals the definition (checked against ByDefinition, not the single-thread
// code) at sizes around the split: several pieces, a ragged last word, every seed.
TEST(ParallelChecksumTest, ThreadsGiveTheDefinitionsValue) {
  std::mt19937_64 rng(42);
  const size_t piece = size_t{8} << 20;  // kParallelCopyMinPiece
  for (size_t n : {size_t{0}, size_t{13}, 2 * piece - 1, 2 * piece + 5, 3 * piece + 4097}) {
    std::vector<uint8_t> d(n);
    for (auto& b : d) b = static_cast<uint8_t>(rng());
    const uint64_t seed = rng();
    const uint64_t want = ByDefinition(d, seed);
    for (size_t threads : {1, 2, 3, 5}) {
      EXPECT_EQ(ParallelChecksum64Threads(d.data(), n, seed, threads), want)
          << n << " bytes, " << threads << " threads";
    }
    if (n > 0) {
      d[n - 1] ^= 0x80;  // the last piece's ragged word counts
      EXPECT_NE(ParallelChecksum64Threads(d.data(), n, seed, 3), want) << n;
    }
  }
}

}  // namespace
}  // namespace refit
