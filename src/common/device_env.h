// DeviceEnv: the one seam between refitd's C++ and the CUDA runtime and driver for questions about
// memory: what a pointer is (host, device, managed; which device), which allocation holds it (base,
// size, buffer id, whether CUDA IPC can share it), which virtual-memory allocation is mapped at it
// and how far CUDA virtual memory runs from it, and the calling thread's device. The client, the
// server, storage and the data planes ask through it instead of calling cudaPointerGetAttributes /
// cuPointerGetAttributes / cuMemGetAddressRange / cuMemRetainAllocationHandle themselves, so that they compile without
// CUDA conditionals and tests can inject an env whose queries fail (LevelDB's Env and its fault-injection tests).
//
// Implementations: the CUDA one (cuda_device_env.cc, CUDA builds; its driver calls come from the
// one driver table, common/cuda_vmm.h) and the no-CUDA one (no_cuda_device_env.cc, every build),
// which answers every query with "this build has no CUDA". DefaultDeviceEnv() is the build's.
//
// This header includes no CUDA header. Threading: every method is thread-safe; the default env
// lives as long as the process and holds no state of its own.
#ifndef REFIT_COMMON_DEVICE_ENV_H_
#define REFIT_COMMON_DEVICE_ENV_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace refit {

// What memory a pointer is, as cudaPointerGetAttributes tells it.
enum class PointerMemory : uint8_t { kUnregistered, kHost, kDevice, kManaged };

struct PointerInfo {
  PointerMemory memory = PointerMemory::kUnregistered;
  int device = -1;  // the device of device (and managed) memory
};

// The CUDA allocation holding a pointer (cuPointerGetAttributes).
struct AllocationInfo {
  bool device = false;       // device memory (cudaMalloc or similar), not host or managed memory
  bool ipc_capable = false;  // cudaIpcGetMemHandle works on it (not stream-ordered pool memory)
  uint64_t buffer_id = 0;    // unique for the process's lifetime (CU_POINTER_ATTRIBUTE_BUFFER_ID)
  uint64_t base = 0;
  uint64_t size = 0;
  int ordinal = -1;  // its device
};

// An allocation's (or a virtual-memory mapping's) address range (cuMemGetAddressRange).
struct AddressRange {
  uint64_t base = 0;
  uint64_t size = 0;
};

class DeviceEnv {
 public:
  virtual ~DeviceEnv() = default;

  // Whether this env reaches a CUDA runtime (a build with CUDA). A driver or a device may still be
  // missing: the queries say so.
  virtual bool has_cuda() const = 0;

  // What `p` is. An error when the query itself fails (its message names the query and why);
  // Unimplemented without CUDA. Plain host memory is kUnregistered, not an error.
  virtual absl::StatusOr<PointerInfo> QueryPointer(const void* p) = 0;

  // The allocation holding `p`; plain host memory gives device = false. Unavailable when the driver
  // has no such query (or there is no CUDA).
  virtual absl::StatusOr<AllocationInfo> QueryAllocation(const void* p) = 0;

  // The allocation or virtual-memory mapping holding device address `p`. Unavailable when the
  // driver has no cuMemGetAddressRange (or there is no CUDA); InvalidArgument when `p` lies in none.
  virtual absl::StatusOr<AddressRange> QueryAddressRange(const void* p) = 0;

  // The bytes from `p` to the end of the CUDA virtual-memory pieces mapped one after another from
  // the one holding `p` (looking no further than `limit` bytes, nor past `max_pieces` pieces); 0
  // when `p` is not in virtual memory or there is no CUDA.
  virtual uint64_t VmmMappedBytes(const void* p, uint64_t limit, uint32_t max_pieces) = 0;

  // The handle of the CUDA virtual-memory allocation mapped at `p` (cuMemRetainAllocationHandle,
  // its reference released at once: an identity to compare, not one to use); 0 when `p` is not in
  // virtual memory or there is no CUDA.
  virtual uint64_t MappedVmmHandle(const void* p) = 0;

  // The calling thread's current CUDA device; Unavailable without CUDA or a device.
  virtual absl::StatusOr<int> CurrentDevice() = 0;
};

// The build's env: the CUDA one in builds with CUDA, else the no-CUDA one. Never null; lives as
// long as the process (it holds no state).
DeviceEnv& DefaultDeviceEnv();

// An env that answers as a build without CUDA does, in every build (tests; hosts without CUDA).
std::unique_ptr<DeviceEnv> NewNoCudaDeviceEnv();

}  // namespace refit

#endif  // REFIT_COMMON_DEVICE_ENV_H_
