#include "refit/committer.h"

#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace refit {
namespace {

float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu) != 0) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

absl::Status ComputeDerived(const DerivedTarget& d, const storage::ParamInfo& target, const uint8_t* from,
                            uint8_t* out) {
  absl::StatusOr<int64_t> n = NumElements(target.shape);
  if (!n.ok()) return n.status();
  switch (target.dtype) {
    case DType::kBF16:
      for (int64_t i = 0; i < *n; ++i) {
        uint16_t h;
        std::memcpy(&h, from + 2 * i, 2);
        uint16_t r = FloatToBf16(Bf16ToFloat(h) + 1.0f);  // exact in fp32, one rounding to bf16
        std::memcpy(out + 2 * i, &r, 2);
      }
      return absl::OkStatus();
    case DType::kF32:
      for (int64_t i = 0; i < *n; ++i) {
        float f;
        std::memcpy(&f, from + 4 * i, 4);
        f += 1.0f;
        std::memcpy(out + 4 * i, &f, 4);
      }
      return absl::OkStatus();
    default:
      return absl::UnimplementedError(absl::StrCat("derived parameter '", target.name, "': add_one on ",
                                                   DTypeName(target.dtype), " is not supported"));
  }
}

absl::StatusOr<CommitStats> CommitStaged(const Planner& planner, const Staging& staging, Converter& converter,
                                         StagingPool& scratch, const std::vector<size_t>& produced,
                                         storage::EngineStorage& storage) {
  CommitStats stats;
  const auto& params = planner.params();
  const bool device = staging.kind() == storage::MemoryKind::kDevice;
  auto write = [&](size_t index, const uint8_t* src) {
    return device ? storage.WriteFromDevice(index, src) : storage.WriteFromHost(index, src);
  };
  std::set<size_t> staged(produced.begin(), produced.end());
  for (size_t i : produced) {
    const uint8_t* src = staging.Get(i);
    if (src == nullptr) return absl::InternalError(absl::StrCat("parameter '", params[i].name, "' was not staged"));
    REFIT_RETURN_IF_ERROR(write(i, src));
    stats.bytes_written += params[i].nbytes;
    ++stats.params_written;
  }
  for (const DerivedTarget& d : planner.derived()) {
    if (!staged.count(d.from_index)) continue;  // source unchanged in this refit: derived value still valid
    const storage::ParamInfo& target = params[d.target_index];
    REFIT_ASSIGN_OR_RETURN(uint8_t* buf, scratch.Get(d.target_index, target.nbytes));
    REFIT_RETURN_IF_ERROR(converter.Derive(d, target, staging.Get(d.from_index), buf));
    REFIT_RETURN_IF_ERROR(write(d.target_index, buf));
    stats.bytes_written += target.nbytes;
    ++stats.derived_written;
  }
  REFIT_RETURN_IF_ERROR(storage.Flush());
  return stats;
}

}  // namespace refit
