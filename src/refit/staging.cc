#include "refit/staging.h"

#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace refit {

absl::StatusOr<uint8_t*> Staging::Allocate(const std::string& key, DType dtype, const Shape& shape, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  if (buffers_.count(key)) return absl::AlreadyExistsError(absl::StrCat("'", key, "' staged twice"));
  if (nbytes > limit_ - bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("staging limit of ", limit_, " bytes reached (", bytes_,
                                                     " in use, ", nbytes, " more requested)"));
  }
  std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[nbytes == 0 ? 1 : nbytes]);
  if (!buf) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", nbytes, " staging bytes"));
  uint8_t* p = buf.get();
  buffers_.emplace(key, StagedTensor{dtype, shape, nbytes, std::move(buf)});
  bytes_ += nbytes;
  return p;
}

const StagedTensor* Staging::Get(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(key);
  return it == buffers_.end() ? nullptr : &it->second;
}

void Staging::Release(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(key);
  if (it == buffers_.end()) return;
  bytes_ -= it->second.nbytes;
  buffers_.erase(it);
}

uint64_t Staging::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace refit
