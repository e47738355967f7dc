// refitd's mapping of an engine's CUDA virtual-memory allocation (cuMemCreate + cuMemMap in the
// engine: PyTorch's expandable segments, vLLM's sleep-mode allocator), received as a POSIX file
// descriptor: imported (cuMemImportFromShareableHandle), mapped at an address range refitd
// reserves (cuMemAddressReserve, cuMemMap) and made accessible from the device (cuMemSetAccess).
// The physical memory is the engine's: writes through address() are what the engine reads. The
// import holds a reference to it, so an engine that releases its weights frees the memory only
// once refitd has dropped the import too (sleep, unregistration, the engine's death).
//
// The driver API is reached through the runtime's driver entry points, so nothing links libcuda.
// Built only with CUDA.
//
// Threading: create and destroy on any thread; the destructor unmaps each piece, frees the range
// and releases the handles, in the reverse order of acquisition.
#ifndef REFIT_STORAGE_VMM_IMPORT_H_
#define REFIT_STORAGE_VMM_IMPORT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace refit::storage {

class VmmImport {
 public:
  // Imports the pieces of an engine's allocation on `device`, each `size` bytes (the engine's
  // mapping of it, from its start) of the allocation behind its `fd`, mapped at consecutive
  // addresses from address(). The descriptors stay the caller's. Errors: InvalidArgument for no
  // pieces or a size the device's granularity does not divide, Unavailable when the driver lacks
  // virtual memory management, Internal for a failed driver call (naming it).
  struct Piece {
    int fd;
    uint64_t size;
  };
  static absl::StatusOr<std::unique_ptr<VmmImport>> Import(const std::vector<Piece>& pieces, int device);
  ~VmmImport();
  VmmImport(const VmmImport&) = delete;
  VmmImport& operator=(const VmmImport&) = delete;

  uint8_t* address() const { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(va_)); }
  uint64_t size() const { return size_; }

 private:
  VmmImport() = default;
  struct Mapped {
    uint64_t handle = 0;  // CUmemGenericAllocationHandle
    uint64_t offset = 0;  // from va_
    uint64_t size = 0;
    bool mapped = false;
  };
  std::vector<Mapped> pieces_;  // imported handles, in order
  uint64_t va_ = 0;             // CUdeviceptr of the reserved range; 0: none
  uint64_t size_ = 0;
  int device_ = 0;
};

}  // namespace refit::storage

#endif  // REFIT_STORAGE_VMM_IMPORT_H_
