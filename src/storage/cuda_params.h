// What an engine registers for a parameter in GPU memory, as refitd reads it from the control
// plane (plain C++, no CUDA types: the server reads registrations in builds without CUDA too):
//   - CUDA IPC: the cudaIpcMemHandle_t bytes of the allocation holding it and its offset;
//   - CUDA virtual memory (cuMemCreate + cuMemMap): the allocation's POSIX file descriptor
//     (cuMemExportToShareableHandle in the engine, passed over the Unix socket), the size of its
//     mapping and the parameter's offset in it. The parameters of one allocation share one source.
//
// Threading: plain values.
#ifndef REFIT_STORAGE_CUDA_PARAMS_H_
#define REFIT_STORAGE_CUDA_PARAMS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/unique_fd.h"
#include "storage/engine_storage.h"

namespace refit::storage {

inline constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

// One mapped piece of an engine's CUDA virtual-memory allocation, as refitd received it.
struct VmmSourcePiece {
  UniqueFd fd;        // refitd's own descriptor of the exported piece
  uint64_t size = 0;  // bytes of the engine's mapping of it; refitd maps [0, size)
};

// A CUDA virtual-memory allocation of the engine: one piece, or a run of pieces the engine mapped
// at consecutive addresses, which refitd maps the same way.
struct VmmSource {
  std::vector<VmmSourcePiece> pieces;  // in address order
  uint64_t size = 0;                   // their sum
  int device = 0;
};

struct CudaIpcParam {
  ParamInfo info;
  std::array<uint8_t, kCudaIpcHandleBytes> handle;  // unused when `vmm` is set
  uint64_t offset;
  int device;
  std::shared_ptr<const VmmSource> vmm;  // set: the parameter lies in this allocation at `offset`
};

}  // namespace refit::storage

#endif  // REFIT_STORAGE_CUDA_PARAMS_H_
