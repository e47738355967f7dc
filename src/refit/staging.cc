#include "refit/staging.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace refit {

absl::StatusOr<uint8_t*> StagingPool::Get(const std::string& key, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(key);
  if (it != buffers_.end() && it->second.bytes >= nbytes) return it->second.data.get();
  absl::StatusOr<std::shared_ptr<uint8_t>> data = memory_->Allocate(nbytes);
  if (!data.ok()) return data.status();
  if (it == buffers_.end()) {
    it = buffers_.emplace(key, Buffer{nullptr, 0}).first;
  } else {
    bytes_ -= it->second.bytes;
  }
  it->second = Buffer{std::move(*data), nbytes};
  bytes_ += nbytes;
  return it->second.data.get();
}

uint64_t StagingPool::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

absl::StatusOr<uint8_t*> Staging::Allocate(const std::string& key, DType dtype, const Shape& shape, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = staged_.try_emplace(key);
  if (!inserted) return absl::AlreadyExistsError(absl::StrCat("'", key, "' staged twice"));
  if (placement_ != nullptr) {
    const Placement::Place* place = placement_->Find(key);
    if (place != nullptr && place->bytes == nbytes) {
      uint8_t* address = placement_->Address(*place);
      it->second = StagedTensor{dtype, shape, nbytes, address, nullptr, true};
      in_place_bytes_ += nbytes;
      return address;
    }
  }
  if (nbytes > limit_ - bytes_) {
    staged_.erase(it);
    return absl::ResourceExhaustedError(absl::StrCat("staging limit of ", limit_, " bytes reached (", bytes_,
                                                     " in use, ", nbytes, " more requested)"));
  }
  absl::StatusOr<uint8_t*> buf = pool_.Get(key, nbytes);
  if (!buf.ok()) {
    staged_.erase(it);
    return buf.status();
  }
  it->second = StagedTensor{dtype, shape, nbytes, *buf, nullptr};
  bytes_ += nbytes;
  return *buf;
}

absl::StatusOr<std::vector<uint8_t*>> Staging::AllocateRun(std::span<const RunPart> parts) {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const RunPart& p : parts) {
    if (staged_.contains(*p.key)) return absl::AlreadyExistsError(absl::StrCat("'", *p.key, "' staged twice"));
    if (placement_ != nullptr && placement_->Find(*p.key) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("'", *p.key, "' has a place in the engine"));
    }
    total += p.nbytes;
  }
  if (parts.empty()) return std::vector<uint8_t*>{};
  if (total > limit_ - bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("staging limit of ", limit_, " bytes reached (", bytes_, " in use, ", total, " more requested)"));
  }
  // The pool keeps the run under a key no tensor has (names are printable), so the next refit of
  // the same tensor takes the same buffer.
  REFIT_ASSIGN_OR_RETURN(uint8_t * base, pool_.Get(absl::StrCat("\x01run\x01", *parts[0].key), total));
  std::vector<uint8_t*> out;
  uint64_t offset = 0;
  for (const RunPart& p : parts) {
    out.push_back(base + offset);
    staged_.try_emplace(*p.key, StagedTensor{p.dtype, *p.shape, p.nbytes, base + offset, nullptr});
    offset += p.nbytes;
  }
  bytes_ += total;
  return out;
}

absl::Status Staging::Reserve(uint64_t nbytes, const std::string& what) {
  absl::MutexLock lock(&mu_);
  if (nbytes > limit_ - bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor '", what, "': staging limit of ", limit_,
                                                     " bytes reached holding a fused member for its group (", bytes_,
                                                     " in use, ", nbytes, " more requested)"));
  }
  bytes_ += nbytes;
  return absl::OkStatus();
}

void Staging::Unreserve(uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  bytes_ -= std::min(bytes_, nbytes);
}

const StagedTensor* Staging::Get(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = staged_.find(key);
  return it == staged_.end() ? nullptr : &it->second;
}

size_t Staging::GetAll(std::span<const std::string> keys, std::vector<const StagedTensor*>& out) const {
  out.clear();
  out.reserve(keys.size());
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = staged_.find(keys[i]);
    if (it == staged_.end()) return i;
    out.push_back(&it->second);
  }
  return keys.size();
}

void Staging::Release(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = staged_.find(key);
  if (it == staged_.end()) return;
  if (!it->second.in_place) bytes_ -= it->second.nbytes;  // in-place bytes never counted against the limit
  staged_.erase(it);
}

void Staging::Place(std::shared_ptr<const Placement> placement) {
  absl::MutexLock lock(&mu_);
  placement_ = std::move(placement);
}

uint64_t Staging::in_place_bytes() const {
  absl::MutexLock lock(&mu_);
  return in_place_bytes_;
}

std::vector<std::string> Staging::Keys() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  keys.reserve(staged_.size());
  for (const auto& [key, t] : staged_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

uint64_t Staging::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace refit
