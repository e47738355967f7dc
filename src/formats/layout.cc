#include "formats/layout.h"

#include <algorithm>
#include <cstring>

#include "formats/message.h"
#include "formats/bits.h"

namespace refit::formats {
namespace {

absl::Status CheckSize(std::string_view what, size_t got, int64_t want) {
  if (want < 0 || static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(Msg(what, " has ", got, " elements, expected ", want));
  }
  return absl::OkStatus();
}

absl::Status CheckUe8m0Geometry(const Ue8m0PackGeometry& g) {
  if (g.groups < 0 || g.mn < 0 || g.k_blocks < 0 || g.gran_mn < 1) {
    return absl::InvalidArgumentError(Msg("bad UE8M0 pack geometry: groups=", g.groups,
                                                   " mn=", g.mn, " k_blocks=", g.k_blocks,
                                                   " gran_mn=", g.gran_mn));
  }
  return absl::OkStatus();
}

int64_t SwizzleOffset(int64_t m, int64_t k, int64_t kp) {
  return ((m / 128) * (kp / 4) + k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + k % 4;
}

absl::Status CheckSwizzleGeometry(const Swizzle128x4Geometry& g) {
  if (g.groups < 0 || g.rows < 0 || g.cols < 0) {
    return absl::InvalidArgumentError(Msg("bad swizzle geometry: groups=", g.groups,
                                                   " rows=", g.rows, " cols=", g.cols));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PackUe8m0(const Ue8m0PackGeometry& g, std::span<const float> scales,
                       std::span<int32_t> packed) {
  if (absl::Status s = CheckUe8m0Geometry(g); !s.ok()) return s;
  if (absl::Status s = CheckSize("scales", scales.size(), g.ScaleCount()); !s.ok()) return s;
  if (absl::Status s = CheckSize("packed", packed.size(), g.PackedWords()); !s.ok()) return s;
  for (size_t i = 0; i < scales.size(); ++i) {
    if ((bits::F32Bits(scales[i]) & 0x807FFFFFu) != 0) {
      return absl::InvalidArgumentError(Msg(
          "scale ", scales[i], " at flat index ", i, " is not zero or a positive power of two"));
    }
  }
  std::fill(packed.begin(), packed.end(), 0);
  const int64_t rows = g.ScaleRows(), kp = g.Kp(), a = g.AlignedMn();
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    const float* sg = scales.data() + grp * rows * g.k_blocks;
    int32_t* pg = packed.data() + grp * a * kp;
    for (int64_t r = 0; r < g.mn; ++r) {
      const float* srow = sg + (r / g.gran_mn) * g.k_blocks;
      for (int64_t p = 0; p < kp; ++p) {
        uint32_t word = 0;
        for (int64_t j = 0; j < 4 && 4 * p + j < g.k_blocks; ++j) {
          word |= (bits::F32Bits(srow[4 * p + j]) >> 23) << (8 * j);
        }
        pg[p * a + r] = static_cast<int32_t>(word);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status UnpackUe8m0(const Ue8m0PackGeometry& g, std::span<const int32_t> packed,
                         std::span<float> scales) {
  if (absl::Status s = CheckUe8m0Geometry(g); !s.ok()) return s;
  if (absl::Status s = CheckSize("packed", packed.size(), g.PackedWords()); !s.ok()) return s;
  if (absl::Status s = CheckSize("scales", scales.size(), g.ScaleCount()); !s.ok()) return s;
  const int64_t rows = g.ScaleRows(), kp = g.Kp(), a = g.AlignedMn();
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    const int32_t* pg = packed.data() + grp * a * kp;
    float* sg = scales.data() + grp * rows * g.k_blocks;
    for (int64_t sr = 0; sr < rows; ++sr) {
      const int64_t r = sr * g.gran_mn;  // first row of the block; r < mn by construction
      for (int64_t c = 0; c < g.k_blocks; ++c) {
        const uint32_t word = static_cast<uint32_t>(pg[(c / 4) * a + r]);
        const uint32_t byte = (word >> (8 * (c % 4))) & 0xFFu;
        sg[sr * g.k_blocks + c] = bits::F32FromBits(byte << 23);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Swizzle128x4(const Swizzle128x4Geometry& g, std::span<const uint8_t> in,
                          std::span<uint8_t> out) {
  if (absl::Status s = CheckSwizzleGeometry(g); !s.ok()) return s;
  if (absl::Status s = CheckSize("input", in.size(), g.InputBytes()); !s.ok()) return s;
  if (absl::Status s = CheckSize("output", out.size(), g.SwizzledBytes()); !s.ok()) return s;
  std::fill(out.begin(), out.end(), 0);
  const int64_t per_group = g.PaddedRows() * g.PaddedCols();
  const int64_t kp = g.PaddedCols();
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    const uint8_t* ig = in.data() + grp * g.rows * g.cols;
    uint8_t* og = out.data() + grp * per_group;
    for (int64_t m = 0; m < g.rows; ++m) {
      for (int64_t k = 0; k < g.cols; ++k) og[SwizzleOffset(m, k, kp)] = ig[m * g.cols + k];
    }
  }
  return absl::OkStatus();
}

absl::Status Unswizzle128x4(const Swizzle128x4Geometry& g, std::span<const uint8_t> in,
                            std::span<uint8_t> out) {
  if (absl::Status s = CheckSwizzleGeometry(g); !s.ok()) return s;
  if (absl::Status s = CheckSize("input", in.size(), g.SwizzledBytes()); !s.ok()) return s;
  if (absl::Status s = CheckSize("output", out.size(), g.InputBytes()); !s.ok()) return s;
  const int64_t per_group = g.PaddedRows() * g.PaddedCols();
  const int64_t kp = g.PaddedCols();
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    const uint8_t* ig = in.data() + grp * per_group;
    uint8_t* og = out.data() + grp * g.rows * g.cols;
    for (int64_t m = 0; m < g.rows; ++m) {
      for (int64_t k = 0; k < g.cols; ++k) og[m * g.cols + k] = ig[SwizzleOffset(m, k, kp)];
    }
  }
  return absl::OkStatus();
}

}  // namespace refit::formats
