#include "refit/param_build.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/bits.h"
#include "formats/layout.h"
#include "formats/moe_shuffle.h"

namespace refit {
namespace {

int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

absl::StatusOr<int> NormDim(int dim, const Shape& shape, const char* op) {
  int d = dim < 0 ? dim + static_cast<int>(shape.size()) : dim;
  if (d < 0 || d >= static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dim ", dim, " is outside a tensor of shape ", ShapeString(shape)));
  }
  return d;
}

// The dim whose rows a row permutation moves: the step's `dim` (-2 unless the spec gave one);
// shuffle_matrix_sf_a's rows are always dim -2 (the 128x4 interleave that follows is 2-D).
int RowsDim(const spec::LayoutStep& step) { return step.op == spec::LayoutOp::kShuffleMatrixSfA ? -2 : step.dim; }

// out[o, perm(i), :] = in[o, i, :] along dim d.
template <typename Perm>
void PermuteDim(const std::vector<uint8_t>& in, const Shape& shape, size_t elem, int d, Perm perm,
                std::vector<uint8_t>& out) {
  const int64_t outer = Product(shape, 0, static_cast<size_t>(d));
  const int64_t n = shape[static_cast<size_t>(d)];
  const size_t inner = static_cast<size_t>(Product(shape, static_cast<size_t>(d) + 1, shape.size())) * elem;
  out.assign(in.size(), 0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(out.data() + (o * n + perm(i)) * inner, in.data() + (o * n + i) * inner, inner);
    }
  }
}

bool IsByte(DType t) { return DTypeSize(t) == 1; }

}  // namespace

void TransposeLast2(const uint8_t* src, const Shape& shape, size_t elem, uint8_t* dst) {
  const size_t r = shape.size();
  const int64_t rows = shape[r - 2], cols = shape[r - 1];
  const int64_t batch = Product(shape, 0, r - 2);
  for (int64_t b = 0; b < batch; ++b) {
    const uint8_t* s = src + static_cast<size_t>(b * rows * cols) * elem;
    uint8_t* d = dst + static_cast<size_t>(b * rows * cols) * elem;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        std::memcpy(d + static_cast<size_t>(j * rows + i) * elem, s + static_cast<size_t>(i * cols + j) * elem, elem);
      }
    }
  }
}

void SliceDim(const uint8_t* src, const Shape& shape, size_t elem, int dim, int64_t parts, int64_t index,
              uint8_t* dst) {
  const int64_t outer = Product(shape, 0, static_cast<size_t>(dim));
  const int64_t n = shape[static_cast<size_t>(dim)];
  const size_t inner = static_cast<size_t>(Product(shape, static_cast<size_t>(dim) + 1, shape.size())) * elem;
  const int64_t chunk = n / parts;
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + static_cast<size_t>(o * chunk) * inner, src + static_cast<size_t>(o * n + index * chunk) * inner,
                static_cast<size_t>(chunk) * inner);
  }
}

absl::StatusOr<Shape> AssembledShape(const spec::Rule& rule, const std::vector<Shape>& slot_shapes) {
  std::vector<const Shape*> shapes;
  shapes.reserve(slot_shapes.size());
  for (const Shape& s : slot_shapes) shapes.push_back(&s);
  return AssembledShape(rule, shapes);
}

