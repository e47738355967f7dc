// In-place registration with CUDA (cuda_export.h); cuda_export_no_cuda.cc is the build without it.
#include "client/cuda_export.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/cuda_vmm.h"
#include "common/device_env.h"
#include "common/fd_passing.h"

namespace refit::client {
namespace {

// Why `ptr` cannot be registered in place, or "" when it can; `*vmm` says whether it lies in a
// CUDA virtual-memory allocation (exported as a file descriptor) rather than a cudaMalloc'd one
// (exported as a CUDA IPC handle).
std::string NotShareable(DeviceEnv& env, const void* ptr, int* device, bool* vmm) {
  absl::StatusOr<PointerInfo> info = env.QueryPointer(ptr);
  if (!info.ok()) return absl::StrCat("it is not CUDA memory (", info.status().message(), ")");
  switch (info->memory) {
    case PointerMemory::kDevice: break;
    case PointerMemory::kManaged: return "it is CUDA managed (unified) memory, which CUDA IPC cannot share";
    case PointerMemory::kHost: return "it is host memory (register host parameters through shared memory)";
    default: return "it is not CUDA device memory";
  }
  *device = info->device;
  *vmm = env.MappedVmmHandle(ptr) != 0;
  return "";
}

// The mapped pieces (base, size) holding a virtual-memory parameter's `nbytes` from `ptr`: the
// mapping at ptr and, when the parameter runs past it, the mappings at consecutive addresses
// after it (expandable segments map memory piece by piece).
absl::StatusOr<std::vector<std::pair<uint64_t, uint64_t>>> VmmPieces(DeviceEnv& env, const std::string& name,
                                                                     uint64_t ptr, uint64_t nbytes) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  absl::StatusOr<AddressRange> range = env.QueryAddressRange(reinterpret_cast<const void*>(ptr));
  if (absl::IsUnavailable(range.status())) return range.status();  // the driver has no such query
  if (!range.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name, "': cannot query its CUDA virtual-memory mapping (", range.status().message(), ")"));
  }
  pieces.emplace_back(range->base, range->size);
  const uint64_t end = ptr + nbytes;
  while (pieces.back().first + pieces.back().second < end) {
    const uint64_t next = pieces.back().first + pieces.back().second;
    const void* at = reinterpret_cast<const void*>(next);
    bool further = pieces.size() < kMaxFdsPerMessage && env.MappedVmmHandle(at) != 0;
    if (further) {
      range = env.QueryAddressRange(at);
      further = range.ok() && range->base == next;
    }
    if (!further) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "' cannot be registered in place: its ", nbytes, " bytes run past its CUDA ",
          "virtual-memory mapping at 0x", absl::Hex(pieces.back().first), " (", pieces.back().second,
          " bytes) into memory that is not a further mapping of virtual memory"));
    }
    pieces.emplace_back(next, range->size);
  }
  return pieces;
}

// A run of virtual-memory pieces at consecutive addresses, exported: one descriptor per piece.
struct VmmRun {
  uint64_t begin = 0, end = 0;
  std::map<uint64_t, uint64_t> pieces;  // base -> size
  std::shared_ptr<VmmAllocation> allocation;
};

}  // namespace

