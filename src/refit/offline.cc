#include "refit/offline.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/format.h"
#include "refit/committer.h"
#include "refit/convert.h"
#include "refit/derived_build.h"
#include "refit/param_build.h"
#include "refit/resolve.h"
#include "refit/staging.h"

namespace refit {
namespace {

// The checkpoint tensor a derived op reads as its scale (the spec's `scale:`), looked up in `pre`
// (name -> what the caller built of it); null when the op reads none.
template <typename Map>
absl::StatusOr<const typename Map::mapped_type*> FindDerivedScale(const spec::Derived& d, const spec::Captures& caps,
                                                                  const std::string& target, const Map& pre) {
  if (!d.scale) return nullptr;
  REFIT_ASSIGN_OR_RETURN(std::string scale_name, d.scale->Expand(caps));
  auto it = pre.find(scale_name);
  if (it == pre.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("derived parameter '", target, "' reads scale '", scale_name, "', which the checkpoint lacks"));
  }
  return &it->second;
}

}  // namespace

absl::StatusOr<std::vector<ConvertedTensor>> ConvertResolved(const spec::ModelSpec& spec, const Resolution& r,
                                                             const InputTensor& in, std::optional<float> amax) {
  std::vector<ConvertedTensor> out;
  for (const ResolvedOutput& o : r.outputs) {
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(o.dtype, o.full_shape));
    out.push_back({o.checkpoint_name, o.dtype, o.full_shape, std::vector<uint8_t>(n)});
  }
  std::vector<formats::MutableBytes> outs;
  for (ConvertedTensor& t : out) outs.push_back({t.bytes.data(), t.bytes.size()});
  const ConvertStep step{r.kind, r.format, r.transpose};
  REFIT_RETURN_IF_ERROR(
      ConvertFull(step, formats::ConstTensor{in.dtype, in.shape, in.data}, spec.options, amax, outs, in.name));
  return out;
}

absl::StatusOr<std::vector<storage::ParamInfo>> ConvertedLayout(const spec::ModelSpec& spec, const std::string& name,
                                                               DType dtype, const Shape& shape) {
  REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, name, dtype, shape));
  std::vector<storage::ParamInfo> out;
  for (const ResolvedOutput& o : r.outputs) {
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(o.dtype, o.full_shape));
    out.push_back({o.checkpoint_name, o.dtype, o.full_shape, n});
  }
  return out;
}

absl::StatusOr<std::vector<ConvertedTensor>> ConvertTensor(const spec::ModelSpec& spec, const std::string& name,
                                                           DType dtype, const Shape& shape, const void* data) {
  REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, name, dtype, shape));
  return ConvertResolved(spec, r, InputTensor{name, dtype, shape, data}, std::nullopt);
}

