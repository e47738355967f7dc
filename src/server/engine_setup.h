// What the server decides for a registering (or waking) engine that the core leaves to it: the
// engine's storage, mapped from the parameters it registered (POSIX shm, or CUDA IPC handles and
// CUDA virtual-memory descriptors), and its staging and converter by the config's `staging:`
// (host staging and the CPU converter, or device staging and the GPU converter; host only for an
// engine of several ranks, whose staging the node makes through NodeOptions::make_staging).
//
// Threading: OpenStorage on the event loop thread, while the call's message is alive;
// MakeStaging wherever the node calls it.
#ifndef REFIT_SERVER_ENGINE_SETUP_H_
#define REFIT_SERVER_ENGINE_SETUP_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/refit.capnp.h"
#include "refit/engine_record.h"
#include "server/config.h"
#include "storage/engine_storage.h"

namespace refit::server {

// Maps the engine's registered parameters: all in POSIX shm, or all in GPU memory (CUDA IPC and
// CUDA virtual memory).
absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenStorage(capnp::List<proto::EngineParam>::Reader list);

// Staging memory and converter for a registered engine: host staging and the CPU converter, or,
// with `staging: device` and an engine on the GPU, device staging and the GPU converter.
absl::Status MakeStaging(const Config& config, EngineSetup& setup);

}  // namespace refit::server

#endif  // REFIT_SERVER_ENGINE_SETUP_H_
