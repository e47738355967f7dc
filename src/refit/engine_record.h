// The records of a registered engine and its ranks: what the node holds of an engine, shared with
// the session that converts for it and a commit in flight (so an engine that unregisters during a
// commit keeps its mappings alive until that commit has finished with them).
//
// Threading: the fields marked "loop thread only" are read and changed on the server's event loop;
// a commit's worker reads the rest, which nothing changes while a commit holds the record.
#ifndef REFIT_REFIT_ENGINE_RECORD_H_
#define REFIT_REFIT_ENGINE_RECORD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "refit/converter.h"
#include "refit/engine_control.h"
#include "refit/placement.h"
#include "refit/planner.h"
#include "refit/rank_group_control.h"
#include "refit/staging.h"
#include "storage/engine_storage.h"

namespace refit {

// Where a registering engine rank sits in the node's engine (proto registerEngine's tpRank...).
struct RankPlacement {
  int tp_rank = 0;
  int tp_size = 0;  // 0: not given (a single engine, as registered before engine ranks)
  int ep_rank = 0;
  int ep_size = 0;  // 0: not given (no expert parallelism)
  int device = -1;  // the CUDA device of its parameters; -1: not given (host engines)
  std::string model;  // the model it serves; "": not given
};

// One registered rank of an engine of several ranks (spec tensor_parallel.size > 1 without a
// rank). Shared by the node, the group engine built over it and a commit in flight.
struct RankRecord {
  uint64_t id = 0;  // its registration
  RankPlacement placement;
  // Replaced (loop thread, no commit in flight) when the rank sleeps (a ReleasedEngineStorage)
  // and wakes; the group engine's storage holds its own reference to each rank's.
  std::shared_ptr<storage::EngineStorage> storage;
  std::shared_ptr<EngineControl> control;
  uint64_t bytes = 0;
  // Loop thread only.
  uint64_t version = 0;
  std::string tag;
  bool dirty = false;
  bool gone = false;
  bool asleep = false;  // released its weights (Node::Sleep of its registration) until its wake
};

// What a registering engine brings: its mapped storage, the planner over its parameters, the
// staging memory and converter that fit it, its pause/resume control, and what it holds now.
struct EngineSetup {
  std::unique_ptr<Planner> planner;
  std::unique_ptr<storage::EngineStorage> storage;
  std::unique_ptr<StagingPool> pool;
  // A new, empty pool of the same memory kind: with hold > 0 every session stages into its own
  // pool, which a held or retained version keeps. Required when NodeOptions::hold > 0.
  std::function<std::unique_ptr<StagingPool>()> new_pool;
  std::unique_ptr<Converter> converter;
  std::unique_ptr<EngineControl> control;
  uint64_t version = 0;  // the version the engine serves (0: fresh)
  std::string tag;       // the trainer's tag of that version ("" when none)
  bool dirty = false;    // it lost refitd inside a commit window: its weights may be mixed
  // Where it sits (engine ranks). With NodeOptions::spec declaring ranks, only storage, control,
  // version, tag, dirty and placement are given: the node builds the rest once every rank is in.
  RankPlacement placement;
};

// A registered engine. Shared by the node, the session that uses it and a commit in flight.
struct EngineRecord {
  uint64_t id = 0;
  std::unique_ptr<Planner> planner;
  std::unique_ptr<storage::EngineStorage> storage;
  std::unique_ptr<StagingPool> pool;
  std::function<std::unique_ptr<StagingPool>()> new_pool;
  std::unique_ptr<Converter> converter;
  std::unique_ptr<EngineControl> control;
  uint64_t bytes = 0;
  // Loop thread only.
  uint64_t version = 0;
  std::string tag;     // the trainer's tag of `version`
  bool dirty = false;  // a commit failed mid-copy: only a full refit may land
  bool gone = false;   // unregistered (disconnected); a commit in flight still holds the record
  // An engine of several ranks: its ranks, in rank order (empty for a single engine), and their
  // pause/resume (which knows the ranks that failed).
  std::vector<std::shared_ptr<RankRecord>> ranks;
  const RankGroupControl* group_control = nullptr;
  // Sleep and wake (Node::Sleep, Node::Wake): asleep, the storage is a ReleasedEngineStorage (the
  // parameter list without mappings); an engine of several ranks is asleep while any rank sleeps
  // (its storage then holds that rank's ReleasedEngineStorage). `generation` counts registrations
  // of storage: 1 at register, +1 at each sleep and each wake (of any rank); a commit writes only
  // into the generation it started with.
  bool asleep = false;
  uint64_t generation = 1;
  // staging: direct: the last placement planned (Node::Begin) and what it was planned from: the
  // manifest's plans (the planner's shared plans, held here so that none is freed and its address
  // reused) and the storage generation. An RL loop's next begin, planned to the same plans in the
  // same generation, takes it again rather than planning it anew; in a later generation (the
  // engine slept and woke with the same parameters), it takes the same places rebased to the new
  // mappings (RebasePlacement).
  struct PlacementMemo {
    uint64_t generation = 0;
    std::vector<std::shared_ptr<const TensorPlan>> plans;
    std::shared_ptr<const Placement> placement;
  };
  PlacementMemo placement_memo;
  // The last manifest's tensor list this engine's planner accepted, by its key (Node::Begin's
  // `tensors_key`), with its plans: an RL loop's next begin with the same list takes them rather
  // than checking and planning each tensor again.
  struct BeginMemo {
    uint64_t tensors_key = 0;
    std::vector<std::shared_ptr<const TensorPlan>> plans;
  };
  BeginMemo begin_memo;
};

}  // namespace refit

#endif  // REFIT_REFIT_ENGINE_RECORD_H_
