// The engine setup's CUDA half in builds with CUDA (engine_setup_device.h).
#include <cstdlib>
#include <memory>
#include <utility>

#include "refit/gpu/gpu_converter.h"
#include "server/engine_setup_device.h"
#include "storage/cuda_ipc_storage.h"
#include "storage/memory.h"

namespace refit::server {

absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenDeviceStorage(std::vector<storage::CudaIpcParam> params) {
  absl::StatusOr<std::unique_ptr<storage::CudaIpcEngineStorage>> s =
      storage::CudaIpcEngineStorage::Open(std::move(params));
  if (!s.ok()) return s.status();
  return std::unique_ptr<storage::EngineStorage>(std::move(*s));
}

absl::Status MakeDeviceStaging(EngineSetup& setup) {
  const storage::EngineStorage& storage = *setup.storage;
  absl::StatusOr<std::unique_ptr<storage::Memory>> memory = storage::NewDeviceMemory(storage.device());
  if (!memory.ok()) return memory.status();
  GpuConverterOptions options;
  // Benchmark knob (docs/operations.md "Tuning the GPU converter"): the input bytes of a batched
  // NVFP4 run.
  if (const char* mib = std::getenv("REFIT_NVFP4_RUN_MIB"); mib != nullptr && std::atoll(mib) > 0) {
    options.max_nvfp4_run_bytes = static_cast<uint64_t>(std::atoll(mib)) << 20;
  }
  absl::StatusOr<std::unique_ptr<Converter>> converter = NewGpuConverter(storage.device(), options);
  if (!converter.ok()) return converter.status();
  setup.pool = std::make_unique<StagingPool>(std::move(*memory));
  setup.converter = std::move(*converter);
  const int device = storage.device();
  setup.new_pool = [device]() -> std::unique_ptr<StagingPool> {
    absl::StatusOr<std::unique_ptr<storage::Memory>> m = storage::NewDeviceMemory(device);
    // The device was usable at registration; if it no longer is, allocations fail (overloaded).
    return std::make_unique<StagingPool>(m.ok() ? std::move(*m) : storage::NewHostMemory());
  };
  return absl::OkStatus();
}

}  // namespace refit::server
