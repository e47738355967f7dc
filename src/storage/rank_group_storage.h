// The storage of an engine of several ranks (tensor/expert-parallel processes, one per GPU) as
// one EngineStorage: params() is every rank's parameters in rank order, names prefixed by the
// rank's label ("rank1/model.norm.weight"), and each write goes to the rank holding it. The
// ranks' storages are shared with their registrations, so a rank that leaves mid-commit keeps its
// mapping alive until the commit is done with it.
//
// Threading: as EngineStorage (one commit at a time). Batched device writes are prepared and
// issued per rank, each rank's batch on its own thread.
#ifndef REFIT_STORAGE_RANK_GROUP_STORAGE_H_
#define REFIT_STORAGE_RANK_GROUP_STORAGE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/engine_storage.h"

namespace refit::storage {

class RankGroupStorage final : public EngineStorage {
 public:
  struct Rank {
    std::string label;
    std::shared_ptr<EngineStorage> storage;
  };
  explicit RankGroupStorage(std::vector<Rank> ranks);

  const std::vector<ParamInfo>& params() const override { return params_; }
  absl::Status WriteFromHost(size_t index, const void* src) override;
  absl::Status WriteFromDevice(const DeviceWrite& write) override;
  absl::Status PrepareDeviceWrites(const std::vector<DeviceWrite>& writes) override;
  absl::Status WritePreparedDevice() override;
  bool on_device() const override { return on_device_; }
  int device() const override;
  absl::Status ReadToHost(size_t index, void* dst) const override;
  absl::StatusOr<uint64_t> Checksum(size_t index) const override;
  absl::Status Flush() override;
  // Every rank's audit; the first stale rank's refusal, naming the rank.
  absl::Status Audit() const override;

  size_t rank_of(size_t index) const { return where_[index].first; }
  const std::string& label(size_t rank) const { return ranks_[rank].label; }

 private:
  // An error of rank `r`'s storage, naming the rank.
  absl::Status Named(size_t r, const absl::Status& st) const;

  std::vector<Rank> ranks_;
  std::vector<ParamInfo> params_;
  std::vector<std::pair<size_t, size_t>> where_;  // global index -> (rank, the rank's index)
  bool on_device_ = true;
};

}  // namespace refit::storage

#endif  // REFIT_STORAGE_RANK_GROUP_STORAGE_H_
