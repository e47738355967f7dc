// The CUDA half of memory.cc (memory.h): the copy into host memory from host or device memory.
// Implemented by cuda_memory.cc in builds with CUDA and by no_cuda_memory.cc without, so that
// memory.cc holds no CUDA conditional. (The rest of memory.h's CUDA half, device and pinned
// memory and the device checksum, is declared in memory.h itself.)
//
// Threading: thread-safe.
#ifndef REFIT_STORAGE_MEMORY_DEVICE_H_
#define REFIT_STORAGE_MEMORY_DEVICE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace refit::storage {

// Copies `bytes` from `src`, host memory or (with CUDA) device memory, into host memory `dst`,
// complete on return.
absl::Status CopyAnyToHost(void* dst, const void* src, uint64_t bytes);

}  // namespace refit::storage

#endif  // REFIT_STORAGE_MEMORY_DEVICE_H_
