// The one translation of a CUDA runtime error into absl::Status, used by every CUDA caller
// (storage, the GPU converter, kernels' wrappers, the NCCL transport, the trainer client). The
// driver's entry points are looked up in one place, the driver table of cuda_vmm.h.
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

}  // namespace refit

#endif  // REFIT_COMMON_CUDA_STATUS_H_