absl::StatusOr<std::vector<ConvertedTensor>> ConvertCheckpoint(const spec::ModelSpec& spec,
                                                               const std::vector<InputTensor>& inputs) {
  std::vector<Resolution> resolved;
  std::map<std::string, float> group_amax;
  for (const InputTensor& in : inputs) {
    REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, in.name, in.dtype, in.shape));
    if (!r.amax_group.empty()) {
      REFIT_ASSIGN_OR_RETURN(float a,
                             TensorAmax(formats::ConstTensor{in.dtype, in.shape, in.data}, spec.options, in.name));
      auto [it, fresh] = group_amax.emplace(r.amax_group_key, a);
      if (!fresh) it->second = std::max(it->second, a);
    }
    resolved.push_back(std::move(r));
  }
  std::vector<ConvertedTensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Resolution& r = resolved[i];
    std::optional<float> amax;
    if (!r.amax_group.empty()) amax = group_amax[r.amax_group_key];
    REFIT_ASSIGN_OR_RETURN(std::vector<ConvertedTensor> t, ConvertResolved(spec, r, inputs[i], amax));
    for (ConvertedTensor& c : t) out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<std::vector<ConvertedTensor>> EngineLayout(
    const spec::ModelSpec& spec, const std::vector<storage::ParamInfo>& inputs,
    const std::map<std::string, const ConvertedTensor*>& converted) {
  struct Param {
    const spec::Rule* rule;
    std::string suffix;
    std::vector<StagedTensor> slots;
    std::vector<bool> filled;
    std::vector<std::string> keys;
  };
  std::vector<std::string> order;
  std::map<std::string, Param> params;
  std::vector<ConvertedTensor> kept;
  auto find = [&](const std::string& name) -> absl::StatusOr<const ConvertedTensor*> {
    auto it = converted.find(name);
    if (it == converted.end()) return absl::NotFoundError(absl::StrCat("converted checkpoint lacks '", name, "'"));
    return it->second;
  };
  for (const storage::ParamInfo& in : inputs) {
    REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, in.name, in.dtype, in.shape));
    if (r.rule->never) {
      REFIT_ASSIGN_OR_RETURN(const ConvertedTensor* c, find(in.name));
      kept.push_back(*c);
      continue;
    }
    if (r.elsewhere) continue;  // another expert-parallel rank's expert
    for (const ResolvedOutput& o : r.outputs) {
      REFIT_ASSIGN_OR_RETURN(const ConvertedTensor* c, find(o.checkpoint_name));
      if (c->dtype != o.dtype || c->shape != o.full_shape) {
        return absl::InvalidArgumentError(absl::StrCat("converted '", o.checkpoint_name, "' is ", DTypeName(c->dtype),
                                                       ShapeString(c->shape), ", the spec makes it ",
                                                       DTypeName(o.dtype), ShapeString(o.full_shape)));
      }
      auto [it, fresh] = params.try_emplace(o.engine_name);
      Param& p = it->second;
      if (fresh) {
        order.push_back(o.engine_name);
        p.rule = r.rule;
        p.suffix = o.suffix;
        p.slots.resize(static_cast<size_t>(o.slots));
        p.filled.assign(static_cast<size_t>(o.slots), false);
        p.keys.resize(static_cast<size_t>(o.slots));
      }
      const size_t s = static_cast<size_t>(o.slot);
      if (p.filled[s]) return absl::InvalidArgumentError(absl::StrCat("'", o.engine_name, "': slot filled twice"));
      StagedTensor& t = p.slots[s];
      t.dtype = o.dtype;
      t.shape = o.shape;
      REFIT_ASSIGN_OR_RETURN(t.nbytes, DenseBytes(o.dtype, o.shape));
      t.owner.reset(new uint8_t[t.nbytes == 0 ? 1 : t.nbytes], std::default_delete<uint8_t[]>());
      t.data = t.owner.get();
      ShardPart(c->bytes.data(), o.dtype, o.full_shape, r.shard_dim, r.rule->shard ? r.rule->shard->size : 1,
                r.rule->shard ? r.rule->shard->rank : 0, t.data);
      p.filled[s] = true;
      p.keys[s] = o.checkpoint_name;
    }
  }
  std::map<std::string, Built> pre;  // assembled, before layout steps
  for (const std::string& name : order) {
    Param& p = params[name];
    std::vector<const StagedTensor*> pieces;
    for (size_t s = 0; s < p.slots.size(); ++s) {
      if (!p.filled[s]) {
        return absl::InvalidArgumentError(
            absl::StrCat("engine parameter '", name, "': slot ", s, " of ", p.slots.size(), " has no tensor"));
      }
      pieces.push_back(&p.slots[s]);
    }
    REFIT_ASSIGN_OR_RETURN(Built b, AssemblePieces(*p.rule, name, pieces));
    pre.emplace(name, std::move(b));
  }
  std::vector<ConvertedTensor> out;
  for (const std::string& name : order) {
    const Param& p = params[name];
    Built b = pre[name];
    int64_t data_rows = -1;
    if (!p.suffix.empty()) {
      auto d = pre.find(name.substr(0, name.size() - p.suffix.size()));
      if (d != pre.end() && d->second.shape.size() >= 2) data_rows = d->second.shape[d->second.shape.size() - 2];
    }
    REFIT_RETURN_IF_ERROR(ApplyLayout(*p.rule, p.suffix, data_rows, b));
    out.push_back({name, b.dtype, b.shape, std::move(b.bytes)});
  }
  for (const spec::Derived& d : spec.derived) {
    for (const std::string& name : order) {
      std::optional<spec::Captures> caps = d.from.Match(name);
      if (!caps) continue;
      REFIT_ASSIGN_OR_RETURN(std::string target, d.target.Expand(*caps));
      REFIT_ASSIGN_OR_RETURN(const Built* scale, FindDerivedScale(d, *caps, target, pre));
      REFIT_ASSIGN_OR_RETURN(Built b, BuildDerived(d, target, pre[name], scale));
      out.push_back({target, b.dtype, b.shape, std::move(b.bytes)});
    }
  }
  for (ConvertedTensor& k : kept) out.push_back(std::move(k));
  return out;
}

