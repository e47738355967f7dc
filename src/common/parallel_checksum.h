// A 64-bit checksum whose value does not depend on the order in which the data is visited, so a
// GPU can compute it at memory bandwidth (kernels/checksum.h) and the CPU can check it here.
// Definition: split the bytes into little-endian 64-bit words w_i (the last one zero-padded);
// S = sum over i of Mix(w_i + (i + 1) * kPosition) mod 2^64; result = Mix(S ^ Mix(seed + bytes)).
// Mix is the SplitMix64 finalizer (a bijection), so any single changed or moved word changes S.
// Not a security primitive. Thread-safe: pure function.
#ifndef REFIT_COMMON_PARALLEL_CHECKSUM_H_
#define REFIT_COMMON_PARALLEL_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace refit {

inline constexpr uint64_t kParallelChecksumPosition = 0x9E3779B97F4A7C15ULL;

constexpr uint64_t ParallelChecksumMix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

// `seed` chains ranges: ParallelChecksum64(b, n2, ParallelChecksum64(a, n1)).
uint64_t ParallelChecksum64(const void* data, size_t bytes, uint64_t seed = 0);
// The same value, the range split over up to `threads` host threads (common/parallel_copy.h
// ForEachPiece: each sums its words, the sums are added); 0 threads: ParallelCopyThreads().
uint64_t ParallelChecksum64Threads(const void* data, size_t bytes, uint64_t seed = 0, size_t threads = 0);

}  // namespace refit

#endif  // REFIT_COMMON_PARALLEL_CHECKSUM_H_
