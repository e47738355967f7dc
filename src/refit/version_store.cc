#include "refit/version_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "refit/manifest_check.h"

namespace refit {

const char* StagedVersionStateName(StagedVersion::State state) {
  switch (state) {
    case StagedVersion::State::kHeld: return "held";
    case StagedVersion::State::kCurrent: return "current";
    case StagedVersion::State::kPrevious: return "previous";
  }
  return "held";
}

std::vector<VersionInfo> VersionStore::List() const {
  std::vector<VersionInfo> out;
  for (StagedVersion::State state :
       {StagedVersion::State::kHeld, StagedVersion::State::kCurrent, StagedVersion::State::kPrevious}) {
    for (const auto& v : versions_) {
      if (v->state != state) continue;
      out.push_back({v->tag, StagedVersionStateName(v->state), v->version, v->bytes, v->checksum, v->session_id});
    }
  }
  return out;
}

uint64_t VersionStore::bytes() const {
  uint64_t bytes = 0;
  for (const auto& v : versions_) bytes += v->bytes;
  return bytes;
}

std::array<uint32_t, 3> VersionStore::Counts() const {
  std::array<uint32_t, 3> n{0, 0, 0};
  for (const auto& v : versions_) ++n[static_cast<size_t>(v->state)];
  return n;
}

absl::Status VersionStore::CheckStageOnly(const std::string& tag, bool partial) const {
  if (hold_ == 0) {
    return absl::FailedPreconditionError("stage-only refit refused: this daemon holds no versions (config hold: 0)");
  }
  if (tag.empty()) return absl::InvalidArgumentError("stage-only refit refused: it needs a tag");
  if (partial) return absl::InvalidArgumentError("stage-only refit refused: a held version is a full refit");
  std::vector<std::string> held;
  for (const auto& v : versions_) {
    if (v->state != StagedVersion::State::kHeld) continue;
    if (v->tag == tag) {
      return absl::AlreadyExistsError(
          absl::StrCat("stage-only refit refused: a version tagged '", tag, "' is already held"));
    }
    held.push_back(v->tag);
  }
  if (held.size() >= hold_) {
    return absl::ResourceExhaustedError(absl::StrCat("stage-only refit refused: ", held.size(), " of hold: ", hold_,
                                                     " versions are held (", absl::StrJoin(held, ", "),
                                                     "); commit one first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> VersionStore::MakeRoom(uint64_t need, uint64_t limit) {
  auto free = [&] { return limit - std::min(limit, bytes()); };
  for (StagedVersion::State state : {StagedVersion::State::kPrevious, StagedVersion::State::kCurrent}) {
    if (free() >= need) break;
    if (std::shared_ptr<StagedVersion> v = Find(state)) Drop(std::move(v));
  }
  if (free() >= need) return free();
  std::vector<std::string> held;
  for (const auto& v : versions_) {
    held.push_back(absl::StrCat(v->tag.empty() ? "(untagged)" : v->tag, " ", v->bytes, " bytes"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "staging cannot hold another version: limits.staging_bytes is ", limit, ", ", bytes(), " bytes are held by ",
      versions_.size(), " version", versions_.size() == 1 ? "" : "s", " (", absl::StrJoin(held, ", "),
      "), and a refit of this engine needs about ", need, " bytes; commit a held version or raise the limit"));
}

void VersionStore::Keep(std::shared_ptr<StagedVersion> version) { versions_.push_back(std::move(version)); }

void VersionStore::SessionCommitted(std::shared_ptr<StagedVersion> version) {
  // After a partial refit (no version) the engine holds current + the partial: no whole staged
  // version equals it, but the old current is still a whole earlier state to roll back to.
  if (std::shared_ptr<StagedVersion> old = Find(StagedVersion::State::kPrevious)) Drop(std::move(old));
  if (std::shared_ptr<StagedVersion> cur = Find(StagedVersion::State::kCurrent)) {
    cur->state = StagedVersion::State::kPrevious;
  }
  if (version != nullptr) {
    version->state = StagedVersion::State::kCurrent;
    Keep(std::move(version));
  }
}

void VersionStore::KeptCommitted(const std::shared_ptr<StagedVersion>& version, uint64_t engine_version) {
  std::shared_ptr<StagedVersion> old_current = Find(StagedVersion::State::kCurrent);
  std::shared_ptr<StagedVersion> old_previous = Find(StagedVersion::State::kPrevious);
  if (old_previous != nullptr && old_previous != version) Drop(std::move(old_previous));
  if (old_current != nullptr) old_current->state = StagedVersion::State::kPrevious;
  version->state = StagedVersion::State::kCurrent;
  version->version = engine_version;
}

absl::StatusOr<std::shared_ptr<StagedVersion>> VersionStore::Held(const std::string& tag) const {
  if (hold_ == 0) return absl::FailedPreconditionError("this daemon holds no versions (config hold: 0)");
  std::vector<std::string> held;
  for (const auto& v : versions_) {
    if (v->state != StagedVersion::State::kHeld) continue;
    if (v->tag == tag) return v;
    held.push_back(v->tag);
  }
  return absl::NotFoundError(absl::StrCat("no held version is tagged '", PrintableName(tag), "' (held: ",
                                          held.empty() ? "none" : absl::StrJoin(held, ", "), ")"));
}

absl::StatusOr<std::shared_ptr<StagedVersion>> VersionStore::Previous() const {
  if (hold_ == 0) return absl::FailedPreconditionError("this daemon holds no versions (config hold: 0)");
  std::shared_ptr<StagedVersion> previous = Find(StagedVersion::State::kPrevious);
  if (previous == nullptr) {
    return absl::FailedPreconditionError(
        "nothing to roll back to: the version committed before the current one is not staged (none was, or "
        "staging needed its memory)");
  }
  return previous;
}

void VersionStore::Clear() {
  versions_.clear();
  spare_pool_.reset();
}

void VersionStore::GiveBackPool(std::unique_ptr<StagingPool> pool) {
  if (pool != nullptr && spare_pool_ == nullptr) spare_pool_ = std::move(pool);
}

std::shared_ptr<StagedVersion> VersionStore::Find(StagedVersion::State state) const {
  for (const auto& v : versions_) {
    if (v->state == state) return v;
  }
  return nullptr;
}

bool VersionStore::DropHeld(const std::string& tag) {
  for (const std::shared_ptr<StagedVersion>& v : versions_) {
    if (v->state == StagedVersion::State::kHeld && v->tag == tag) {
      Drop(v);
      return true;
    }
  }
  return false;
}

void VersionStore::Drop(std::shared_ptr<StagedVersion> v) {
  versions_.erase(std::remove(versions_.begin(), versions_.end(), v), versions_.end());
  if (v.use_count() == 1 && v->pool != nullptr) {
    // Only this function holds it now (no commit in flight uses it): its buffers serve the next
    // session instead of being freed and allocated again.
    v->staging.reset();
    spare_pool_ = std::move(v->pool);
  }
}

}  // namespace refit
