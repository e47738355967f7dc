// Engine-resident scale layouts (FORMATS.md B §8): pure transforms applied to staged
// checkpoint-format scales, never part of a checkpoint. Each has an exact inverse.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_LAYOUT_H_
#define REFIT_FORMATS_LAYOUT_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace refit::formats {

// DeepGEMM packed UE8M0 scales, MN-major and TMA-aligned (B §8.6;
// transform_sf_into_required_layout on SM100). Input: fp32 power-of-two (or zero) scales
// [groups, ceil(mn / gran_mn), k_blocks], row-major. Each of the mn rows takes the scales of
// row-block r / gran_mn; four scale bytes (bits >> 23) pack into one int32 little-endian
// (column 4p in bits 0-7); word (g, r, p) lives at g*aligned_mn*kp + p*aligned_mn + r with
// aligned_mn = align(mn, 4). Padding rows and missing columns are zero bytes. mn need not be
// a multiple of gran_mn (2624 rows with gran_mn 128 are fine).
struct Ue8m0PackGeometry {
  int64_t groups = 1;
  int64_t mn = 0;        // true row count of the weight (or activation)
  int64_t k_blocks = 0;  // scale columns
  int64_t gran_mn = 128; // rows per scale row: 128 for block-128 weights, 1 for MX/1x128

  int64_t ScaleRows() const { return (mn + gran_mn - 1) / gran_mn; }
  int64_t Kp() const { return (k_blocks + 3) / 4; }
  int64_t AlignedMn() const { return (mn + 3) / 4 * 4; }
  int64_t ScaleCount() const { return groups * ScaleRows() * k_blocks; }
  int64_t PackedWords() const { return groups * AlignedMn() * Kp(); }
};

// InvalidArgument when a size mismatches the geometry or a scale is not +0 or a positive
// power of two with a normal exponent ((bits & 0x807FFFFF) != 0; the index is named).
absl::Status PackUe8m0(const Ue8m0PackGeometry& g, std::span<const float> scales,
                       std::span<int32_t> packed);

// The inverse: reads row-block representatives rows 0, gran_mn, 2*gran_mn, ... (not
// mn / gran_mn of them: the last block may be partial) and drops the K padding. Byte b
// decodes to the fp32 with bits b << 23 (byte 0 -> +0).
absl::Status UnpackUe8m0(const Ue8m0PackGeometry& g, std::span<const int32_t> packed,
                         std::span<float> scales);

// 128x4 swizzled scale-factor layout (B §8.1; cuBLAS/CUTLASS block scaling, FlashInfer
// layout_128x4). Input: byte scales [groups, rows, cols] row-major. Output: per group a
// zero-padded buffer of PaddedRows()*PaddedCols() bytes with byte (m, k) at
// ((m/128)*(Kp/4) + k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + k%4.
struct Swizzle128x4Geometry {
  int64_t groups = 1;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t PaddedRows() const { return (rows + 127) / 128 * 128; }
  int64_t PaddedCols() const { return (cols + 3) / 4 * 4; }
  int64_t InputBytes() const { return groups * rows * cols; }
  int64_t SwizzledBytes() const { return groups * PaddedRows() * PaddedCols(); }
};

absl::Status Swizzle128x4(const Swizzle128x4Geometry& g, std::span<const uint8_t> in,
                          std::span<uint8_t> out);
absl::Status Unswizzle128x4(const Swizzle128x4Geometry& g, std::span<const uint8_t> in,
                            std::span<uint8_t> out);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_LAYOUT_H_
