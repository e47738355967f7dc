// Engine side: parameters registered in place, from their device pointers. Parameters are grouped
// by the CUDA allocation holding them (cuMemGetAddressRange: PyTorch's caching allocator puts many
// parameters in one cudaMalloc'd segment), one CUDA IPC handle is exported per allocation base, and
// each parameter is that handle plus its offset from the base. Nothing is copied: refitd writes
// where the engine's kernels (and captured CUDA graphs) read.
//
// CUDA virtual-memory allocations (cuMemCreate + cuMemMap: PyTorch's expandable segments, vLLM's
// sleep-mode allocator) are exported as POSIX file descriptors instead (cuMemExportToShareableHandle,
// one per mapped piece, found by cuMemGetAddressRange). A parameter that runs past its piece takes
// the pieces mapped at the consecutive addresses after it; parameters whose pieces overlap share
// one run of pieces (VmmAllocation), so each piece is exported once. The descriptors pass to
// refitd only over a unix: control connection, at most kMaxFdsPerMessage (client/engine_agent.h).
//
// Refused at registration, naming the parameter and why: host memory, CUDA managed memory, a
// virtual-memory allocation made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, a parameter
// that runs past its mapping into memory that is not mapped there, and more pieces than one
// registration passes.
//
// What each pointer is, which allocation or virtual-memory mapping holds it and which
// virtual-memory allocation is mapped there are the DeviceEnv's answers (common/device_env.h): a
// test injects one whose queries fail. The implementation with CUDA is
// cuda_export.cc; cuda_export_no_cuda.cc is the build without CUDA, where every call is
// Unimplemented.
//
// Threading: call from any thread with the parameters' device usable.
#ifndef REFIT_CLIENT_CUDA_EXPORT_H_
#define REFIT_CLIENT_CUDA_EXPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "client/engine_agent.h"
#include "common/device_env.h"

namespace refit::client {

// Where an exported parameter's allocation was when it was exported, for the engine's audit.
struct InPlaceRecord {
  std::string name;
  uint64_t ptr = 0;
  uint64_t base = 0;  // cuMemGetAddressRange of ptr at export
  uint64_t size = 0;
  int device = 0;
  uint64_t vmm_handle = 0;  // virtual memory: the allocation handle mapped at ptr at export; 0 otherwise
};

struct InPlaceExport {
  std::vector<CudaParam> params;        // one IPC handle per allocation base, or one fd per VMM mapping
  std::vector<InPlaceRecord> records;   // per parameter
  size_t allocations = 0;               // distinct allocation bases
};

// The CUDA virtual-memory allocation mapped at `ptr`, exported: a new POSIX descriptor of it and
// its mapping's base and size (cuMemGetAddressRange). `name` is the parameter errors name.
// Refused (InvalidArgument) for an allocation made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
// or when `env` cannot tell the mapping's range (the error names the parameter and the query's).
struct VmmExport {
  UniqueFd fd;
  uint64_t base = 0;
  uint64_t size = 0;
  int device = 0;
  uint64_t handle = 0;  // CUmemGenericAllocationHandle mapped at ptr
};
absl::StatusOr<VmmExport> ExportVmmAllocation(const std::string& name, const void* ptr, DeviceEnv& env);
inline absl::StatusOr<VmmExport> ExportVmmAllocation(const std::string& name, const void* ptr) {
  return ExportVmmAllocation(name, ptr, DefaultDeviceEnv());
}

// `env` answers the pointer and allocation queries; a failed query refuses the parameter
// (InvalidArgument naming it and the query's error), or is Unavailable when the driver lacks it.
absl::StatusOr<InPlaceExport> ExportInPlace(const std::vector<DevicePtrParam>& params, DeviceEnv& env);
inline absl::StatusOr<InPlaceExport> ExportInPlace(const std::vector<DevicePtrParam>& params) {
  return ExportInPlace(params, DefaultDeviceEnv());
}

// The names of the records whose pointer no longer lies in the allocation it was exported from
// (freed, or the range now belongs to another allocation of another base or size, or, for virtual
// memory, is mapped from another allocation handle). `env` answers the range and handle queries;
// none is stale when it has no range query.
std::vector<std::string> AuditInPlace(const std::vector<InPlaceRecord>& records, DeviceEnv& env);
inline std::vector<std::string> AuditInPlace(const std::vector<InPlaceRecord>& records) {
  return AuditInPlace(records, DefaultDeviceEnv());
}

// AuditInPlace's walk: the names of `records` whose mapping is stale, in record order, asking
// `stale_at(record)` (the driver's queries at its pointer) once per mapping: the records of one
// mapping as exported (device, base, size, virtual-memory handle) all lie in it still, or it is
// gone or changed under every one of them. (A Llama-8B engine's ~300 parameters in one allocation:
// one set of queries instead of ~300, inside the engine's pause.)
template <typename StaleAt>
std::vector<std::string> AuditByMapping(const std::vector<InPlaceRecord>& records, StaleAt stale_at) {
  std::vector<std::string> stale;
  std::map<std::tuple<int, uint64_t, uint64_t, uint64_t>, bool> verdicts;
  for (const InPlaceRecord& r : records) {
    auto [it, first] = verdicts.try_emplace(std::make_tuple(r.device, r.base, r.size, r.vmm_handle), false);
    if (first) it->second = stale_at(r);
    if (it->second) stale.push_back(r.name);
  }
  return stale;
}

}  // namespace refit::client

#endif  // REFIT_CLIENT_CUDA_EXPORT_H_
