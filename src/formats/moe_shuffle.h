// Row permutations of the TRT-LLM / FlashInfer fused-MoE weight layouts (FORMATS.md B §8.2,
// §8.3; docs/formats.md "Engine layouts"): `shuffle_matrix_a` for the transposed-MMA epilogue
// and `reorder_rows_for_gated_act_gemm` for the gated (SwiGLU) FC1. Both move whole rows, so
// packed FP4 bytes and byte scales are moved as they are; the scale interleave that
// `shuffle_matrix_sf_a` applies afterwards is Swizzle128x4 (layout.h).
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_MOE_SHUFFLE_H_
#define REFIT_FORMATS_MOE_SHUFFLE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace refit::formats {

// Rows per shuffle block of `shuffle_matrix_a`: 32 when epilogue_tile_m is a multiple of 128,
// else 16 (FlashInfer utils.py::get_shuffle_block_size).
int64_t ShuffleBlockRows(int64_t epilogue_tile_m);

// Source rows of `shuffle_matrix_a(W[rows, K], epilogue_tile_m)`: output row d takes input row
// source[d]. Within each block of B = ShuffleBlockRows rows, output row d comes from input row
// (d % 8) * (B / 8) + d / 8 (FlashInfer utils.py::get_shuffle_matrix_a_row_indices).
// InvalidArgument when rows is not a multiple of B or epilogue_tile_m is not positive.
absl::StatusOr<std::vector<int64_t>> ShuffleMatrixARowSource(int64_t rows, int64_t epilogue_tile_m);

// Source rows of `reorder_rows_for_gated_act_gemm(W[rows, K])`: output row 2i takes row i and
// output row 2i + 1 takes row rows / 2 + i (FlashInfer fused_moe/core.py
// get_reorder_rows_for_gated_act_gemm_row_indices). InvalidArgument when rows is odd.
absl::StatusOr<std::vector<int64_t>> GatedActRowSource(int64_t rows);

// out[b, d, :] = in[b, source[d], :] for each of `batch` matrices of source.size() rows of
// `row_bytes` bytes. InvalidArgument when a buffer size or a source index is out of range.
absl::Status PermuteRows(int64_t batch, uint64_t row_bytes, std::span<const int64_t> source,
                         std::span<const uint8_t> in, std::span<uint8_t> out);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_MOE_SHUFFLE_H_