absl::StatusOr<std::vector<storage::ParamInfo>> EngineParamInfos(const spec::ModelSpec& spec,
                                                                 const std::vector<storage::ParamInfo>& inputs) {
  struct Param {
    const spec::Rule* rule;
    std::string suffix;
    DType dtype;
    std::vector<std::optional<Shape>> slots;
  };
  std::vector<std::string> order;
  std::map<std::string, Param> params;
  std::vector<storage::ParamInfo> kept;
  for (const storage::ParamInfo& in : inputs) {
    REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, in.name, in.dtype, in.shape));
    if (r.rule->never) {
      kept.push_back(in);
      continue;
    }
    if (r.elsewhere) continue;
    for (const ResolvedOutput& o : r.outputs) {
      auto [it, fresh] = params.try_emplace(o.engine_name);
      Param& p = it->second;
      if (fresh) {
        order.push_back(o.engine_name);
        p = Param{r.rule, o.suffix, o.dtype, std::vector<std::optional<Shape>>(static_cast<size_t>(o.slots))};
      }
      std::optional<Shape>& slot = p.slots[static_cast<size_t>(o.slot)];
      if (slot) return absl::InvalidArgumentError(absl::StrCat("'", o.engine_name, "': slot filled twice"));
      slot = o.shape;
    }
  }
  std::map<std::string, std::pair<DType, Shape>> pre;  // assembled, before layout steps
  for (const std::string& name : order) {
    const Param& p = params[name];
    std::vector<Shape> shapes;
    for (size_t s = 0; s < p.slots.size(); ++s) {
      if (!p.slots[s]) {
        return absl::InvalidArgumentError(
            absl::StrCat("engine parameter '", name, "': slot ", s, " of ", p.slots.size(), " has no tensor"));
      }
      shapes.push_back(*p.slots[s]);
    }
    REFIT_ASSIGN_OR_RETURN(Shape shape, AssembledShape(*p.rule, shapes));
    pre.emplace(name, std::make_pair(p.dtype, std::move(shape)));
  }
  std::vector<storage::ParamInfo> out;
  for (const std::string& name : order) {
    const Param& p = params[name];
    const auto& [dtype, shape] = pre[name];
    int64_t data_rows = -1;
    if (!p.suffix.empty()) {
      auto d = pre.find(name.substr(0, name.size() - p.suffix.size()));
      if (d != pre.end() && d->second.second.size() >= 2) data_rows = d->second.second[d->second.second.size() - 2];
    }
    REFIT_ASSIGN_OR_RETURN(auto laid, LayoutShape(*p.rule, p.suffix, dtype, shape, data_rows));
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(laid.first, laid.second));
    out.push_back({name, laid.first, laid.second, n});
  }
  for (const spec::Derived& d : spec.derived) {
    for (const std::string& name : order) {
      std::optional<spec::Captures> caps = d.from.Match(name);
      if (!caps) continue;
      REFIT_ASSIGN_OR_RETURN(std::string target, d.target.Expand(*caps));
      const auto& [dtype, shape] = pre[name];
      REFIT_ASSIGN_OR_RETURN(const auto* scale_in, FindDerivedScale(d, *caps, target, pre));
      std::optional<DerivedSource> scale;
      if (scale_in != nullptr) scale = DerivedSource{scale_in->first, scale_in->second};
      REFIT_ASSIGN_OR_RETURN(auto laid, DerivedShape(d, target, {dtype, shape}, scale));
      REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(laid.first, laid.second));
      out.push_back({target, laid.first, laid.second, n});
    }
  }
  for (storage::ParamInfo& k : kept) out.push_back(std::move(k));
  return out;
}

}  // namespace refit
