#include "storage/rank_group_storage.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace refit::storage {

RankGroupStorage::RankGroupStorage(std::vector<Rank> ranks) : ranks_(std::move(ranks)) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::vector<ParamInfo>& params = ranks_[r].storage->params();
    for (size_t i = 0; i < params.size(); ++i) {
      ParamInfo info = params[i];
      info.name = absl::StrCat(ranks_[r].label, "/", info.name);
      params_.push_back(std::move(info));
      where_.emplace_back(r, i);
    }
    on_device_ = on_device_ && ranks_[r].storage->on_device();
  }
  if (ranks_.empty()) on_device_ = false;
}

absl::Status RankGroupStorage::Named(size_t r, const absl::Status& st) const {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("engine ", ranks_[r].label, ": ", st.message()));
}

absl::Status RankGroupStorage::WriteFromHost(size_t index, const void* src) {
  if (index >= where_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  auto [r, i] = where_[index];
  return Named(r, ranks_[r].storage->WriteFromHost(i, src));
}

absl::Status RankGroupStorage::WriteFromDevice(const DeviceWrite& w) {
  if (w.index >= where_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", w.index));
  auto [r, i] = where_[w.index];
  return Named(r, ranks_[r].storage->WriteFromDevice({i, w.offset, w.src, w.bytes}));
}

absl::Status RankGroupStorage::PrepareDeviceWrites(const std::vector<DeviceWrite>& writes) {
  std::vector<std::vector<DeviceWrite>> per_rank(ranks_.size());
  for (const DeviceWrite& w : writes) {
    if (w.index >= where_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", w.index));
    per_rank[where_[w.index].first].push_back({where_[w.index].second, w.offset, w.src, w.bytes});
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (absl::Status st = ranks_[r].storage->PrepareDeviceWrites(per_rank[r]); !st.ok()) return Named(r, st);
  }
  return absl::OkStatus();
}

absl::Status RankGroupStorage::WritePreparedDevice() {
  // Every rank's GPU copies at once: the pause is the slowest rank's copy, not their sum.
  std::vector<absl::Status> results(ranks_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    threads.emplace_back([this, r, &results] { results[r] = ranks_[r].storage->WritePreparedDevice(); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!results[r].ok()) return Named(r, results[r]);
  }
  return absl::OkStatus();
}

int RankGroupStorage::device() const { return ranks_.empty() ? -1 : ranks_[0].storage->device(); }

absl::Status RankGroupStorage::ReadToHost(size_t index, void* dst) const {
  if (index >= where_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  auto [r, i] = where_[index];
  return Named(r, ranks_[r].storage->ReadToHost(i, dst));
}

absl::StatusOr<uint64_t> RankGroupStorage::Checksum(size_t index) const {
  if (index >= where_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  auto [r, i] = where_[index];
  absl::StatusOr<uint64_t> sum = ranks_[r].storage->Checksum(i);
  if (!sum.ok()) return Named(r, sum.status());
  return sum;
}

absl::Status RankGroupStorage::Flush() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (absl::Status st = ranks_[r].storage->Flush(); !st.ok()) return Named(r, st);
  }
  return absl::OkStatus();
}

absl::Status RankGroupStorage::Audit() const {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (absl::Status st = ranks_[r].storage->Audit(); !st.ok()) return Named(r, st);
  }
  return absl::OkStatus();
}

}  // namespace refit::storage