absl::StatusOr<VmmExport> ExportVmmAllocation(const std::string& name, const void* ptr, DeviceEnv& env) {
  const CudaVmmDriver& d = VmmDriver();
  if (d.retain == nullptr || d.release == nullptr || d.properties == nullptr || d.export_handle == nullptr) {
    return absl::UnavailableError("the CUDA driver has no virtual memory management (cuMem*)");
  }
  CUmemGenericAllocationHandle h;
  if (d.retain(&h, const_cast<void*>(ptr)) != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' is not in a CUDA virtual-memory allocation"));
  }
  VmmExport out;
  out.handle = static_cast<uint64_t>(h);
  absl::Status st = [&]() -> absl::Status {
    CUmemAllocationProp prop{};
    if (d.properties(&prop, h) != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", name, "': cannot read its CUDA virtual-memory allocation's properties"));
    }
    if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "' cannot be registered in place: it is in a CUDA virtual-memory allocation (cuMemCreate) ",
          "made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in its requestedHandleTypes, so it cannot be exported "
          "to refitd (allocate it with that handle type)"));
    }
    absl::StatusOr<AddressRange> range = env.QueryAddressRange(ptr);
    if (absl::IsUnavailable(range.status())) return range.status();  // the driver has no such query
    if (!range.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "': cannot query its CUDA virtual-memory mapping (", range.status().message(), ")"));
    }
    out.base = range->base;
    out.size = range->size;
    out.device = prop.location.id;
    int fd = -1;
    if (CUresult r = d.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0); r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' cannot be registered in place: ",
                                                     "cuMemExportToShareableHandle failed (CUresult ",
                                                     static_cast<int>(r), ")"));
    }
    out.fd = UniqueFd(fd);
    return absl::OkStatus();
  }();
  d.release(h);  // the retain's reference; the engine's own keeps the allocation
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<InPlaceExport> ExportInPlace(const std::vector<DevicePtrParam>& params, DeviceEnv& env) {
  InPlaceExport out;
  struct Allocation {
    uint64_t size;
    std::array<uint8_t, 64> handle;
  };
  std::map<uint64_t, Allocation> bases;
  // Virtual-memory parameters are exported once all are known: parameters whose pieces overlap
  // share one run (so each piece is exported once), in order of their first piece.
  struct VmmParamInfo {
    size_t index;  // into out.params, filled in at the end
    int device;
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
  };
  std::vector<VmmParamInfo> vmm_params;
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  for (const DevicePtrParam& p : params) {
    if (p.ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': device pointer is NULL"));
    int device = -1;
    bool vmm = false;
    if (std::string why = NotShareable(env, p.ptr, &device, &vmm); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' cannot be registered in place: ", why));
    }
    cudaSetDevice(device);
    if (vmm) {
      absl::StatusOr<uint64_t> nbytes = DenseBytes(p.dtype, p.shape);
      if (!nbytes.ok()) return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': ", nbytes.status().message()));
      absl::StatusOr<std::vector<std::pair<uint64_t, uint64_t>>> pieces =
          VmmPieces(env, p.name, reinterpret_cast<uint64_t>(p.ptr), *nbytes);
      if (!pieces.ok()) return pieces.status();
      vmm_params.push_back({out.params.size(), device, std::move(*pieces)});
      out.params.push_back({p.name, p.dtype, p.shape, {}, 0, device, nullptr});
      out.records.push_back({p.name, reinterpret_cast<uint64_t>(p.ptr), vmm_params.back().pieces[0].first,
                             vmm_params.back().pieces[0].second, device, env.MappedVmmHandle(p.ptr)});
      continue;
    }
    absl::StatusOr<AddressRange> range = env.QueryAddressRange(p.ptr);
    if (absl::IsUnavailable(range.status())) return range.status();  // the driver has no such query
    if (!range.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name, "': cannot query its CUDA allocation (", range.status().message(), ")"));
    }
    const uint64_t base = range->base;
    const uint64_t size = range->size;
    absl::StatusOr<uint64_t> nbytes = DenseBytes(p.dtype, p.shape);
    if (!nbytes.ok()) return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': ", nbytes.status().message()));
    const uint64_t offset = reinterpret_cast<uint64_t>(p.ptr) - base;
    if (*nbytes > size - offset) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': ", *nbytes, " bytes at offset ", offset,
                                                     " run past its CUDA allocation of ", size, " bytes"));
    }
    auto it = bases.find(base);
    if (it == bases.end()) {
      cudaIpcMemHandle_t h;
      cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name,
                                                       "' cannot be registered in place: cudaIpcGetMemHandle: ",
                                                       cudaGetErrorString(e)));
      }
      Allocation a{size, {}};
      std::memcpy(a.handle.data(), &h, sizeof(h));
      it = bases.emplace(base, a).first;
    }
    out.params.push_back({p.name, p.dtype, p.shape, it->second.handle, offset, device, nullptr});
    out.records.push_back({p.name, reinterpret_cast<uint64_t>(p.ptr), base, size, device, 0});
  }
  // Runs: the union of overlapping [first piece, last piece end) spans.
  std::map<uint64_t, VmmRun> runs;  // by begin
  {
    std::vector<std::pair<uint64_t, size_t>> spans;  // (begin, vmm_params index)
    for (size_t i = 0; i < vmm_params.size(); ++i) spans.emplace_back(vmm_params[i].pieces.front().first, i);
    std::sort(spans.begin(), spans.end());
    VmmRun* run = nullptr;
    for (const auto& [begin, i] : spans) {
      const auto& pieces = vmm_params[i].pieces;
      const uint64_t end = pieces.back().first + pieces.back().second;
      if (run == nullptr || begin >= run->end) run = &runs.emplace(begin, VmmRun{begin, end, {}, nullptr}).first->second;
      run->end = std::max(run->end, end);
      for (const auto& [base, size] : pieces) run->pieces.emplace(base, size);
    }
  }
  size_t descriptors = 0;
  for (auto& [begin, run] : runs) {
    run.allocation = std::make_shared<VmmAllocation>();
    descriptors += run.pieces.size();
    std::string owner;  // the first parameter (in registration order) in this run, for errors
    for (const VmmParamInfo& v : vmm_params) {
      if (v.pieces.front().first >= run.begin && v.pieces.front().first < run.end) {
        owner = out.params[v.index].name;
        break;
      }
    }
    for (const auto& [base, size] : run.pieces) {
      if (descriptors > kMaxFdsPerMessage) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", owner, "' is in CUDA virtual memory past the ",
                                                       kMaxFdsPerMessage,
                                                       " file descriptors (mapped pieces) one registration passes"));
      }
      absl::StatusOr<VmmExport> exported = ExportVmmAllocation(owner, reinterpret_cast<const void*>(base), env);
      if (!exported.ok()) return exported.status();
      run.allocation->pieces.push_back({std::move(exported->fd), size});
      run.allocation->size += size;
      run.allocation->device = exported->device;
    }
  }
  for (const VmmParamInfo& v : vmm_params) {
    auto it = std::prev(runs.upper_bound(v.pieces.front().first));
    CudaParam& p = out.params[v.index];
    p.offset = out.records[v.index].ptr - it->second.begin;
    p.vmm = it->second.allocation;
  }
  if (restore) cudaSetDevice(previous);
  out.allocations = bases.size() + runs.size();
  return out;
}

