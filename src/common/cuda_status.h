// The one translation of a CUDA runtime error into absl::Status, used by every CUDA caller
// (storage, the GPU converter, kernels' wrappers, the NCCL transport, the trainer client).
//
// A CUDA error is kInternal: an unexpected device failure (a bug, a broken or lost GPU), never
// something the caller's input controls. Callers that give a failure another meaning re-code it
// at their own seam, visibly: allocation failures are ResourceExhausted ("overloaded", see
// storage/memory.h), and a transport reports Unavailable per transport.h.
//
// `cuda_error` is a cudaError_t passed as an int, so this header needs no CUDA include; the
// implementation (cuda_status.cc) is built only with CUDA. Thread-safe.
#ifndef REFIT_COMMON_CUDA_STATUS_H_
#define REFIT_COMMON_CUDA_STATUS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace refit {

// OK for cudaSuccess (0). Otherwise kInternal "<what>: CUDA error <name> (<description>)", after
// clearing the thread's last-error state so that a later, unrelated call does not report it.
absl::Status CudaStatus(int cuda_error, absl::string_view what);

// The CUDA driver's entry point `name` at API `version` (cuGetProcAddress numbering, e.g. 10020),
// looked up through the runtime so that nothing links libcuda (absent on machines without a
// driver, where refitd must still start for the host path). Null when the driver lacks it.
void* DriverEntryPoint(const char* name, int version);

// DriverEntryPoint cast to `Fn`, stored in `*out` when found; whether it was.
template <typename Fn>
bool LoadDriverEntryPoint(const char* name, int version, Fn* out) {
  void* fn = DriverEntryPoint(name, version);
  if (fn != nullptr) *out = reinterpret_cast<Fn>(fn);
  return fn != nullptr;
}

}  // namespace refit

#endif  // REFIT_COMMON_CUDA_STATUS_H_
