// One launch that copies many device regions (the commit window's writes into engine memory):
// a run of small cudaMemcpyAsync calls costs a few microseconds each, which for hundreds of
// parameters exceeds the copy itself. Threading: enqueues on `stream` (cudaStream_t as void*).
#ifndef REFIT_KERNELS_BATCH_COPY_H_
#define REFIT_KERNELS_BATCH_COPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/device_allocation.h"

namespace refit::kernels {

struct CopyRegion {
  void* dst;        // device
  const void* src;  // device
  uint64_t bytes;
};

// A copy plan uploaded to the device ahead of time (e.g. before the engine pauses), so that
// Launch is one kernel launch and nothing else.
class BatchCopy {
 public:
  // Uploads the region table of `count` regions (synchronously, on `stream`).
  static absl::StatusOr<std::unique_ptr<BatchCopy>> Create(const CopyRegion* regions, size_t count, void* stream);
  ~BatchCopy();
  BatchCopy(const BatchCopy&) = delete;
  BatchCopy& operator=(const BatchCopy&) = delete;

  // Enqueues the copy of every region on `stream`.
  absl::Status Launch(void* stream) const;
  uint64_t bytes() const { return bytes_; }

 private:
  BatchCopy() = default;
  DeviceAllocation table_;  // device: regions, then the chunk prefix sums
  uint32_t regions_ = 0;
  uint64_t chunks_ = 0;
  uint64_t bytes_ = 0;
};

// Copies every region with no table and no synchronization: the regions travel in the kernel's
// parameters, kCopyRegionsPerLaunch per launch (a stacked parameter's pieces assembled before the
// engine pauses: one launch where one cudaMemcpyAsync per piece cost a few microseconds each).
// Regions must not overlap. Enqueues on `stream`.
inline constexpr size_t kCopyRegionsPerLaunch = 128;
absl::Status CopyRegions(const CopyRegion* regions, size_t count, void* stream);

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_BATCH_COPY_H_
