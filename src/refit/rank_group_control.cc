#include "refit/rank_group_control.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace refit {

RankGroupControl::RankGroupControl(std::vector<Rank> ranks, uint64_t version, std::string tag)
    : ranks_(std::move(ranks)), version_(version), tag_(std::move(tag)) {}

template <typename Call>
absl::Status RankGroupControl::Each(const std::vector<size_t>& ranks, const char* what, Call call,
                                    std::vector<size_t>* ok) {
  std::vector<absl::Status> results(ranks.size());
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (size_t k = 0; k < ranks.size(); ++k) {
    threads.emplace_back([&, k] { results[k] = call(*ranks_[ranks[k]].control); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::string> failures;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::vector<size_t> failed;
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (results[k].ok()) {
      if (ok != nullptr) ok->push_back(ranks[k]);
      continue;
    }
    failed.push_back(ranks[k]);
    // A timeout anywhere is the group's timeout (the node treats it as unanswered).
    if (code == absl::StatusCode::kOk || results[k].code() == absl::StatusCode::kDeadlineExceeded) {
      code = results[k].code();
    }
    failures.push_back(absl::StrCat(ranks_[ranks[k]].label, ": ", results[k].message()));
  }
  {
    absl::MutexLock lock(&mu_);
    failed_ = failed;
  }
  if (failures.empty()) return absl::OkStatus();
  return absl::Status(code, absl::StrCat(what, " failed on engine ", absl::StrJoin(failures, "; ")));
}

absl::Status RankGroupControl::Pause(absl::Duration timeout) {
  std::vector<size_t> all(ranks_.size());
  for (size_t r = 0; r < all.size(); ++r) all[r] = r;
  std::vector<size_t> paused;
  absl::Status st = Each(all, "pause", [timeout](EngineControl& c) { return c.Pause(timeout); }, &paused);
  if (st.ok() || paused.empty()) return st;
  // Nothing was written: the ranks that paused serve the version they hold again.
  uint64_t version;
  std::string tag;
  {
    absl::MutexLock lock(&mu_);
    version = version_;
    tag = tag_;
  }
  std::vector<size_t> failed = failed_ranks();
  (void)Each(paused, "resume", [&](EngineControl& c) { return c.Resume(version, tag, timeout); }, nullptr);
  absl::MutexLock lock(&mu_);
  failed_ = failed;
  return st;
}

absl::Status RankGroupControl::Resume(uint64_t version, const std::string& tag, absl::Duration timeout) {
  std::vector<size_t> all(ranks_.size());
  for (size_t r = 0; r < all.size(); ++r) all[r] = r;
  absl::Status st = Each(all, "resume", [&](EngineControl& c) { return c.Resume(version, tag, timeout); }, nullptr);
  absl::MutexLock lock(&mu_);
  version_ = version;
  tag_ = tag;
  return st;
}

bool RankGroupControl::Responsive() const {
  for (const Rank& r : ranks_) {
    if (!r.control->Responsive()) return false;
  }
  return true;
}

std::vector<size_t> RankGroupControl::failed_ranks() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

}  // namespace refit
