// Staging: the converted, checkpoint-format bytes of one session, per engine parameter, held
// until commit. Host memory here; bounded by the configured limit (checked before allocating).
// Thread-safe: Allocate/Get lock; a buffer is written by one converter and read after Finish.
#ifndef REFIT_REFIT_STAGING_H_
#define REFIT_REFIT_STAGING_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace refit {

class Staging {
 public:
  explicit Staging(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // A new buffer of `nbytes` for engine parameter `index`. ResourceExhausted past the limit;
  // AlreadyExists if the parameter is already staged.
  absl::StatusOr<uint8_t*> Allocate(size_t index, uint64_t nbytes);
  // The staged bytes of `index`, or nullptr.
  const uint8_t* Get(size_t index) const;
  uint64_t bytes() const;
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  mutable absl::Mutex mu_;
  std::map<size_t, std::unique_ptr<uint8_t[]>> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_STAGING_H_
