#include "common/parallel_checksum.h"

#include <atomic>
#include <cstring>

#include "common/parallel_copy.h"

namespace refit {
namespace {

// S of the header's definition over the bytes [0, bytes) at `p`, whose first word is word
// `first_word` of the whole range.
uint64_t WordSum(const unsigned char* p, size_t bytes, size_t first_word) {
  uint64_t sum = 0;
  const size_t words = (bytes + 7) / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = 0;
    const size_t take = bytes - 8 * i < 8 ? bytes - 8 * i : 8;
    if (take == 8) {
      std::memcpy(&w, p + 8 * i, 8);  // little-endian hosts only, like the device
    } else {
      for (size_t j = 0; j < take; ++j) w |= static_cast<uint64_t>(p[8 * i + j]) << (8 * j);
    }
    sum += ParallelChecksumMix(w + (first_word + i + 1) * kParallelChecksumPosition);
  }
  return sum;
}

uint64_t Finish(uint64_t sum, size_t bytes, uint64_t seed) {
  return ParallelChecksumMix(sum ^ ParallelChecksumMix(seed + bytes));
}

}  // namespace

uint64_t ParallelChecksum64(const void* data, size_t bytes, uint64_t seed) {
  return Finish(WordSum(static_cast<const unsigned char*>(data), bytes, 0), bytes, seed);
}

uint64_t ParallelChecksum64Threads(const void* data, size_t bytes, uint64_t seed, size_t threads) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::atomic<uint64_t> sum{0};
  // Pieces start on 4 KiB boundaries, so each begins at a whole word.
  ForEachPiece(bytes, threads == 0 ? ParallelCopyThreads() : threads, [&](size_t, size_t begin, size_t len) {
    sum.fetch_add(WordSum(p + begin, len, begin / 8), std::memory_order_relaxed);
  });
  return Finish(sum.load(), bytes, seed);
}

}  // namespace refit