std::vector<std::string> AuditInPlace(const std::vector<InPlaceRecord>& records, DeviceEnv& env) {
  if (records.empty()) return {};
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  int current = -1;
  std::vector<std::string> stale = AuditByMapping(records, [&](const InPlaceRecord& r) {
    if (r.device != current) {
      // The driver queries need the device's (primary) context current on this thread, which the
      // agent's thread otherwise lacks.
      if (cudaSetDevice(r.device) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
      }
      cudaFree(nullptr);  // makes the primary context current on older runtimes too
      current = r.device;
    }
    const void* ptr = reinterpret_cast<const void*>(r.ptr);
    absl::StatusOr<AddressRange> range = env.QueryAddressRange(ptr);
    if (absl::IsUnavailable(range.status())) return false;  // the driver has no such query: nothing to audit with
    if (!range.ok() || range->base != r.base || range->size != r.size) return true;
    // Virtual memory: the same range may now be mapped from another allocation (released and
    // created again, as an engine's sleep does) that refitd's import does not see. The driver
    // returns the handle that was used to map the address.
    return r.vmm_handle != 0 && env.MappedVmmHandle(ptr) != r.vmm_handle;
  });
  if (restore) cudaSetDevice(previous);
  (void)cudaGetLastError();
  return stale;
}

}  // namespace refit::client
