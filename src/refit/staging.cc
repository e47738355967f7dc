#include "refit/staging.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace refit {

absl::StatusOr<uint8_t*> StagingPool::Get(size_t index, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(index);
  if (it != buffers_.end() && it->second.bytes >= nbytes) return it->second.data.get();
  absl::StatusOr<std::shared_ptr<uint8_t>> data = memory_->Allocate(nbytes);
  if (!data.ok()) return data.status();
  if (it != buffers_.end()) bytes_ -= it->second.bytes;
  buffers_[index] = Buffer{std::move(*data), nbytes};
  bytes_ += nbytes;
  return buffers_[index].data.get();
}

uint64_t StagingPool::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

absl::StatusOr<uint8_t*> Staging::Allocate(size_t index, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  if (staged_.count(index)) return absl::AlreadyExistsError(absl::StrCat("parameter #", index, " staged twice"));
  if (nbytes > limit_ - bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("staging limit of ", limit_, " bytes reached (", bytes_,
                                                     " in use, ", nbytes, " more requested)"));
  }
  absl::StatusOr<uint8_t*> buf = pool_.Get(index, nbytes);
  if (!buf.ok()) return buf.status();
  staged_[index] = *buf;
  bytes_ += nbytes;
  return *buf;
}

const uint8_t* Staging::Get(size_t index) const {
  absl::MutexLock lock(&mu_);
  auto it = staged_.find(index);
  return it == staged_.end() ? nullptr : it->second;
}

uint64_t Staging::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace refit
