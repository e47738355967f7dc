// staging: direct — where a session's converted tensors go in the engine's own memory. Planned
// at begin from the manifest (each tensor's plan, hence every staged key and its size), before
// anything arrives, so that the converter writes each placed tensor straight into the engine's
// parameter (the engine paused from then until its resume) and the commit copies nothing for it.
//
// Placed: every key that is a whole engine parameter (one slot, no layout step, its dtype and
// shape), and every piece of a fused or stacked parameter without a layout step whose every slot
// the manifest names, at the offset the committer writes it (slots concatenated in order; their
// sizes sum to the parameter's). Not placed, and staged as before: parameters with layout steps,
// derived and kept ones, keys the manifest does not name (or names with other sizes), keys that
// fill more than one slot, and parameters the storage cannot map (MappedAddress null).
// Thread-safe: pure functions.
#ifndef REFIT_REFIT_PLACEMENT_H_
#define REFIT_REFIT_PLACEMENT_H_

#include <memory>
#include <vector>

#include "refit/planner.h"
#include "refit/staging.h"
#include "storage/engine_storage.h"

namespace refit {

// The placement of the keys `plans` (the manifest's tensors, planned: the planner's shared plans,
// not copies) stage, in `storage`.
std::shared_ptr<const Placement> PlanPlacement(const Planner& planner, const storage::EngineStorage& storage,
                                               const std::vector<std::shared_ptr<const TensorPlan>>& plans);

// `placement`'s places at `storage`'s mappings: for the same engine's storage registered again
// with the same parameters (a wake), at the same or new addresses. Sharing the places, it costs
// one address per parameter, not a planning. nullptr if `storage` has another parameter count or
// maps no address for a placed parameter (plan anew then).
std::shared_ptr<const Placement> RebasePlacement(const Placement& placement, const storage::EngineStorage& storage);

}  // namespace refit

#endif  // REFIT_REFIT_PLACEMENT_H_
