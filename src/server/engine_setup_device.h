// The CUDA half of the engine setup (engine_setup.h): storage over an engine's GPU parameters and
// device staging with the GPU converter. Implemented by engine_setup_cuda.cc in builds with CUDA
// and by engine_setup_no_cuda.cc without, so that engine_setup.cc holds no CUDA conditional.
//
// Threading: as engine_setup.h.
#ifndef REFIT_SERVER_ENGINE_SETUP_DEVICE_H_
#define REFIT_SERVER_ENGINE_SETUP_DEVICE_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "refit/engine_record.h"
#include "storage/cuda_params.h"
#include "storage/engine_storage.h"

namespace refit::server {

// Maps the engine's GPU parameters (CUDA IPC and CUDA virtual memory). Without CUDA:
// InvalidArgument naming the first parameter. REQUIRES: `params` is not empty.
absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenDeviceStorage(std::vector<storage::CudaIpcParam> params);

// Device staging on the GPU of `setup.storage` and the GPU converter, into `setup`. Without CUDA:
// Unavailable (no storage is on a GPU there). REQUIRES: setup.storage->on_device().
absl::Status MakeDeviceStaging(EngineSetup& setup);

}  // namespace refit::server

#endif  // REFIT_SERVER_ENGINE_SETUP_DEVICE_H_