absl::StatusOr<Shape> AssembledShape(const spec::Rule& rule, std::span<const Shape* const> slot_shapes) {
  const int64_t members = rule.fuse ? static_cast<int64_t>(rule.fuse->order.size()) : 1;
  // Stacked: the rank's experts (all of them, or its share under expert_parallel).
  const int64_t entries = rule.stack ? static_cast<int64_t>(slot_shapes.size()) / members : 1;
  if (static_cast<int64_t>(slot_shapes.size()) != members * entries || entries == 0 ||
      (rule.stack && rule.stack->count % entries != 0)) {
    return absl::InternalError(absl::StrCat(rule.Describe(), ": ", slot_shapes.size(), " slots, expected ",
                                            members * entries));
  }
  // A fused member of no dimensions counts as one row. Compared in place: a stacked parameter has
  // a slot per expert, and this runs for every parameter of every commit.
  static const Shape kOneRow = {1};
  auto member = [&](int64_t e, int64_t m) -> const Shape& {
    const Shape& s = *slot_shapes[static_cast<size_t>(e * members + m)];
    return rule.fuse && s.empty() ? kOneRow : s;
  };
  Shape entry_shape;
  for (int64_t e = 0; e < entries; ++e) {
    const Shape& first = member(e, 0);
    int64_t rows = members > 1 ? first[0] : 0;  // a fused member has a dim 0 (kOneRow at least)
    for (int64_t m = 1; m < members; ++m) {
      const Shape& s = member(e, m);
      if (s.size() != first.size() || !std::equal(s.begin() + 1, s.end(), first.begin() + 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            rule.Describe(), ": fused members disagree beyond dim 0: ", ShapeString(first), " and ", ShapeString(s)));
      }
      rows += s[0];
    }
    if (e == 0) {
      entry_shape = first;
      if (members > 1) entry_shape[0] = rows;
      continue;
    }
    const bool same = members > 1 ? first.size() == entry_shape.size() && rows == entry_shape[0] &&
                                        std::equal(first.begin() + 1, first.end(), entry_shape.begin() + 1)
                                  : first == entry_shape;
    if (!same) {
      Shape fused = first;
      if (members > 1) fused[0] = rows;
      return absl::InvalidArgumentError(absl::StrCat(rule.Describe(), ": stacked entry ", e, " is ", ShapeString(fused),
                                                     ", entry 0 is ", ShapeString(entry_shape)));
    }
  }
  if (rule.stack) entry_shape.insert(entry_shape.begin(), entries);
  return entry_shape;
}

