// Independent reference conversions for the format tests. They are written from the format
// definitions (value tables, nearest-value search in double precision, powers of two via
// ldexp), never from src/formats/bits.h, so a bit trick that is wrong there fails here.
#ifndef REFIT_TESTS_UNIT_FORMATS_ORACLE_H_
#define REFIT_TESTS_UNIT_FORMATS_ORACLE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace refit::formats::oracle {

inline uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Value of E4M3FN code c (0..126 for the finite magnitudes), from the format definition.
inline double E4m3Value(int c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (c & 0x80) ? -v : v;
}

// Nearest E4M3 code, ties to the even code, saturating at 448; NaN -> 0x7F with the sign.
inline uint8_t E4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  double a = std::fabs(static_cast<double>(x));
  if (a > 448.0) a = 448.0;
  int best = 0;
  double best_err = a;
  for (int c = 1; c <= 0x7E; ++c) {
    const double err = std::fabs(a - E4m3Value(c));
    if (err < best_err || (err == best_err && (c % 2 == 0))) {
      best = c;
      best_err = err;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

inline constexpr double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Nearest E2M1 magnitude index, ties to the even index, saturating at 6; NaN -> 7.
inline uint8_t E2m1Mag(float x) {
  if (std::isnan(x)) return 7;
  double a = std::fabs(static_cast<double>(x));
  if (a > 6.0) a = 6.0;
  int best = 0;
  double best_err = a;
  for (int c = 1; c < 8; ++c) {
    const double err = std::fabs(a - kE2m1[c]);
    if (err < best_err || (err == best_err && (c % 2 == 0))) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

inline double E2m1Value(uint8_t code) { return (code & 8 ? -1 : 1) * kE2m1[code & 7]; }

// Smallest k in [lo, hi] with 2^k >= v (hi when none).
inline int CeilPow2Exp(double v, int lo, int hi) {
  for (int k = lo; k <= hi; ++k) {
    if (std::ldexp(1.0, k) >= v) return k;
  }
  return hi;
}

// Nearest BF16 of a finite fp32, ties to even, by comparing the two bracketing candidates.
inline uint16_t Bf16(float x) {
  const uint32_t b = Bits(x);
  const uint16_t lo = static_cast<uint16_t>(b >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double vx = x;
  const double vlo = FromBits(static_cast<uint32_t>(lo) << 16);
  const double vhi = std::isinf(FromBits(static_cast<uint32_t>(hi) << 16))
                         ? std::ldexp(std::copysign(1.0, vx), 128)
                         : static_cast<double>(FromBits(static_cast<uint32_t>(hi) << 16));
  const double elo = std::fabs(vx - vlo), ehi = std::fabs(vx - vhi);
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo % 2 == 0) ? lo : hi;
}

inline float Bf16ToF32(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

// Random bf16-representable weights: N(0, sigma) with a few large outliers and exact zeros.
inline std::vector<float> Weights(size_t n, uint32_t seed, float sigma = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::uniform_int_distribution<int> pick(0, 999);
  std::vector<float> w(n);
  for (float& v : w) {
    const int p = pick(rng);
    v = p == 0 ? 0.0f : (p == 1 ? normal(rng) * 40.0f : normal(rng));
    v = Bf16ToF32(Bf16(v));
  }
  return w;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16(v[i]);
  return out;
}

}  // namespace refit::formats::oracle

#endif  // REFIT_TESTS_UNIT_FORMATS_ORACLE_H_
