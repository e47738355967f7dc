// Device checksum of a byte range: the same value as refit::ParallelChecksum64
// (common/parallel_checksum.h) computes on the host for the same bytes and seed.
// Threading: enqueues work on `stream` (a cudaStream_t as void*).
#ifndef REFIT_KERNELS_CHECKSUM_H_
#define REFIT_KERNELS_CHECKSUM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace refit::kernels {

// Writes the checksum of device bytes [data, data + bytes) into the device word *result.
absl::Status DeviceChecksum(const void* data, uint64_t bytes, uint64_t seed, uint64_t* result, void* stream);

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_CHECKSUM_H_
