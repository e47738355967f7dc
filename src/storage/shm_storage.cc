#include "storage/shm_storage.h"

#include <atomic>
#include <cstring>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/parallel_copy.h"
#include "common/status_macros.h"

namespace refit::storage {

absl::StatusOr<std::unique_ptr<ShmEngineStorage>> ShmEngineStorage::Open(std::vector<ShmParam> params) {
  auto s = std::unique_ptr<ShmEngineStorage>(new ShmEngineStorage());
  for (ShmParam& p : params) {
    auto it = s->regions_.find(p.region);
    if (it == s->regions_.end()) {
      absl::StatusOr<std::unique_ptr<ShmRegion>> r = ShmRegion::Open(p.region);
      if (!r.ok()) {
        return absl::Status(r.status().code(), absl::StrCat("parameter '", p.info.name, "': ", r.status().message()));
      }
      it = s->regions_.emplace(p.region, std::move(*r)).first;
    }
    const ShmRegion& region = *it->second;
    absl::StatusOr<uint64_t> dense = DenseBytes(p.info.dtype, p.info.shape);
    if (!dense.ok() || *dense != p.info.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.info.name, "': nbytes ", p.info.nbytes,
                                                     " does not match ", DTypeName(p.info.dtype), ShapeString(p.info.shape)));
    }
    if (p.offset > region.size() || p.info.nbytes > region.size() - p.offset) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.info.name, "': [", p.offset, ", +", p.info.nbytes,
                                                     ") lies outside shm region '", p.region, "' of ", region.size(),
                                                     " bytes"));
    }
    s->addrs_.push_back(region.data() + p.offset);
    s->region_of_.push_back(&region);
    s->infos_.push_back(std::move(p.info));
  }
  return s;
}

absl::Status ShmEngineStorage::WriteFromHost(size_t index, const void* src) {
  if (index >= infos_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  ParallelCopy(addrs_[index], src, infos_[index].nbytes);  // the commit copy, inside the pause
  return absl::OkStatus();
}

absl::Status ShmEngineStorage::ReadToHost(size_t index, void* dst) const {
  if (index >= infos_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  std::memcpy(dst, addrs_[index], infos_[index].nbytes);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShmEngineStorage::Checksum(size_t index) const {
  if (index >= infos_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  return ParallelChecksum64(addrs_[index], infos_[index].nbytes);  // in place, in the shared mapping
}

absl::Status ShmEngineStorage::Flush() {
  // Stores to a shared mapping are visible to the engine once the resume RPC (a syscall and a
  // message) orders after them; a full fence makes the ordering explicit.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return absl::OkStatus();
}

absl::Status ShmEngineStorage::Audit() const {
  std::vector<std::string> stale;
  std::string first_reason;
  std::map<const ShmRegion*, absl::Status> checked;
  for (size_t i = 0; i < infos_.size(); ++i) {
    auto it = checked.find(region_of_[i]);
    if (it == checked.end()) it = checked.emplace(region_of_[i], region_of_[i]->CheckCurrent()).first;
    if (it->second.ok()) continue;
    if (first_reason.empty()) first_reason = std::string(it->second.message());
    stale.push_back(infos_[i].name);
  }
  return StaleError(stale, first_reason);
}

}  // namespace refit::storage
