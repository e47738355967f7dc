// The CUDA IPC transport's descriptor (registry.h): device payloads for a trainer on refitd's
// host, usually on the engine's own GPU (colocated RL). Scheme "cuda_ipc:", one config key
// (cuda_ipc_socket), bucket ring on data_plane.device, no announced checksum (copies within GPU
// memory), trainer and refitd may share a device. Needs `staging: device` in refitd.
// Registered only in builds with CUDA: without it the descriptor is none
// (cuda_ipc_transport_absent.cc, compiled instead of the transport).
#ifndef REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_TRANSPORT_H_
#define REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_TRANSPORT_H_

#include <optional>

#include "transport/registry.h"

namespace refit::transport {

// The descriptor; nullopt in a build without CUDA.
std::optional<TransportDescriptor> CudaIpcTransport();

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_TRANSPORT_H_
