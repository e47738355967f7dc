#include "refit/staging.h"

#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace refit {

absl::StatusOr<uint8_t*> Staging::Allocate(size_t index, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  if (buffers_.count(index)) return absl::AlreadyExistsError(absl::StrCat("parameter #", index, " staged twice"));
  if (nbytes > limit_ - bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("staging limit of ", limit_, " bytes reached (", bytes_,
                                                     " in use, ", nbytes, " more requested)"));
  }
  std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[nbytes == 0 ? 1 : nbytes]);
  if (!buf) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", nbytes, " staging bytes"));
  uint8_t* p = buf.get();
  buffers_.emplace(index, std::move(buf));
  bytes_ += nbytes;
  return p;
}

const uint8_t* Staging::Get(size_t index) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(index);
  return it == buffers_.end() ? nullptr : it->second.get();
}

uint64_t Staging::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace refit
