// Whether GPU tests can run here, and the one way they skip when they cannot: the reason printed
// (`REFIT_SKIP_WITHOUT_GPU()`, or `GTEST_SKIP() << reason` with a test's own context).
// Include only from sources compiled with the CUDA runtime.
#ifndef REFIT_TESTS_UNIT_CUDA_DEVICE_H_
#define REFIT_TESTS_UNIT_CUDA_DEVICE_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

namespace refit::testing {

// Empty when at least `count` CUDA devices are usable, else why not.
inline std::string MissingCudaDevices(int count = 1) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  const std::string needs = count == 1 ? "needs a CUDA device" : "needs " + std::to_string(count) + " CUDA devices";
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return needs + ": " + cudaGetErrorString(e);
  }
  if (n < count) return needs + ", " + std::to_string(n) + " present";
  return "";
}

}  // namespace refit::testing

#define REFIT_SKIP_WITHOUT_GPU()                                              \
  do {                                                                        \
    const std::string refit_missing = ::refit::testing::MissingCudaDevices(); \
    if (!refit_missing.empty()) GTEST_SKIP() << refit_missing;                \
  } while (0)

#endif  // REFIT_TESTS_UNIT_CUDA_DEVICE_H_
