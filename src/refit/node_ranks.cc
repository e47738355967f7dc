// Node's engine ranks: an engine of several rank processes (spec tensor_parallel.size > 1 without
// a rank, or size engine and a first registration of tp_size > 1; docs/architecture.md "Engine
// ranks"). Each rank registers on its own; once every
// declared rank is in, the node's one engine record is built over them — a planner over every
// rank's parameters, their storages as one, their pause/resume as one — so sessions, the ledger
// and the commit run exactly as for a single engine. Each rank sleeps and wakes through its own
// registration; the engine is asleep while any rank sleeps, and a refit staged meanwhile commits
// at the last rank's wake. Loop thread only, like the rest of Node.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "refit/manifest_check.h"
#include "refit/node.h"
#include "storage/rank_group_storage.h"

namespace refit {
namespace {

std::string Label(int tp_rank) { return absl::StrCat("rank", tp_rank); }

std::string Describe(const storage::ParamInfo& p) { return absl::StrCat(DTypeName(p.dtype), ShapeString(p.shape)); }

// The engine's storage over its ranks' storages now, in rank order.
std::unique_ptr<storage::RankGroupStorage> GroupStorage(const std::vector<std::shared_ptr<RankRecord>>& ranks) {
  std::vector<storage::RankGroupStorage::Rank> storages;
  for (size_t r = 0; r < ranks.size(); ++r) storages.push_back({Label(static_cast<int>(r)), ranks[r]->storage});
  return std::make_unique<storage::RankGroupStorage>(std::move(storages));
}

}  // namespace

std::string Node::SizeIs(const char* field, int size) const {
  if (options_.spec != nullptr && options_.spec->tp_size_from_engine) {
    return absl::StrCat("the engine's ", field, " is ", size,
                        " (the spec's is 'engine': the first rank to register fixed it, until every rank has gone)");
  }
  return absl::StrCat("the spec's ", field, " is ", size);
}

absl::Status Node::CheckPlacement(const RankPlacement& placement) const {
  EngineSetup setup;
  setup.placement = placement;
  return CheckRank(setup);
}

absl::Status Node::CheckRank(const EngineSetup& setup) const {
  const RankPlacement& p = setup.placement;
  if (!p.model.empty() && p.model != options_.model) {
    return absl::InvalidArgumentError(absl::StrCat("model: the engine registers for '", PrintableName(p.model),
                                                   "' but this daemon serves '", options_.model, "'"));
  }
  const spec::ModelSpec* spec = spec_;
  if (spec == nullptr || p.tp_size == 0) {
    if (ranked_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp_size: ", options_.spec->tp_size_from_engine ? "this daemon's engine" : "this daemon's spec",
          " declares tensor_parallel.size ", spec->tp_size,
          " without a rank, so every engine rank registers its tp_rank and tp_size (this registration gave none)"));
    }
    return absl::OkStatus();  // a single engine, registered as before engine ranks
  }
  if (p.tp_size != spec->tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("tp_size: the engine registers tensor-parallel size ", p.tp_size,
                                                   ", ", SizeIs("tensor_parallel.size", spec->tp_size)));
  }
  if (p.tp_rank < 0 || p.tp_rank >= p.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_rank: ", p.tp_rank, " is outside tensor_parallel.size ", spec->tp_size));
  }
  if (!ranked_ && p.tp_rank != spec->tp_rank) {
    return absl::InvalidArgumentError(absl::StrCat("tp_rank: the engine registers rank ", p.tp_rank,
                                                   ", the spec's tensor_parallel.rank is ", spec->tp_rank));
  }
  const int ep_size = p.ep_size == 0 ? 1 : p.ep_size;
  if (ep_size != spec->ep_size) {
    return absl::InvalidArgumentError(absl::StrCat("ep_size: the engine registers expert-parallel size ", ep_size, ", ",
                                                   SizeIs("expert_parallel.size", spec->ep_size)));
  }
  const int ep_rank = spec->ep_size > 1 ? p.tp_rank : 0;
  if (p.ep_rank != ep_rank) {
    return absl::InvalidArgumentError(absl::StrCat("ep_rank: tensor-parallel rank ", p.tp_rank,
                                                   " holds expert-parallel rank ", ep_rank,
                                                   " under the spec (expert_parallel.size ", spec->ep_size,
                                                   "), the engine registers ", p.ep_rank));
  }
  if (p.device >= 0 && setup.storage != nullptr && setup.storage->on_device() && setup.storage->device() != p.device) {
    return absl::InvalidArgumentError(absl::StrCat("device: the engine registers device ", p.device,
                                                   " but its parameters are on device ", setup.storage->device()));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Node::RegisterRank(EngineSetup setup) {
  REFIT_RETURN_IF_ERROR(CheckRank(setup));
  const RankPlacement& p = setup.placement;
  const size_t r = static_cast<size_t>(p.tp_rank);
  if (ranks_[r] != nullptr && !ranks_[r]->gone) {
    return absl::AlreadyExistsError(absl::StrCat("tp_rank: engine rank ", p.tp_rank, " is already registered (engine ",
                                                 ranks_[r]->id, "); it must drop its registration or disconnect "
                                                 "before it registers again"));
  }
  const std::vector<storage::ParamInfo>& params = setup.storage->params();
  for (size_t o = 0; o < ranks_.size(); ++o) {
    const std::shared_ptr<RankRecord>& other = ranks_[o];
    if (o == r || other == nullptr) continue;
    // Every rank of one spec holds parts of equal size: what differs from another rank is wrong.
    const std::vector<storage::ParamInfo>& theirs = other->storage->params();
    std::set<std::string> mine;
    for (const storage::ParamInfo& param : params) {
      mine.insert(param.name);
      auto it = std::find_if(theirs.begin(), theirs.end(),
                             [&](const storage::ParamInfo& t) { return t.name == param.name; });
      if (it == theirs.end()) {
        return absl::InvalidArgumentError(absl::StrCat("params: engine rank ", p.tp_rank, " registers '",
                                                       PrintableName(param.name), "', which engine rank ", o,
                                                       " did not"));
      }
      if (it->dtype != param.dtype || it->shape != param.shape) {
        return absl::InvalidArgumentError(absl::StrCat("params: engine rank ", p.tp_rank, " registers '", param.name,
                                                       "' as ", Describe(param), ", engine rank ", o, " as ",
                                                       Describe(*it), " (the spec gives every rank parts of one size)"));
      }
    }
    for (const storage::ParamInfo& t : theirs) {
      if (!mine.count(t.name)) {
        return absl::InvalidArgumentError(absl::StrCat("params: engine rank ", p.tp_rank, " lacks '", t.name,
                                                       "', which engine rank ", o, " registered"));
      }
    }
    break;  // the others were checked against this one when they registered
  }
  // The rank's own parameters under the spec as that rank sees it.
  absl::StatusOr<Planner> planner = Planner::Create(*rank_specs_[r], params);
  if (!planner.ok()) {
    return absl::Status(planner.status().code(),
                        absl::StrCat("params: engine rank ", p.tp_rank, ": ", planner.status().message()));
  }
  auto rank = std::make_shared<RankRecord>();
  rank->id = next_engine_id_++;
  rank->placement = p;
  rank->storage = std::move(setup.storage);
  rank->control = std::move(setup.control);
  for (const storage::ParamInfo& param : rank->storage->params()) rank->bytes += param.nbytes;
  rank->version = setup.version;
  rank->tag = std::move(setup.tag);
  rank->dirty = setup.dirty;
  group_.EngineRegistered(rank->tag, rank->dirty);
  GroupChanged();
  ranks_[r] = rank;
  left_dirty_[r] = false;
  const uint64_t id = rank->id;
  if (std::all_of(ranks_.begin(), ranks_.end(), [](const std::shared_ptr<RankRecord>& x) { return x != nullptr; })) {
    absl::Status built = BuildGroup();
    if (!built.ok()) {
      ranks_[r].reset();
      return built;
    }
  }
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return id;
}

absl::Status Node::BuildGroup() {
  std::vector<RankParams> planned;
  std::vector<RankGroupControl::Rank> controls;
  uint64_t version = ranks_[0]->version;
  std::string tag = ranks_[0]->tag;
  bool dirty = false;
  bool asleep = false;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const RankRecord& rank = *ranks_[r];
    planned.push_back({rank_specs_[r], Label(static_cast<int>(r)), rank.storage->params()});
    controls.push_back({Label(static_cast<int>(r)), rank.control});
    // Ranks that hold different versions (one restarted) are one mixed engine: dirty until a full
    // refit lands.
    dirty = dirty || rank.dirty || rank.version != version || rank.tag != tag;
    version = std::max(version, rank.version);
    // A rank that slept before every rank was in (or while another rank was away) still sleeps.
    asleep = asleep || rank.asleep;
  }
  absl::StatusOr<Planner> planner = Planner::CreateRanks(*spec_, std::move(planned));
  if (!planner.ok()) return planner.status();
  EngineSetup setup;
  setup.planner = std::make_unique<Planner>(std::move(*planner));
  setup.storage = GroupStorage(ranks_);
  if (!options_.make_staging) return absl::InternalError("engine ranks need NodeOptions::make_staging");
  REFIT_RETURN_IF_ERROR(options_.make_staging(setup));
  if (options_.hold > 0 && !setup.new_pool) {
    return absl::InternalError("hold > 0 needs EngineSetup::new_pool (a pool per kept version)");
  }
  auto control = std::make_unique<RankGroupControl>(std::move(controls), version, tag);
  auto record = std::make_shared<EngineRecord>();
  record->id = next_engine_id_++;
  record->planner = std::move(setup.planner);
  record->storage = std::move(setup.storage);
  record->pool = std::move(setup.pool);
  record->new_pool = std::move(setup.new_pool);
  record->converter = std::move(setup.converter);
  record->group_control = control.get();
  record->control = std::move(control);
  for (const auto& p : record->storage->params()) record->bytes += p.nbytes;
  record->version = version;
  record->tag = tag;
  record->dirty = dirty;
  record->asleep = asleep;
  record->ranks = ranks_;
  engine_ = std::move(record);
  if (hooks_.on_engine) hooks_.on_engine(true);
  return absl::OkStatus();
}

