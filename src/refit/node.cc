// Node's registry of the engine (one engine; engine ranks are node_ranks.cc), the engine's sleep
// and wake, and the checksums of its parameters. A session's begin is node_begin.cc, its life to
// End node_session.cc, its commit node_commit.cc. Loop thread only, like the rest of Node.
#include "refit/node.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "refit/manifest_check.h"
#include "storage/engine_storage.h"

namespace refit {

Node::Node(NodeOptions options, transport::Receiver& receiver, BucketRing& ring, NodeHooks hooks)
    : options_(std::move(options)),
      system_clock_(options_.clock == nullptr ? NewSystemClock() : nullptr),
      clock_(options_.clock != nullptr ? options_.clock : system_clock_.get()),
      receiver_(receiver),
      ring_(ring),
      hooks_(std::move(hooks)),
      versions_(options_.hold),
      group_(options_.group, clock_) {
  spec_ = options_.spec;
  if (spec_ != nullptr && spec_->tp_size_from_engine) {
    size_open_ = true;  // the first registration gives it (AdoptEngineSize)
  } else {
    InitRanks();
  }
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
}

void Node::InitRanks() {
  ranked_ = spec_ != nullptr && spec_->tp_size > 1 && !spec_->tp_rank_given;
  rank_specs_.clear();
  ranks_.clear();
  left_dirty_.clear();
  if (ranked_) {
    for (int r = 0; r < spec_->tp_size; ++r) {
      absl::StatusOr<spec::ModelSpec> rank_spec = spec::ForRank(*spec_, r);  // r < tp_size: cannot fail
      rank_specs_.push_back(std::make_shared<const spec::ModelSpec>(std::move(*rank_spec)));
    }
    ranks_.resize(static_cast<size_t>(spec_->tp_size));
    left_dirty_.assign(static_cast<size_t>(spec_->tp_size), false);
  }
}

bool Node::RanksFor(const RankPlacement& placement) const {
  if (!size_open_) return ranked_;
  return placement.tp_size > 1;
}

absl::Status Node::AdoptEngineSize(const RankPlacement& placement) {
  const int size = placement.tp_size == 0 ? 1 : placement.tp_size;
  auto it = sized_specs_.find(size);
  if (it == sized_specs_.end()) {
    absl::StatusOr<spec::ModelSpec> sized = spec::WithEngineSize(*options_.spec, size);
    if (!sized.ok()) return sized.status();
    it = sized_specs_.emplace(size, std::make_unique<const spec::ModelSpec>(std::move(*sized))).first;
  }
  spec_ = it->second.get();
  size_open_ = false;
  InitRanks();
  return absl::OkStatus();
}

void Node::MaybeReopenEngineSize() {
  if (options_.spec == nullptr || !options_.spec->tp_size_from_engine || size_open_) return;
  // The engine is gone whole (no rank left, none named dirty, no session): the next engine's
  // first registration gives the size again.
  if (engine_ != nullptr || active_.has_value() || committing()) return;
  if (std::any_of(ranks_.begin(), ranks_.end(), [](const std::shared_ptr<RankRecord>& r) { return r != nullptr; })) {
    return;
  }
  if (std::any_of(left_dirty_.begin(), left_dirty_.end(), [](bool d) { return d; })) return;
  spec_ = options_.spec;
  size_open_ = true;
  ranked_ = false;
  rank_specs_.clear();
  ranks_.clear();
  left_dirty_.clear();
}

Node::~Node() {
  if (active_) active_->session->Abort("daemon shutting down");
}

// ---- engines ----

absl::StatusOr<uint64_t> Node::RegisterEngine(EngineSetup setup) {
  ReleaseEnded();
  const bool adopting = size_open_;
  if (adopting) REFIT_RETURN_IF_ERROR(AdoptEngineSize(setup.placement));
  absl::StatusOr<uint64_t> id = ranked_ ? RegisterRank(std::move(setup)) : RegisterSingle(std::move(setup));
  if (!id.ok() && adopting) MaybeReopenEngineSize();  // a refused registration fixes no size
  return id;
}

absl::StatusOr<uint64_t> Node::RegisterSingle(EngineSetup setup) {
  if (absl::Status placed = CheckRank(setup); !placed.ok()) return placed;
  if (engine_ && !engine_->gone) {
    return absl::UnavailableError(absl::StrCat(
        "an engine is already registered (engine ", engine_->id,
        "); it must drop its registration or disconnect before another engine registers"));
  }
  auto record = std::make_shared<EngineRecord>();
  record->id = next_engine_id_++;
  record->planner = std::move(setup.planner);
  record->storage = std::move(setup.storage);
  if (options_.hold > 0 && !setup.new_pool) {
    return absl::InternalError("hold > 0 needs EngineSetup::new_pool (a pool per kept version)");
  }
  record->pool = std::move(setup.pool);
  record->new_pool = std::move(setup.new_pool);
  record->converter = std::move(setup.converter);
  record->control = std::move(setup.control);
  for (const auto& p : record->storage->params()) record->bytes += p.nbytes;
  record->version = setup.version;
  record->tag = std::move(setup.tag);
  record->dirty = setup.dirty;
  group_.EngineRegistered(record->tag, record->dirty);
  GroupChanged();
  engine_ = std::move(record);
  if (hooks_.on_engine) hooks_.on_engine(true);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return engine_->id;
}

bool Node::UnregisterEngine(uint64_t engine_id) {
  ReleaseEnded();
  if (ranked_) {
    auto it = std::find_if(ranks_.begin(), ranks_.end(),
                           [engine_id](const std::shared_ptr<RankRecord>& r) { return r && r->id == engine_id; });
    if (it == ranks_.end()) return false;
    (*it)->gone = true;
    // A rank a failed commit left dirty is named until it registers again.
    if ((*it)->dirty) left_dirty_[static_cast<size_t>(it - ranks_.begin())] = true;
    it->reset();  // the group engine (and a commit in flight) still hold it
    if (!engine_) {
      MaybeReopenEngineSize();
      if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
      return true;
    }
    if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  }
  if (!engine_ || (!ranked_ && engine_->id != engine_id)) return ranked_;
  engine_->gone = true;
  if (active_ && active_->engine.get() == engine_.get()) AbortWith(EndCause::kEngineError, "engine unregistered");
  versions_.Clear();  // kept versions were converted for this registration's parameters
  engine_.reset();
  MaybeReopenEngineSize();
  if (hooks_.on_engine) hooks_.on_engine(false);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return true;
}

absl::Status Node::Ready() const {
  if (!engine_) return absl::UnavailableError(ranked_ ? MissingRanks() : "no engine registered");
  // A joining member's engine may be dirty because it is held paused (GroupJoinHolds): the
  // group's reason says why.
  if (group_.phase() == GroupPhase::kJoining) {
    if (absl::Status grouped = group_.Ready(); !grouped.ok()) return grouped;
  }
  if (engine_->dirty) return absl::UnavailableError("engine weights dirty after a failed commit");
  if (!engine_->control->Responsive()) return absl::UnavailableError("engine did not answer a pause or resume");
  if (absl::Status grouped = group_.Ready(); !grouped.ok()) return grouped;
  return absl::OkStatus();
}

uint64_t Node::version() const { return engine_ ? engine_->version : last_report_.version; }

const std::string& Node::tag() const {
  if (engine_) return engine_->tag;
  static const std::string kNone;
  return last_report_.outcome == Outcome::kCommitted ? last_report_.tag : kNone;
}

// ---- sleep and wake ----

absl::Status Node::Sleep(uint64_t engine_id) {
  ReleaseEnded();
  if (ranked_) return SleepRank(engine_id);
  if (!engine_ || engine_->id != engine_id || engine_->gone) {
    return absl::FailedPreconditionError("this registration is not the registered engine");
  }
  if (engine_->asleep) return absl::OkStatus();
  REFIT_RETURN_IF_ERROR(MaySleep());
  // Drops every mapping (shm regions unmapped, CUDA IPC handles closed) with the storage.
  const storage::EngineStorage& had = *engine_->storage;
  engine_->storage = std::make_unique<storage::ReleasedEngineStorage>(had.params(), had.on_device(), had.device());
  engine_->asleep = true;
  ++engine_->generation;
  if (hooks_.on_engine) hooks_.on_engine(true);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return absl::OkStatus();
}

absl::Status Node::MaySleep() const {
  if (committing()) {
    return WithCause(absl::UnavailableError("busy: a commit is in flight; sleep once it has ended"), EndCause::kBusy);
  }
  if (active_ && active_->placement != nullptr) {
    return absl::UnavailableError(absl::StrCat("busy: session ", active_->session->id(),
                                               " converts into the engine's memory (staging: direct); sleep once it "
                                               "has ended"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Commit>> Node::Wake(uint64_t engine_id, std::unique_ptr<storage::EngineStorage> storage) {
  ReleaseEnded();
  if (ranked_) return WakeRank(engine_id, std::move(storage));
  if (!engine_ || engine_->id != engine_id || engine_->gone) {
    return absl::FailedPreconditionError("this registration is not the registered engine");
  }
  if (!engine_->asleep) return absl::FailedPreconditionError("the engine is not asleep");
  if (committing()) {
    return WithCause(absl::UnavailableError("busy: a commit is in flight; wake once it has ended"), EndCause::kBusy);
  }
  REFIT_RETURN_IF_ERROR(CheckWoken("the engine", *engine_->storage, *storage));
  engine_->storage = std::move(storage);
  engine_->asleep = false;
  ++engine_->generation;
  if (hooks_.on_engine) hooks_.on_engine(true);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return WokenCommit();
}

absl::Status Node::CheckWoken(const std::string& who, const storage::EngineStorage& slept,
                              const storage::EngineStorage& woken) {
  const std::vector<storage::ParamInfo>& had = slept.params();
  const std::vector<storage::ParamInfo>& has = woken.params();
  if (had.size() != has.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("wake: ", who, " registered ", has.size(), " parameters; it slept with ", had.size()));
  }
  for (size_t i = 0; i < had.size(); ++i) {
    if (had[i].name != has[i].name || had[i].dtype != has[i].dtype || had[i].shape != has[i].shape ||
        had[i].nbytes != has[i].nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wake: parameter ", i, " is '", PrintableName(has[i].name), "' ", DTypeName(has[i].dtype),
          ShapeString(has[i].shape), "; ", who, " slept with '", had[i].name, "' ", DTypeName(had[i].dtype),
          ShapeString(had[i].shape), " (a wake registers the same parameters, at the same or new addresses)"));
    }
  }
  if (woken.on_device() != slept.on_device() || woken.device() != slept.device()) {
    auto where = [](const storage::EngineStorage& s) {
      return s.on_device() ? absl::StrCat("GPU ", s.device()) : std::string("the host");
    };
    return absl::InvalidArgumentError(
        absl::StrCat("wake: the parameters are on ", where(woken), "; ", who, " slept with them on ", where(slept)));
  }
  return absl::OkStatus();
}

std::shared_ptr<Commit> Node::WokenCommit() {
  if (!engine_ || engine_->asleep || !active_ || !active_->awaiting_wake || active_->engine.get() != engine_.get()) {
    return nullptr;
  }
  active_->awaiting_wake = false;
  active_->committing = true;
  CommitSetup setup = SessionCommitSetup();
  setup.woken = true;
  setup.times = active_->staged_times;
  setup.staged_checksum = active_->staged_checksum;
  return std::make_shared<Commit>(std::move(setup));
}

absl::StatusOr<std::vector<Node::ParamChecksum>> Node::Checksums() const {
  if (!engine_) return absl::UnavailableError("no engine is registered");
  if (engine_->asleep) return absl::FailedPreconditionError("the engine is asleep: its parameters are not mapped");
  if (committing()) return absl::UnavailableError("busy: a commit is in progress");
  const auto& params = engine_->storage->params();
  std::vector<ParamChecksum> out;
  out.reserve(params.size());
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < params.size(); ++i) {
    buf.resize(params[i].nbytes);
    absl::Status st = engine_->storage->ReadToHost(i, buf.data());
    if (!st.ok()) return st;
    out.push_back({params[i].name, Checksum64(buf.data(), buf.size()), params[i].nbytes});
  }
  return out;
}

}  // namespace refit