absl::StatusOr<std::pair<DType, Shape>> LayoutShape(const spec::Rule& rule, const std::string& suffix, DType dtype,
                                                    const Shape& shape, int64_t data_rows) {
  Shape s = shape;
  for (const spec::LayoutStep& step : rule.layout) {
    if (!step.AppliesTo(suffix)) continue;
    std::string where = absl::StrCat(rule.Describe(), " layout step (line ", step.line, ") on '", suffix, "'");
    switch (step.op) {
      case spec::LayoutOp::kSwizzle128x4: {
        if (!IsByte(dtype) || s.size() < 2) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": swizzle_128x4 takes byte scales of rank >= 2, not ",
                                                         DTypeName(dtype), ShapeString(s)));
        }
        formats::Swizzle128x4Geometry g{Product(s, 0, s.size() - 2), s[s.size() - 2], s[s.size() - 1]};
        s[s.size() - 2] = g.PaddedRows();
        s[s.size() - 1] = g.PaddedCols();
        break;
      }
      case spec::LayoutOp::kPackUe8m0: {
        if (dtype != DType::kF32 || s.size() < 2) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": pack_ue8m0 takes F32 scales of rank >= 2, not ", DTypeName(dtype), ShapeString(s)));
        }
        if (data_rows < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": the data tensor's rows are unknown"));
        formats::Ue8m0PackGeometry g{Product(s, 0, s.size() - 2), data_rows, s[s.size() - 1], 128};
        if (g.ScaleRows() != s[s.size() - 2]) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": ", s[s.size() - 2], " scale rows do not cover ",
                                                         data_rows, " data rows in 128-row blocks"));
        }
        s[s.size() - 2] = g.Kp();
        s[s.size() - 1] = g.AlignedMn();
        dtype = DType::kI32;
        break;
      }
      case spec::LayoutOp::kSwapRowPairs:
      case spec::LayoutOp::kSwapHalves: {
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(step.dim, s, "swap"));
        if (s[static_cast<size_t>(d)] % 2 != 0) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": dim ", d, " of ", ShapeString(s), " is odd"));
        }
        break;
      }
      case spec::LayoutOp::kPad: {
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(step.dim, s, "pad"));
        int64_t& n = s[static_cast<size_t>(d)];
        n = (n + step.multiple - 1) / step.multiple * step.multiple;
        break;
      }
      case spec::LayoutOp::kMergeDims: {
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(step.dim, s, "merge_dims"));
        const size_t dz = static_cast<size_t>(d);
        if (dz + 1 >= s.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": merge_dims needs a dim after dim ", d, " of ", ShapeString(s)));
        }
        s[dz] *= s[dz + 1];
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(dz) + 1);
        break;
      }
      case spec::LayoutOp::kCastF32: {
        if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": cast_f32 takes BF16, F16 or F32 values, not ", DTypeName(dtype), ShapeString(s)));
        }
        dtype = DType::kF32;
        break;
      }
      case spec::LayoutOp::kViewDtype: {
        if (DTypeSize(dtype) != DTypeSize(step.dtype)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": view_dtype reads ", DTypeName(dtype), ShapeString(s),
                                                         " as ", DTypeName(step.dtype), ", a dtype of another width"));
        }
        dtype = step.dtype;
        break;
      }
      case spec::LayoutOp::kReorderGatedRows:
      case spec::LayoutOp::kShuffleMatrixA:
      case spec::LayoutOp::kShuffleMatrixSfA: {
        if (s.size() < 2) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": a row permutation takes rank >= 2, not ", ShapeString(s)));
        }
        const int row_dim = static_cast<int>(s.size()) - 2;
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(RowsDim(step), s, "row permutation"));
        if (step.op == spec::LayoutOp::kShuffleMatrixSfA && d != row_dim) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": shuffle_matrix_sf_a permutes dim -2"));
        }
        const int64_t rows = s[static_cast<size_t>(d)];
        if (step.op == spec::LayoutOp::kReorderGatedRows) {
          absl::StatusOr<std::vector<int64_t>> src = formats::GatedActRowSource(rows);
          if (!src.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", src.status().message()));
          break;
        }
        absl::StatusOr<std::vector<int64_t>> src = formats::ShuffleMatrixARowSource(rows, step.epilogue_tile_m);
        if (!src.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", src.status().message()));
        if (step.op == spec::LayoutOp::kShuffleMatrixSfA) {
          // FlashInfer get_shuffle_matrix_sf_a_row_indices asserts M % 128 == 0.
          if (!IsByte(dtype) || rows % 128 != 0) {
            return absl::InvalidArgumentError(absl::StrCat(where,
                                                           ": shuffle_matrix_sf_a takes byte scales of a row count "
                                                           "that is a multiple of 128, not ",
                                                           DTypeName(dtype), ShapeString(s)));
          }
          formats::Swizzle128x4Geometry g{Product(s, 0, s.size() - 2), rows, s[s.size() - 1]};
          s[s.size() - 1] = g.PaddedCols();
        }
        break;
      }
    }
  }
  return std::make_pair(dtype, s);
}

