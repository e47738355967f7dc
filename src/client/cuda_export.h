// Engine side: parameters registered in place, from their device pointers. Parameters are grouped
// by the CUDA allocation holding them (cuMemGetAddressRange: PyTorch's caching allocator puts many
// parameters in one cudaMalloc'd segment), one CUDA IPC handle is exported per allocation base, and
// each parameter is that handle plus its offset from the base. Nothing is copied: refitd writes
// where the engine's kernels (and captured CUDA graphs) read.
//
// Refused at registration, naming the parameter: host memory, CUDA managed memory, and CUDA
// virtual-memory allocations (cuMemCreate/cuMemMap: expandable segments, vLLM sleep mode, SGLang's
// memory saver), which CUDA IPC handles cannot export.
//
// Threading: call from any thread with the parameters' device usable. Built with CUDA; without it
// every call is Unimplemented.
#ifndef REFIT_CLIENT_CUDA_EXPORT_H_
#define REFIT_CLIENT_CUDA_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/engine_agent.h"

namespace refit::client {

// Where an exported parameter's allocation was when it was exported, for the engine's audit.
struct InPlaceRecord {
  std::string name;
  uint64_t ptr = 0;
  uint64_t base = 0;  // cuMemGetAddressRange of ptr at export
  uint64_t size = 0;
  int device = 0;
};

struct InPlaceExport {
  std::vector<CudaParam> params;        // one IPC handle per allocation base
  std::vector<InPlaceRecord> records;   // per parameter
  size_t allocations = 0;               // distinct allocation bases
};

absl::StatusOr<InPlaceExport> ExportInPlace(const std::vector<DevicePtrParam>& params);

// The names of the records whose pointer no longer lies in the allocation it was exported from
// (freed, or the range now belongs to another allocation of another base or size).
std::vector<std::string> AuditInPlace(const std::vector<InPlaceRecord>& records);

}  // namespace refit::client

#endif  // REFIT_CLIENT_CUDA_EXPORT_H_
