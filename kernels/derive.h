// Derived engine parameters, recomputed from the staged weights at each commit (FORMATS.md
// B §10). Threading: enqueues work on `stream` (a cudaStream_t as void*); device pointers.
#ifndef REFIT_KERNELS_DERIVE_H_
#define REFIT_KERNELS_DERIVE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace refit::kernels {

// Gemma zero-centred RMSNorm: out[i] = RN_dtype(w[i] + 1), computed in fp32 and rounded to the
// parameter's dtype (BF16, F16 or F32), as torch's add(weight, 1.0, out=gemma_weight) does.
// `out` may alias `w` only exactly (in place).
absl::Status GemmaPlusOne(const void* w, DType dtype, int64_t n, void* out, void* stream);

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_DERIVE_H_
