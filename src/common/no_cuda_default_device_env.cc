// DefaultDeviceEnv() of a build without CUDA (device_env.h): the no-CUDA env. Builds with CUDA
// define it in cuda_device_env.cc instead.
#include <memory>

#include "common/device_env.h"

namespace refit {

DeviceEnv& DefaultDeviceEnv() {
  static const std::unique_ptr<DeviceEnv> env = NewNoCudaDeviceEnv();
  return *env;
}

}  // namespace refit
