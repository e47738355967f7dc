// Layout steps: the one parser for a rule's `layout:` and a derived `layout` copy's steps
// (Reader::Layout), and which of a rule's outputs a step applies to.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/model_spec.h"
#include "spec/model_spec_internal.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec {
namespace internal {

absl::Status Reader::Layout(const YAML::Node& list, const std::string& where, Rule& rule) const {
  return Layout(list, where, rule.layout, true);
}

absl::Status Reader::Layout(const YAML::Node& list, const std::string& where, std::vector<LayoutStep>& steps,
                            bool with_on) const {
  if (!list.IsSequence()) return Error(list, where, "expected a list of steps");
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node n = list[i];
    std::string w = absl::StrCat(where, "[", i, "]");
    if (with_on) {
      REFIT_RETURN_IF_ERROR(CheckKeys(n, w, {"op", "on", "dim", "multiple", "epilogue_tile_m", "dtype"}));
      if (!n["op"] || !n["on"]) return Error(n, w, "needs 'op' and 'on'");
    } else {
      REFIT_RETURN_IF_ERROR(CheckKeys(n, w, {"op", "dim", "multiple", "epilogue_tile_m", "dtype"}));
      if (!n["op"]) return Error(n, w, "needs 'op'");
    }
    LayoutStep s;
    s.line = n.Mark().line + 1;
    REFIT_ASSIGN_OR_RETURN(std::string op, String(n["op"], w + ".op"));
    if (op == "swizzle_128x4") {
      s.op = LayoutOp::kSwizzle128x4;
    } else if (op == "pack_ue8m0") {
      s.op = LayoutOp::kPackUe8m0;
    } else if (op == "swap_row_pairs") {
      s.op = LayoutOp::kSwapRowPairs;
    } else if (op == "swap_halves") {
      s.op = LayoutOp::kSwapHalves;
    } else if (op == "pad") {
      s.op = LayoutOp::kPad;
    } else if (op == "reorder_rows_for_gated_act_gemm") {
      s.op = LayoutOp::kReorderGatedRows;
    } else if (op == "shuffle_matrix_a") {
      s.op = LayoutOp::kShuffleMatrixA;
    } else if (op == "shuffle_matrix_sf_a") {
      s.op = LayoutOp::kShuffleMatrixSfA;
    } else if (op == "merge_dims") {
      s.op = LayoutOp::kMergeDims;
    } else if (op == "cast_f32") {
      s.op = LayoutOp::kCastF32;
    } else if (op == "view_dtype") {
      s.op = LayoutOp::kViewDtype;
    } else {
      return Error(n["op"], w + ".op",
                   absl::StrCat("unknown op '", op,
                                "' (supported: swizzle_128x4, pack_ue8m0, swap_row_pairs, "
                                "swap_halves, pad, reorder_rows_for_gated_act_gemm, shuffle_matrix_a, "
                                "shuffle_matrix_sf_a, merge_dims, cast_f32, view_dtype)"));
    }
    if (with_on) {
      std::vector<YAML::Node> on;
      if (n["on"].IsSequence()) {
        for (const YAML::Node& o : n["on"]) on.push_back(o);
      } else {
        on.push_back(n["on"]);
      }
      for (const YAML::Node& o : on) {
        // Not REFIT_ASSIGN_OR_RETURN: GCC 12 takes the string it moves into for uninitialized here
        // (-Wmaybe-uninitialized, a false positive) once String is out of line.
        absl::StatusOr<std::string> suffix = String(o, w + ".on");
        if (!suffix.ok()) return suffix.status();
        s.on.push_back(*suffix == "data" ? "" : *suffix);
      }
    } else {
      s.on.push_back("");
    }
    const bool shuffles = s.op == LayoutOp::kShuffleMatrixA || s.op == LayoutOp::kShuffleMatrixSfA;
    if (n["epilogue_tile_m"]) {
      if (!shuffles)
        return Error(n["epilogue_tile_m"], w + ".epilogue_tile_m", absl::StrCat(op, " takes no 'epilogue_tile_m'"));
      REFIT_ASSIGN_OR_RETURN(s.epilogue_tile_m, Int(n["epilogue_tile_m"], w + ".epilogue_tile_m", 1));
    }
    const bool needs_dim = s.op == LayoutOp::kSwapRowPairs || s.op == LayoutOp::kSwapHalves || s.op == LayoutOp::kPad ||
                           s.op == LayoutOp::kMergeDims;
    // The row permutations move the rows along `dim` (default -2), each row all that follows it:
    // gpt-oss's 4-D `_blocks` [E, N, K/32, 16] have their rows at -3, a bias [E, N] at -1.
    const bool rows_dim = s.op == LayoutOp::kReorderGatedRows || s.op == LayoutOp::kShuffleMatrixA;
    if (rows_dim) s.dim = -2;
    if (n["dim"]) {
      if (!needs_dim && !rows_dim) return Error(n["dim"], w + ".dim", absl::StrCat(op, " takes no 'dim'"));
      REFIT_ASSIGN_OR_RETURN(int64_t d, Int(n["dim"], w + ".dim", -8));
      s.dim = static_cast<int>(d);
    } else if (needs_dim) {
      return Error(n, w, absl::StrCat(op, " needs 'dim'"));
    }
    if (n["multiple"]) {
      if (s.op != LayoutOp::kPad) return Error(n["multiple"], w + ".multiple", "only pad takes 'multiple'");
      REFIT_ASSIGN_OR_RETURN(s.multiple, Int(n["multiple"], w + ".multiple", 1));
    } else if (s.op == LayoutOp::kPad) {
      return Error(n, w, "pad needs 'multiple'");
    }
    // view_dtype: the dtype the engine registers the bytes as. Its width is checked against the
    // bytes' dtype when the layout is applied (LayoutShape), where that dtype is known.
    if (n["dtype"]) {
      if (s.op != LayoutOp::kViewDtype) return Error(n["dtype"], w + ".dtype", "only view_dtype takes 'dtype'");
      REFIT_ASSIGN_OR_RETURN(std::string name, String(n["dtype"], w + ".dtype"));
      absl::StatusOr<DType> dtype = ParseDType(name);
      if (!dtype.ok()) return Error(n["dtype"], w + ".dtype", dtype.status().message());
      s.dtype = *dtype;
    } else if (s.op == LayoutOp::kViewDtype) {
      return Error(n, w, "view_dtype needs 'dtype'");
    }
    steps.push_back(std::move(s));
  }
  return absl::OkStatus();
}

}  // namespace internal

bool LayoutStep::AppliesTo(std::string_view suffix) const {
  for (const std::string& s : on) {
    if (s == suffix) return true;
  }
  return false;
}

}  // namespace refit::spec
