// Staging: the converted, checkpoint-format tensors of one session (this rank's part of each),
// keyed by checkpoint tensor name, held until commit; the committer assembles engine
// parameters from them. Host memory here; bounded by the configured limit (checked before
// allocating). Thread-safe: all methods lock; a buffer is written by one converter and read
// after Finish. Entries are stable in memory until released.
#ifndef REFIT_REFIT_STAGING_H_
#define REFIT_REFIT_STAGING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"

namespace refit {

struct StagedTensor {
  DType dtype;
  Shape shape;
  uint64_t nbytes = 0;
  std::unique_ptr<uint8_t[]> data;
};

class Staging {
 public:
  explicit Staging(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // A new buffer for `key`. ResourceExhausted past the limit; AlreadyExists if already staged.
  absl::StatusOr<uint8_t*> Allocate(const std::string& key, DType dtype, const Shape& shape, uint64_t nbytes);
  // The staged tensor, or nullptr.
  const StagedTensor* Get(const std::string& key) const;
  // Frees `key` (no-op when absent).
  void Release(const std::string& key);
  uint64_t bytes() const;
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  mutable absl::Mutex mu_;
  std::map<std::string, StagedTensor> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_STAGING_H_
