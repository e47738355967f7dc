// EngineStorage over POSIX shared memory: each parameter is (region name, offset, nbytes) in a
// region the engine created. Each distinct region is mapped once per registration.
#ifndef REFIT_STORAGE_SHM_STORAGE_H_
#define REFIT_STORAGE_SHM_STORAGE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/engine_storage.h"
#include "storage/shm_region.h"

namespace refit::storage {

struct ShmParam {
  ParamInfo info;
  std::string region;
  uint64_t offset;
};

class ShmEngineStorage : public EngineStorage {
 public:
  // Maps every region named by `params` and bounds-checks each parameter against its region
  // (overflow-safe); errors name the parameter.
  static absl::StatusOr<std::unique_ptr<ShmEngineStorage>> Open(std::vector<ShmParam> params);

  const std::vector<ParamInfo>& params() const override { return infos_; }
  absl::Status WriteFromHost(size_t index, const void* src) override;
  absl::Status ReadToHost(size_t index, void* dst) const override;
  absl::StatusOr<uint64_t> Checksum(size_t index) const override;
  absl::Status Flush() override;
  uint8_t* MappedAddress(size_t index) const override { return index < addrs_.size() ? addrs_[index] : nullptr; }
  // Each region's name still names the object mapped, at its size (ShmRegion::CheckCurrent).
  absl::Status Audit() const override;

 private:
  std::vector<ParamInfo> infos_;
  std::vector<const ShmRegion*> region_of_;  // per parameter
  std::vector<uint8_t*> addrs_;
  std::map<std::string, std::unique_ptr<ShmRegion>> regions_;
};

}  // namespace refit::storage

#endif  // REFIT_STORAGE_SHM_STORAGE_H_