absl::Status ApplyLayout(const spec::Rule& rule, const std::string& suffix, int64_t data_rows, Built& p) {
  for (const spec::LayoutStep& step : rule.layout) {
    if (!step.AppliesTo(suffix)) continue;
    spec::Rule one = rule;
    one.layout = {step};
    REFIT_ASSIGN_OR_RETURN(auto next, LayoutShape(one, suffix, p.dtype, p.shape, data_rows));
    REFIT_ASSIGN_OR_RETURN(uint64_t nbytes, DenseBytes(next.first, next.second));
    std::vector<uint8_t> out;
    const size_t elem = DTypeSize(p.dtype);
    switch (step.op) {
      case spec::LayoutOp::kSwizzle128x4: {
        const Shape& s = p.shape;
        formats::Swizzle128x4Geometry g{Product(s, 0, s.size() - 2), s[s.size() - 2], s[s.size() - 1]};
        out.assign(nbytes, 0);
        REFIT_RETURN_IF_ERROR(formats::Swizzle128x4(g, p.bytes, out));
        break;
      }
      case spec::LayoutOp::kPackUe8m0: {
        const Shape& s = p.shape;
        formats::Ue8m0PackGeometry g{Product(s, 0, s.size() - 2), data_rows, s[s.size() - 1], 128};
        std::vector<float> scales(p.bytes.size() / 4);
        std::memcpy(scales.data(), p.bytes.data(), p.bytes.size());
        std::vector<int32_t> packed(static_cast<size_t>(g.PackedWords()));
        absl::Status st = formats::PackUe8m0(g, scales, packed);
        if (!st.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(rule.Describe(), " pack_ue8m0: ", st.message()));
        }
        out.assign(nbytes, 0);
        std::memcpy(out.data(), packed.data(), nbytes);
        break;
      }
      case spec::LayoutOp::kSwapRowPairs: {
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(step.dim, p.shape, "swap_row_pairs"));
        PermuteDim(p.bytes, p.shape, elem, d, [](int64_t i) { return i ^ 1; }, out);
        break;
      }
      case spec::LayoutOp::kSwapHalves: {
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(step.dim, p.shape, "swap_halves"));
        const int64_t half = p.shape[static_cast<size_t>(d)] / 2;
        PermuteDim(p.bytes, p.shape, elem, d, [half](int64_t i) { return i < half ? i + half : i - half; }, out);
        break;
      }
      case spec::LayoutOp::kPad: {
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(step.dim, p.shape, "pad"));
        const int64_t outer = Product(p.shape, 0, static_cast<size_t>(d));
        const size_t inner = static_cast<size_t>(Product(p.shape, static_cast<size_t>(d) + 1, p.shape.size())) * elem;
        const int64_t n = p.shape[static_cast<size_t>(d)], np = next.second[static_cast<size_t>(d)];
        out.assign(nbytes, 0);
        for (int64_t o = 0; o < outer; ++o) {
          std::memcpy(out.data() + static_cast<size_t>(o * np) * inner, p.bytes.data() + static_cast<size_t>(o * n) * inner,
                      static_cast<size_t>(n) * inner);
        }
        break;
      }
      case spec::LayoutOp::kMergeDims:
      case spec::LayoutOp::kViewDtype:
        out = std::move(p.bytes);  // a view: the same bytes
        break;
      case spec::LayoutOp::kCastF32: {
        const size_t n = p.bytes.size() / elem;
        out.assign(nbytes, 0);
        for (size_t i = 0; i < n; ++i) {
          float f;
          if (p.dtype == DType::kF32) {
            std::memcpy(&f, p.bytes.data() + i * 4, 4);
          } else {
            uint16_t h;
            std::memcpy(&h, p.bytes.data() + i * 2, 2);
            f = p.dtype == DType::kBF16 ? formats::bits::Bf16ToF32(h) : formats::bits::F16ToF32(h);
          }
          std::memcpy(out.data() + i * 4, &f, 4);
        }
        break;
      }
      case spec::LayoutOp::kReorderGatedRows:
      case spec::LayoutOp::kShuffleMatrixA:
      case spec::LayoutOp::kShuffleMatrixSfA: {
        const Shape& s = p.shape;
        REFIT_ASSIGN_OR_RETURN(int d, NormDim(RowsDim(step), s, "row permutation"));
        const size_t dz = static_cast<size_t>(d);
        const int64_t rows = s[dz];
        absl::StatusOr<std::vector<int64_t>> src = step.op == spec::LayoutOp::kReorderGatedRows
                                                       ? formats::GatedActRowSource(rows)
                                                       : formats::ShuffleMatrixARowSource(rows, step.epilogue_tile_m);
        if (!src.ok()) return src.status();
        const int64_t batch = Product(s, 0, dz);
        std::vector<uint8_t> rows_out(p.bytes.size());
        REFIT_RETURN_IF_ERROR(formats::PermuteRows(batch, static_cast<uint64_t>(Product(s, dz + 1, s.size())) * elem,
                                                   *src, p.bytes, rows_out));
        if (step.op != spec::LayoutOp::kShuffleMatrixSfA) {
          out = std::move(rows_out);
          break;
        }
        formats::Swizzle128x4Geometry g{batch, rows, s[s.size() - 1]};
        out.assign(nbytes, 0);
        REFIT_RETURN_IF_ERROR(formats::Swizzle128x4(g, rows_out, out));
        break;
      }
    }
    p.dtype = next.first;
    p.shape = next.second;
    p.bytes = std::move(out);
  }
  return absl::OkStatus();
}

}  // namespace refit
