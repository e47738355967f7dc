#include "common/checksum.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace refit {
namespace {

// Four independent multiply-rotate lanes over 32-byte stripes, then a final avalanche.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Round(uint64_t acc, uint64_t in) { return Rotl(acc + in * kP2, 31) * kP1; }
inline uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    v1 = Round(v1, Load64(p + i));
    v2 = Round(v2, Load64(p + i + 8));
    v3 = Round(v3, Load64(p + i + 16));
    v4 = Round(v4, Load64(p + i + 24));
  }
  uint64_t h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18) + bytes;
  for (; i + 8 <= bytes; i += 8) h = Rotl(h ^ Round(0, Load64(p + i)), 27) * kP1 + kP3;
  for (; i < bytes; ++i) h = Rotl(h ^ (p[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string ChecksumHex(uint64_t sum) { return absl::StrFormat("%016x", sum); }

}  // namespace refit
