// Test inputs for the GPU quantizer tests: tensor bytes from fp32 values, random values, and
// the FORMATS.md §12.3 edge-value mix. Thread-compatible (callers own the generators).
#ifndef REFIT_TESTS_UNIT_KERNELS_TEST_VALUES_H_
#define REFIT_TESTS_UNIT_KERNELS_TEST_VALUES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "formats/bits.h"

namespace refit::kernels::testing {

// Host tensor bytes of dtype BF16 or F32 built from fp32 values (BF16: RNE).
inline std::vector<uint8_t> Encode(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * DTypeSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kBF16) {
      const uint16_t h = formats::bits::F32ToBf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    }
  }
  return out;
}

inline std::vector<float> RandomValues(int64_t n, std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

// Values that exercise every rule of FORMATS.md §12.3 once placed in 16/32/128-element blocks:
// zero and -0 blocks, saturation points and one ulp around them, E4M3/E2M1 ties after pow2
// scales, subnormals, tiny blocks next to huge ones (NVFP4 scale underflow), subnormals in a block of normal
// scale (quotients below the normal range), mixed magnitudes.
inline std::vector<float> EdgeValues(int64_t n, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<size_t>(n), 0.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  std::uniform_int_distribution<int> exp_pick(-20, 20);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 1.0625f, 1.1875f, 248.0f, 464.0f};
  for (int64_t b0 = 0; b0 < n; b0 += 16) {
    const int kind = pick(rng);
    const float scale = std::ldexp(1.0f, exp_pick(rng));
    for (int64_t i = b0; i < std::min<int64_t>(n, b0 + 16); ++i) {
      float x = 0.0f;
      switch (kind) {
        case 0: x = 0.0f; break;
        case 1: x = -0.0f; break;
        case 2: x = (i % 2 ? -1.0f : 1.0f) * ties[(i / 2) % 11] * scale; break;
        case 3: x = i == b0 ? 448.0f * scale : normal(rng) * scale; break;
        case 4: x = i == b0 ? 6.0f * scale : ties[i % 11] * scale / 4; break;
        case 5: x = i == b0 ? std::nextafter(448.0f * scale, 1e30f) : normal(rng) * scale * 100; break;
        case 6: x = i == b0 ? std::nextafter(6.0f * scale, 0.0f) : normal(rng) * scale; break;
        case 7: x = normal(rng) * 1e-38f; break;                    // fp32 subnormals
        case 8: x = normal(rng) * 1e-7f; break;                     // tiny block
        case 9: x = i == b0 ? 30000.0f : normal(rng) * 1e-3f; break;  // huge outlier
        case 10: x = std::ldexp(1.0f, -10) * (i % 3 == 0 ? 1.0f : 1.0000001f) * scale; break;
        case 11: x = (i % 2 ? -0.0f : 0.0f) + (i == b0 + 5 ? -1e-30f : 0.0f); break;
        case 12: x = i == b0 ? scale : (i % 2 ? -1.0f : 1.0f) * 1e-39f * static_cast<float>(i - b0); break;  // subnormals beside a normal max (quotients below the normal range)
        default: x = normal(rng) * scale; break;
      }
      v[static_cast<size_t>(i)] = x;
    }
  }
  return v;
}

}  // namespace refit::kernels::testing

#endif  // REFIT_TESTS_UNIT_KERNELS_TEST_VALUES_H_
