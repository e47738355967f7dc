#include "server/engine_setup.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/device_env.h"
#include "refit/cpu_converter.h"
#include "server/engine_params.h"
#include "server/engine_setup_device.h"
#include "storage/shm_storage.h"
#include "transport/builtin_transports.h"

namespace refit::server {

absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenStorage(capnp::List<proto::EngineParam>::Reader list) {
  absl::StatusOr<EngineParamList> params = ReadEngineParams(list);
  if (!params.ok()) return params.status();
  if (!params->cuda.empty()) {
    if (!params->shm.empty())
      return absl::InvalidArgumentError("an engine registers all parameters in shm or all on the GPU");
    return OpenDeviceStorage(std::move(params->cuda));
  }
  absl::StatusOr<std::unique_ptr<storage::ShmEngineStorage>> s =
      storage::ShmEngineStorage::Open(std::move(params->shm));
  if (!s.ok()) return s.status();
  return std::unique_ptr<storage::EngineStorage>(std::move(*s));
}

absl::Status MakeStaging(const Config& config, EngineSetup& setup) {
  const storage::EngineStorage& storage = *setup.storage;
  // staging: direct converts into the engine's memory: on its GPU (as device staging, whose pool
  // holds what cannot be placed) or, for host (shm) parameters, on the host.
  if (config.staging == "direct") {
    const transport::TransportRegistry transports = transport::BuiltinTransports();
    const transport::TransportDescriptor* t = transports.Find(config.transport);
    if (t != nullptr && t->payload_memory == storage::MemoryKind::kDevice && !storage.on_device()) {
      return absl::InvalidArgumentError(absl::StrCat("config says staging: direct with the ", t->name,
                                                     " data plane (buckets on the GPU), but the engine registered "
                                                     "host (shm) parameters"));
    }
    if (storage.on_device() && t != nullptr && t->payload_memory == storage::MemoryKind::kDevice &&
        storage.device() != config.data_device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config says staging: direct, but the engine's parameters are on "
          "GPU ",
          storage.device(), " and data_plane.device is ", config.data_device, "; they must be the same GPU"));
    }
  }
  if (config.staging == "device" || (config.staging == "direct" && storage.on_device())) {
    if (!storage.on_device()) {
      return absl::InvalidArgumentError("config says staging: device, but the engine registered host (shm) parameters");
    }
    // (Without CUDA no storage is on a GPU: host staging below, as ever.)
    if (DefaultDeviceEnv().has_cuda()) return MakeDeviceStaging(setup);
  }
  // Host staging: pinned when the engine is on the GPU, so the commit copy is a fast H2D copy.
  const bool pinned = storage.on_device();
  setup.pool = std::make_unique<StagingPool>(pinned ? storage::NewPinnedHostMemory() : storage::NewHostMemory());
  setup.new_pool = [pinned] {
    return std::make_unique<StagingPool>(pinned ? storage::NewPinnedHostMemory() : storage::NewHostMemory());
  };
  setup.converter = std::make_unique<CpuConverter>();
  return absl::OkStatus();
}

}  // namespace refit::server
