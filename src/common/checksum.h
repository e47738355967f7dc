// A fast non-cryptographic 64-bit checksum of byte ranges, used to compare engine storage
// before and after refits and to detect corrupted buckets. Not a security primitive.
// Thread-safe: pure function.
#ifndef REFIT_COMMON_CHECKSUM_H_
#define REFIT_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace refit {

// Deterministic across platforms of the same endianness; equal inputs give equal sums,
// and the empty range gives a fixed value. `seed` chains ranges: Checksum64(b, n2, Checksum64(a, n1)).
uint64_t Checksum64(const void* data, size_t bytes, uint64_t seed = 0);
std::string ChecksumHex(uint64_t sum);

}  // namespace refit

#endif  // REFIT_COMMON_CHECKSUM_H_
