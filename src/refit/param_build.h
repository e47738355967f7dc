// Building one engine parameter from checkpoint-format pieces, as pure functions: transpose
// and shard slicing of a converted tensor, assembly of fused/stacked slots, and the spec's
// engine layout steps (swizzle, UE8M0 packing, row-pair swaps, half swaps, padding). The
// committer (online) and the offline engine layout both call these, so a parameter is always
// rebuilt from staged checkpoint-format data, never from what the engine holds.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_REFIT_PARAM_BUILD_H_
#define REFIT_REFIT_PARAM_BUILD_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "spec/model_spec.h"

namespace refit {

// Swaps the last two dimensions of a dense tensor of `elem_bytes` elements.
void TransposeLast2(const uint8_t* src, const Shape& shape, size_t elem_bytes, uint8_t* dst);

// Copies part `index` of `parts` along `dim` of a dense tensor. REQUIRES: shape[dim] % parts == 0.
void SliceDim(const uint8_t* src, const Shape& shape, size_t elem_bytes, int dim, int64_t parts, int64_t index,
              uint8_t* dst);

// The shape of a parameter assembled from `slot_shapes` (slot order: stack-major, then fuse
// order): fused members are concatenated along dim 0 (0-d members become one element each),
// stacked entries gain a leading dimension. Error when members' trailing dims differ.
absl::StatusOr<Shape> AssembledShape(const spec::Rule& rule, const std::vector<Shape>& slot_shapes);
absl::StatusOr<Shape> AssembledShape(const spec::Rule& rule, std::span<const Shape* const> slot_shapes);

struct Built {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// dtype and shape after the rule's layout steps for outputs with `suffix`. `data_rows` is the
// assembled data tensor's row count (dim -2), which pack_ue8m0 needs; -1 when unknown.
absl::StatusOr<std::pair<DType, Shape>> LayoutShape(const spec::Rule& rule, const std::string& suffix, DType dtype,
                                                    const Shape& shape, int64_t data_rows);

// Applies the rule's layout steps for `suffix` to an assembled parameter, in order.
absl::Status ApplyLayout(const spec::Rule& rule, const std::string& suffix, int64_t data_rows, Built& param);

}  // namespace refit

#endif  // REFIT_REFIT_PARAM_BUILD_H_
