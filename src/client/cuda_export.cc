#include "client/cuda_export.h"

#include "absl/strings/str_cat.h"

#if REFIT_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#endif

namespace refit::client {

#if !REFIT_HAVE_CUDA

absl::StatusOr<InPlaceExport> ExportInPlace(const std::vector<DevicePtrParam>& params) {
  return absl::UnimplementedError(absl::StrCat("parameter '", params.empty() ? "" : params[0].name,
                                               "' is CUDA memory, but this library was built without CUDA"));
}

std::vector<std::string> AuditInPlace(const std::vector<InPlaceRecord>&) { return {}; }

#else

namespace {

// Driver entry points through the runtime, so nothing links libcuda (absent without a driver).
struct Driver {
  CUresult (*address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*retain_allocation)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
};

template <typename Fn>
void Load(const char* name, int version, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess) {
    *out = reinterpret_cast<Fn>(fn);
  }
  (void)cudaGetLastError();
}

const Driver& GetDriver() {
  static const Driver d = [] {
    Driver d;
    Load("cuMemGetAddressRange", 3020, &d.address_range);
    Load("cuMemRetainAllocationHandle", 11000, &d.retain_allocation);
    Load("cuMemRelease", 10020, &d.release);
    return d;
  }();
  return d;
}

// Why `ptr` cannot be exported by a CUDA IPC handle, or "" when it can.
std::string NotShareable(const Driver& d, const void* ptr, int* device) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return "it is not CUDA memory";
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice: break;
    case cudaMemoryTypeManaged: return "it is CUDA managed (unified) memory, which CUDA IPC cannot share";
    case cudaMemoryTypeHost: return "it is host memory (register host parameters through shared memory)";
    default: return "it is not CUDA device memory";
  }
  *device = attr.device;
  if (d.retain_allocation != nullptr) {
    CUmemGenericAllocationHandle h;
    if (d.retain_allocation(&h, const_cast<void*>(ptr)) == CUDA_SUCCESS) {
      if (d.release != nullptr) d.release(h);
      return "it is in a CUDA virtual-memory allocation (cuMemCreate/cuMemMap: expandable segments, a memory "
             "saver or sleep mode), which a CUDA IPC handle cannot export";
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<InPlaceExport> ExportInPlace(const std::vector<DevicePtrParam>& params) {
  const Driver& d = GetDriver();
  if (d.address_range == nullptr) return absl::UnavailableError("the CUDA driver has no cuMemGetAddressRange");
  InPlaceExport out;
  struct Allocation {
    uint64_t size;
    std::array<uint8_t, 64> handle;
  };
  std::map<uint64_t, Allocation> bases;
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  for (const DevicePtrParam& p : params) {
    if (p.ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': device pointer is NULL"));
    int device = -1;
    if (std::string why = NotShareable(d, p.ptr, &device); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' cannot be registered in place: ", why));
    }
    cudaSetDevice(device);
    CUdeviceptr base = 0;
    size_t size = 0;
    if (d.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(p.ptr)) != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': cannot query its CUDA allocation"));
    }
    absl::StatusOr<uint64_t> nbytes = DenseBytes(p.dtype, p.shape);
    if (!nbytes.ok()) return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': ", nbytes.status().message()));
    const uint64_t offset = reinterpret_cast<uint64_t>(p.ptr) - static_cast<uint64_t>(base);
    if (*nbytes > size - offset) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': ", *nbytes, " bytes at offset ", offset,
                                                     " run past its CUDA allocation of ", size, " bytes"));
    }
    auto it = bases.find(static_cast<uint64_t>(base));
    if (it == bases.end()) {
      cudaIpcMemHandle_t h;
      cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name,
                                                       "' cannot be registered in place: cudaIpcGetMemHandle: ",
                                                       cudaGetErrorString(e)));
      }
      Allocation a{static_cast<uint64_t>(size), {}};
      std::memcpy(a.handle.data(), &h, sizeof(h));
      it = bases.emplace(static_cast<uint64_t>(base), a).first;
    }
    out.params.push_back({p.name, p.dtype, p.shape, it->second.handle, offset, device});
    out.records.push_back({p.name, reinterpret_cast<uint64_t>(p.ptr), static_cast<uint64_t>(base),
                           static_cast<uint64_t>(size), device});
  }
  if (restore) cudaSetDevice(previous);
  out.allocations = bases.size();
  return out;
}

std::vector<std::string> AuditInPlace(const std::vector<InPlaceRecord>& records) {
  std::vector<std::string> stale;
  const Driver& d = GetDriver();
  if (d.address_range == nullptr || records.empty()) return stale;
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  int current = -1;
  for (const InPlaceRecord& r : records) {
    if (r.device != current) {
      // The driver queries need the device's (primary) context current on this thread, which the
      // agent's thread otherwise lacks.
      if (cudaSetDevice(r.device) != cudaSuccess) {
        (void)cudaGetLastError();
        stale.push_back(r.name);
        continue;
      }
      cudaFree(nullptr);  // makes the primary context current on older runtimes too
      current = r.device;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (d.address_range(&base, &size, static_cast<CUdeviceptr>(r.ptr)) != CUDA_SUCCESS ||
        static_cast<uint64_t>(base) != r.base || static_cast<uint64_t>(size) != r.size) {
      stale.push_back(r.name);
    }
  }
  if (restore) cudaSetDevice(previous);
  (void)cudaGetLastError();
  return stale;
}

#endif

}  // namespace refit::client
