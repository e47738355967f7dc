#include "refit/resolve.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "formats/format_info.h"

namespace refit {
namespace {

absl::Status Bad(const std::string& name, const spec::Rule& rule, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", rule.Describe(), ": ", msg));
}

}  // namespace

absl::StatusOr<std::string> SourceName(const spec::Rule& rule, const spec::Captures& target_captures, int64_t slot,
                                       const std::string& suffix) {
  spec::Captures caps = target_captures;
  const int64_t members = rule.fuse ? static_cast<int64_t>(rule.fuse->order.size()) : 1;
  if (rule.fuse) caps[rule.fuse->capture] = rule.fuse->order[static_cast<size_t>(slot % members)];
  if (rule.stack) caps[rule.stack->capture] = absl::StrCat(slot / members);
  REFIT_ASSIGN_OR_RETURN(std::string base, rule.match.Expand(caps));
  return base + suffix;
}

int64_t RankSlots(const spec::ModelSpec& spec, const spec::Rule& rule) {
  if (!rule.stack || spec.ep_size <= 1) return rule.Slots();
  return rule.Slots() / spec.ep_size;
}

int64_t FirstSlot(const spec::ModelSpec& spec, const spec::Rule& rule) {
  if (!rule.stack || spec.ep_size <= 1) return 0;
  return RankSlots(spec, rule) * spec.ep_rank;
}

absl::StatusOr<Resolution> Resolve(const spec::ModelSpec& spec, const std::string& name, DType dtype,
                                   const Shape& shape) {
  REFIT_ASSIGN_OR_RETURN(const spec::Rule* rule, spec.RuleFor(name));
  Resolution res;
  res.rule = rule;
  res.input_shape = shape;
  std::optional<spec::Captures> caps = rule->match.Match(name);
  if (!caps) caps = spec::Captures{};
  if (rule->never) {
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(dtype, shape));
    (void)n;
    res.outputs.push_back({name, "", dtype, shape, shape, name, 0, 1});
    return res;
  }
  // Conversion.
  spec::Conversion conv = rule->conversion;
  formats::Format format = rule->format;
  if (conv == spec::Conversion::kCheckpoint) {
    std::optional<formats::Format> f = spec.checkpoint->FormatForTensor(name);
    if (f) {
      conv = spec::Conversion::kFormat;
      format = *f;
    } else {
      conv = spec::Conversion::kAuto;
    }
  }
  res.conversion = conv;
  std::vector<formats::OutputSpec> outs;
  if (conv == spec::Conversion::kFormat) {
    if (dtype != DType::kBF16 && dtype != DType::kF32) {
      return Bad(name, *rule, absl::StrCat("quantizes to ", formats::FormatName(format),
                                           ", which takes BF16 or F32 input, not ", DTypeName(dtype)));
    }
    if (rule->transpose) {
      if (shape.size() < 2) return Bad(name, *rule, "transpose needs a tensor of rank 2 or more");
      std::swap(res.input_shape[shape.size() - 1], res.input_shape[shape.size() - 2]);
      res.transpose = true;
    }
    absl::StatusOr<std::vector<formats::OutputSpec>> o = formats::PlanOutputs(format, dtype, res.input_shape);
    if (!o.ok()) return Bad(name, *rule, o.status().message());
    outs = std::move(*o);
    res.kind = ConvertKind::kQuantize;
    res.format = format;
    res.quantized = formats::Info(format).quantized;
    if (!res.quantized && dtype == outs[0].dtype) res.kind = ConvertKind::kCopy;
  } else {
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(dtype, shape));
    outs.push_back({"", dtype, shape, n});
    res.kind = ConvertKind::kCopy;
  }
  // Target and slot.
  std::string base = name;
  int64_t slot = 0, slots = RankSlots(spec, *rule);
  if (rule->target) {
    REFIT_ASSIGN_OR_RETURN(base, rule->target->Expand(*caps));
  }
  const int64_t members = rule->fuse ? static_cast<int64_t>(rule->fuse->order.size()) : 1;
  int64_t member = 0;
  if (rule->fuse) {
    const std::string& v = (*caps)[rule->fuse->capture];
    auto it = std::find(rule->fuse->order.begin(), rule->fuse->order.end(), v);
    if (it == rule->fuse->order.end()) {
      return Bad(name, *rule, absl::StrCat("{", rule->fuse->capture, "}='", v, "' is not in the fuse order [",
                                           absl::StrJoin(rule->fuse->order, ", "), "]"));
    }
    member = it - rule->fuse->order.begin();
    // Members are fused along rows, so a format blocked along rows needs whole row blocks in
    // every member but the last.
    const int64_t block_rows = res.quantized ? formats::Info(format).block.rows : 1;
    if (block_rows > 1 && member + 1 < members && res.input_shape.size() >= 2 &&
        res.input_shape[res.input_shape.size() - 2] % block_rows != 0) {
      return Bad(name, *rule,
                 absl::StrCat("fused member with ", res.input_shape[res.input_shape.size() - 2],
                              " rows is not the last of its fusion and its rows are not a multiple of ", block_rows,
                              ": the fused ", formats::FormatName(format), " scale blocks would not line up"));
    }
  }
  int64_t entry = 0;
  if (rule->stack) {
    const std::string& v = (*caps)[rule->stack->capture];
    if (!absl::SimpleAtoi(v, &entry) || entry < 0 || entry >= rule->stack->count) {
      return Bad(name, *rule, absl::StrCat("{", rule->stack->capture, "}='", v, "' is not an index below ",
                                           rule->stack->count));
    }
  }
  slot = entry * members + member - FirstSlot(spec, *rule);
  if (slot < 0 || slot >= slots) {
    res.elsewhere = true;  // another expert-parallel rank's expert
    slot = 0;
  }
  // Shard.
  if (rule->shard) {
    const size_t rank = res.input_shape.size();
    int d = rule->shard->dim < 0 ? rule->shard->dim + static_cast<int>(rank) : rule->shard->dim;
    if (d < 0 || d >= static_cast<int>(rank)) {
      return Bad(name, *rule, absl::StrCat("shard dim ", rule->shard->dim, " is outside a rank-", rank, " tensor"));
    }
    const int64_t n = res.input_shape[static_cast<size_t>(d)], parts = rule->shard->size;
    if (n % parts != 0) {
      return Bad(name, *rule, absl::StrCat("dim ", d, " (", n, ") does not split into ", parts, " tensor-parallel parts"));
    }
    const int64_t block = res.quantized ? formats::BlockAlong(format, d, rank) : 1;
    // A [1] global scale or compressed-tensors' weight_shape is one whole value per rank, which
    // the per-rank split of every output does not express.
    if (res.quantized && parts > 1) {
      for (const formats::OutputRole& role : formats::Info(format).Outputs()) {
        if (role.shape == formats::OutputShape::kSingle || role.shape == formats::OutputShape::kShapeVector) {
          return Bad(name, *rule,
                     absl::StrCat(formats::FormatName(format),
                                  " tensors cannot be split into tensor-parallel parts: "
                                  "its '",
                                  std::string(role.suffix), "' output is whole on every rank"));
        }
      }
    }
    // Scales spanning the whole dimension (per-channel scales along K) have one element along it:
    // every rank holds them whole (SplitsOutput), as computed from the whole tensor.
    if (block != formats::kWholeDim && (n / parts) % block != 0 && n / parts != 0) {
      return Bad(name, *rule,
                 absl::StrCat("splitting dim ", d, " (", n, ") into ", parts, " tensor-parallel parts gives ", n / parts,
                              " per rank, which cuts a ", block, "-element ", formats::FormatName(format),
                              " block"));
    }
    res.shard_dim = d;
  }
  res.outputs.reserve(outs.size());
  for (formats::OutputSpec& o : outs) {
    ResolvedOutput r;
    r.checkpoint_name = name + o.suffix;
    r.suffix = o.suffix;
    r.dtype = o.dtype;
    r.full_shape = o.shape;
    r.shape = o.shape;
    if (res.shard_dim && SplitsOutput(o.shape, res.shard_dim, rule->shard->size)) {
      r.shape[static_cast<size_t>(*res.shard_dim)] /= rule->shard->size;
    }
    r.engine_name = base + o.suffix;
    r.slot = slot;
    r.slots = slots;
    res.outputs.push_back(std::move(r));
  }
  if (res.quantized && formats::NeedsGlobalAmax(format) && rule->fuse) {
    spec::Captures c = *caps;
    for (const std::string& v : rule->fuse->order) {
      c[rule->fuse->capture] = v;
      REFIT_ASSIGN_OR_RETURN(std::string member_name, rule->match.Expand(c));
      res.amax_group.push_back(std::move(member_name));
    }
    res.amax_group_key = absl::StrCat(base, "#", entry);
  }
  return res;
}

}  // namespace refit
