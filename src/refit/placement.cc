#include "refit/placement.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"

namespace refit {

std::shared_ptr<const Placement> PlanPlacement(const Planner& planner, const storage::EngineStorage& storage,
                                               const std::vector<std::shared_ptr<const TensorPlan>>& plans) {
  // What the manifest stages under each key, and how many slots each key fills.
  absl::flat_hash_map<std::string, const Target*> by_key;
  absl::flat_hash_map<std::string, int> uses;
  for (const std::shared_ptr<const TensorPlan>& plan : plans) {
    for (const Target& t : plan->targets) {
      by_key.try_emplace(t.key, &t);
      ++uses[t.key];
    }
  }
  auto placement = std::make_shared<Placement>();
  auto places = std::make_shared<Placement::Places>();
  const std::vector<storage::ParamInfo>& params = planner.params();
  placement->bases.assign(params.size(), nullptr);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSource& src = planner.source(i);
    if (src.kind != ParamSource::Kind::kBuilt || src.slots.empty()) continue;
    const bool laid_out = std::any_of(src.rule->layout.begin(), src.rule->layout.end(),
                                      [&](const spec::LayoutStep& step) { return step.AppliesTo(src.suffix); });
    uint8_t* base = storage.MappedAddress(i);
    if (laid_out || base == nullptr) continue;
    const storage::ParamInfo& p = params[i];
    std::vector<Placement::Place> pieces;
    uint64_t offset = 0;
    bool whole = true;
    for (size_t s = 0; s < src.slots.size() && whole; ++s) {
      auto it = by_key.find(src.slots[s]);
      const Target* t = it == by_key.end() ? nullptr : it->second;
      whole = t != nullptr && uses[src.slots[s]] == 1 && t->engine_index == i && t->slot == static_cast<int64_t>(s) &&
              t->spec.dtype == p.dtype && t->spec.bytes <= p.nbytes - std::min(offset, p.nbytes) &&
              (src.slots.size() > 1 || t->spec.shape == p.shape);
      if (whole) {
        pieces.push_back({static_cast<uint32_t>(i), offset, t->spec.bytes});
        offset += t->spec.bytes;
      }
    }
    if (!whole || offset != p.nbytes) continue;
    for (size_t s = 0; s < src.slots.size(); ++s) (*places)[src.slots[s]] = pieces[s];
    placement->bases[i] = base;
  }
  placement->places = std::move(places);
  return placement;
}

std::shared_ptr<const Placement> RebasePlacement(const Placement& placement, const storage::EngineStorage& storage) {
  if (storage.params().size() != placement.bases.size()) return nullptr;
  auto rebased = std::make_shared<Placement>();
  rebased->places = placement.places;
  rebased->bases.assign(placement.bases.size(), nullptr);
  for (size_t i = 0; i < placement.bases.size(); ++i) {
    if (placement.bases[i] == nullptr) continue;
    rebased->bases[i] = storage.MappedAddress(i);
    if (rebased->bases[i] == nullptr) return nullptr;
  }
  return rebased;
}

}  // namespace refit
