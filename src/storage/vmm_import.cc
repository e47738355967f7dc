#include "storage/vmm_import.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/cuda_vmm.h"

namespace refit::storage {
namespace {

absl::Status DriverError(const CudaVmmDriver& d, CUresult r, const char* call) {
  const char* text = nullptr;
  if (d.error_string != nullptr) d.error_string(r, &text);
  return absl::InternalError(absl::StrCat(call, ": ", text != nullptr ? text : "CUDA driver error ", static_cast<int>(r)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<VmmImport>> VmmImport::Import(const std::vector<Piece>& pieces, int device) {
  const CudaVmmDriver& d = VmmDriver();
  if (!d.can_import()) return absl::UnavailableError("the CUDA driver has no virtual memory management (cuMem*)");
  if (pieces.empty()) return absl::InvalidArgumentError("a CUDA virtual-memory allocation of no pieces");
  // The driver calls act on the device's primary context, which must be current on this thread.
  if (absl::Status st = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !st.ok()) return st;
  if (absl::Status st = CudaStatus(cudaFree(nullptr), "initializing the CUDA context"); !st.ok()) return st;
  const CUmemAllocationProp prop = DeviceVmmProp(device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t granularity = 0;
  if (CUresult r = d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM); r != CUDA_SUCCESS) {
    return DriverError(d, r, "cuMemGetAllocationGranularity");
  }
  uint64_t total = 0;
  for (const Piece& p : pieces) {
    if (granularity == 0 || p.size == 0 || p.size % granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat("a CUDA virtual-memory mapping of ", p.size,
                                                     " bytes is not a multiple of the device's granularity (",
                                                     granularity, " bytes)"));
    }
    if (p.size > UINT64_MAX - total) return absl::InvalidArgumentError("CUDA virtual-memory pieces past 2^64 bytes");
    total += p.size;
  }
  auto v = std::unique_ptr<VmmImport>(new VmmImport());
  v->device_ = device;
  v->size_ = total;
  CUdeviceptr va = 0;
  if (CUresult r = d.reserve(&va, total, granularity, 0, 0); r != CUDA_SUCCESS) return DriverError(d, r, "cuMemAddressReserve");
  v->va_ = va;
  uint64_t offset = 0;
  for (const Piece& p : pieces) {
    CUmemGenericAllocationHandle handle = 0;
    if (CUresult r = d.import(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(p.fd)),
                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        r != CUDA_SUCCESS) {
      return DriverError(d, r, "cuMemImportFromShareableHandle");
    }
    v->pieces_.push_back({static_cast<uint64_t>(handle), offset, p.size, false});
    if (CUresult r = d.map(va + offset, p.size, 0, handle, 0); r != CUDA_SUCCESS) return DriverError(d, r, "cuMemMap");
    v->pieces_.back().mapped = true;
    offset += p.size;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = d.set_access(va, total, &access, 1); r != CUDA_SUCCESS) return DriverError(d, r, "cuMemSetAccess");
  return v;
}

VmmImport::~VmmImport() {
  const CudaVmmDriver& d = VmmDriver();
  if (!d.can_import()) return;
  cudaSetDevice(device_);
  for (auto it = pieces_.rbegin(); it != pieces_.rend(); ++it) {
    if (it->mapped) d.unmap(static_cast<CUdeviceptr>(va_ + it->offset), it->size);
  }
  if (va_ != 0) d.address_free(static_cast<CUdeviceptr>(va_), size_);
  for (auto it = pieces_.rbegin(); it != pieces_.rend(); ++it) {
    d.release(static_cast<CUmemGenericAllocationHandle>(it->handle));
  }
  (void)cudaGetLastError();
}

}  // namespace refit::storage