RankRecord* Node::FindRank(uint64_t engine_id) const {
  for (const std::shared_ptr<RankRecord>& rank : ranks_) {
    if (rank != nullptr && rank->id == engine_id && !rank->gone) return rank.get();
  }
  return nullptr;
}

int Node::TpRankOf(uint64_t engine_id) const {
  const RankRecord* rank = ranked_ ? FindRank(engine_id) : nullptr;
  return rank != nullptr ? rank->placement.tp_rank : -1;
}

absl::Status Node::SleepRank(uint64_t engine_id) {
  RankRecord* rank = FindRank(engine_id);
  if (rank == nullptr) return absl::FailedPreconditionError("this registration is not a registered engine rank");
  if (rank->asleep) return absl::OkStatus();
  REFIT_RETURN_IF_ERROR(MaySleep());
  // Drops this rank's mappings: the group's storage is rebuilt below, and with the rank's old
  // storage its last reference goes (no commit is in flight to hold it).
  const storage::EngineStorage& had = *rank->storage;
  rank->storage = std::make_shared<storage::ReleasedEngineStorage>(had.params(), had.on_device(), had.device());
  rank->asleep = true;
  RanksStorageChanged();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Commit>> Node::WakeRank(uint64_t engine_id,
                                                       std::unique_ptr<storage::EngineStorage> storage) {
  RankRecord* rank = FindRank(engine_id);
  if (rank == nullptr) return absl::FailedPreconditionError("this registration is not a registered engine rank");
  const std::string who = absl::StrCat("engine rank ", rank->placement.tp_rank);
  if (!rank->asleep) return absl::FailedPreconditionError(absl::StrCat(who, " is not asleep"));
  if (committing()) {
    return WithCause(absl::UnavailableError("busy: a commit is in flight; wake once it has ended"), EndCause::kBusy);
  }
  REFIT_RETURN_IF_ERROR(CheckWoken(who, *rank->storage, *storage));
  rank->storage = std::move(storage);
  rank->asleep = false;
  RanksStorageChanged();
  // The last rank asleep woke: a refit staged meanwhile commits now, on every rank.
  return WokenCommit();
}

void Node::RanksStorageChanged() {
  if (engine_ != nullptr) {
    engine_->storage = GroupStorage(engine_->ranks);
    engine_->asleep = std::any_of(engine_->ranks.begin(), engine_->ranks.end(),
                                  [](const std::shared_ptr<RankRecord>& r) { return r->asleep; });
    ++engine_->generation;
    if (hooks_.on_engine) hooks_.on_engine(true);
  }
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
}

std::string Node::MissingRanks() const {
  std::vector<std::string> missing, left;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r] != nullptr) continue;
    missing.push_back(absl::StrCat(r));
    if (left_dirty_[r]) left.push_back(absl::StrCat(r));
  }
  std::string msg = absl::StrCat("no engine is registered: engine rank", missing.size() == 1 ? " " : "s ",
                                 absl::StrJoin(missing, ", "), " of tensor_parallel.size ", ranks_.size(),
                                 missing.size() == 1 ? " is" : " are", " not registered");
  if (!left.empty()) {
    absl::StrAppend(&msg, " (rank", left.size() == 1 ? " " : "s ", absl::StrJoin(left, ", "),
                    " left dirty during a failed commit; a full refit lands once it registers again)");
  }
  return msg;
}

std::vector<RankStatus> Node::Ranks() const {
  std::vector<RankStatus> out;
  if (!ranked_) {
    // A single engine is one rank: its spec's tensor_parallel.rank (0 without one).
    RankStatus s;
    s.tp_rank = spec_ != nullptr ? spec_->tp_rank : 0;
    if (const EngineRecord* e = engine_.get()) {
      s.registered = true;
      s.version = e->version;
      s.tag = e->tag;
      s.dirty = e->dirty;
      s.asleep = e->asleep;
      s.responsive = e->control->Responsive();
      s.params = static_cast<uint32_t>(e->storage->params().size());
      s.bytes = e->bytes;
    }
    out.push_back(std::move(s));
    return out;
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    RankStatus s;
    s.tp_rank = static_cast<int>(r);
    s.left_dirty = left_dirty_[r];
    if (const RankRecord* rank = ranks_[r].get()) {
      s.registered = true;
      s.placement = rank->placement;
      s.version = rank->version;
      s.tag = rank->tag;
      s.dirty = rank->dirty;
      s.asleep = rank->asleep;
      s.responsive = rank->control->Responsive();
      s.params = static_cast<uint32_t>(rank->storage->params().size());
      s.bytes = rank->bytes;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace refit
