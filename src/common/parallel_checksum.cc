#include "common/parallel_checksum.h"

#include <cstring>

namespace refit {

uint64_t ParallelChecksum64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
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
    sum += ParallelChecksumMix(w + (i + 1) * kParallelChecksumPosition);
  }
  return ParallelChecksumMix(sum ^ ParallelChecksumMix(seed + bytes));
}

}  // namespace refit
