// The parameter list of a registerEngine or wake call, read into storage's values: shm, CUDA IPC
// and CUDA virtual-memory parameters. A virtual-memory allocation's file descriptor is taken from
// the capability the engine attached to its first parameter (Capability::Client::getFd; present
// only when the call came over a Unix socket, common/fd_passing.h) and duplicated, so it outlives
// the message. Refusals (InvalidArgument) name the parameter.
//
// Threading: on the event loop thread, while the call's message is alive.
#ifndef REFIT_SERVER_ENGINE_PARAMS_H_
#define REFIT_SERVER_ENGINE_PARAMS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "proto/refit.capnp.h"
#include "storage/cuda_params.h"
#include "storage/shm_storage.h"

namespace refit::server {

struct EngineParamList {
  std::vector<storage::ShmParam> shm;
  std::vector<storage::CudaIpcParam> cuda;  // CUDA IPC and virtual-memory parameters, in order
};

absl::StatusOr<EngineParamList> ReadEngineParams(capnp::List<proto::EngineParam>::Reader list);

}  // namespace refit::server

#endif  // REFIT_SERVER_ENGINE_PARAMS_H_
