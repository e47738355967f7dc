#include "formats/moe_shuffle.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace refit::formats {

int64_t ShuffleBlockRows(int64_t epilogue_tile_m) { return epilogue_tile_m % 128 == 0 ? 32 : 16; }

absl::StatusOr<std::vector<int64_t>> ShuffleMatrixARowSource(int64_t rows, int64_t epilogue_tile_m) {
  if (epilogue_tile_m <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shuffle_matrix_a: epilogue_tile_m ", epilogue_tile_m, " is not positive"));
  }
  const int64_t block = ShuffleBlockRows(epilogue_tile_m);
  if (rows < 0 || rows % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("shuffle_matrix_a: ", rows, " rows are not a multiple of ", block,
                                                   " (epilogue_tile_m ", epilogue_tile_m, ")"));
  }
  std::vector<int64_t> source(static_cast<size_t>(rows));
  const int64_t stride = block / 8;
  for (int64_t d = 0; d < rows; ++d) {
    const int64_t base = d / block * block, r = d % block;
    source[static_cast<size_t>(d)] = base + (r % 8) * stride + r / 8;
  }
  return source;
}

absl::StatusOr<std::vector<int64_t>> GatedActRowSource(int64_t rows) {
  if (rows < 0 || rows % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("reorder_rows_for_gated_act_gemm: ", rows, " rows are odd"));
  }
  std::vector<int64_t> source(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows / 2; ++i) {
    source[static_cast<size_t>(2 * i)] = i;
    source[static_cast<size_t>(2 * i + 1)] = rows / 2 + i;
  }
  return source;
}

absl::Status PermuteRows(int64_t batch, uint64_t row_bytes, std::span<const int64_t> source,
                         std::span<const uint8_t> in, std::span<uint8_t> out) {
  const uint64_t rows = source.size();
  const uint64_t matrix = rows * row_bytes;
  if (batch < 0 || (rows != 0 && row_bytes != 0 && matrix / rows != row_bytes) ||
      in.size() != static_cast<uint64_t>(batch) * matrix || out.size() != in.size()) {
    return absl::InvalidArgumentError(absl::StrCat("row permutation: ", in.size(), " input and ", out.size(),
                                                   " output bytes for ", batch, " x ", rows, " rows of ", row_bytes,
                                                   " bytes"));
  }
  for (uint64_t d = 0; d < rows; ++d) {
    if (source[d] < 0 || static_cast<uint64_t>(source[d]) >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("row permutation: source row ", source[d], " of output row ", d, " is outside ", rows, " rows"));
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    const uint8_t* src = in.data() + static_cast<uint64_t>(b) * matrix;
    uint8_t* dst = out.data() + static_cast<uint64_t>(b) * matrix;
    for (uint64_t d = 0; d < rows; ++d) {
      std::memcpy(dst + d * row_bytes, src + static_cast<uint64_t>(source[d]) * row_bytes, row_bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace refit::formats
