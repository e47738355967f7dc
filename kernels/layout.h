// Engine-side layout kernels, applied to staged checkpoint-format tensors (FORMATS.md B §8).
// Threading: functions only enqueue work on `stream` (a cudaStream_t as void*); all pointers are
// device memory owned by the caller.
#ifndef REFIT_KERNELS_LAYOUT_H_
#define REFIT_KERNELS_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace refit::kernels {

// DeepGEMM packed UE8M0 scales (B §8.6). `sf`: fp32 powers of two, [groups, ceil(mn/gran_mn), kb]
// row-major (gran_mn = 128 for 128x128 weight scales, 1 for per-row scales). `out`: int32
// [groups, kp, A] with A = align(mn, 4), kp = ceil(kb/4): word (r, p) at p*A + r holds the
// exponent bytes of columns 4p..4p+3 (column 4p in bits 0-7); padding rows and columns are 0.
// Any mn works (2624 included). A scale that is not a power of two (or +0) makes the result
// InvalidArgument after `first_bad` (device, optional) is read back; pass nullptr to skip.
absl::StatusOr<uint64_t> PackUe8m0OutputWords(int64_t groups, int64_t mn, int64_t kb);
absl::Status PackUe8m0Scales(const float* sf, int64_t groups, int64_t mn, int64_t kb, int gran_mn,
                             int32_t* out, uint64_t out_words, unsigned long long* first_bad, void* stream);

// 128x4 swizzled block-scale layout (B §8.1): `s` is [batch, rows, cols] bytes row-major; `out`
// holds batch * ceil(rows/128)*128 * ceil(cols/4)*4 bytes, zero padded.
absl::StatusOr<uint64_t> Swizzle128x4OutputBytes(int64_t batch, int64_t rows, int64_t cols);
absl::Status Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                          uint64_t out_bytes, void* stream);

// Swaps the last two dims of a dense [batch, rows, cols] tensor of `elem_bytes` (1, 2, 4 or 8)
// elements: out[b, j, i] = in[b, i, j]. `in` and `out` must not overlap.
absl::Status TransposeLast2(const void* in, int64_t batch, int64_t rows, int64_t cols, int elem_bytes, void* out,
                            void* stream);

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_LAYOUT_H_
