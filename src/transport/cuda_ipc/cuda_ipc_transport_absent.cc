// The CUDA IPC transport in a build without CUDA (cuda_ipc_transport.h): not built, so not
// registered.
#include "transport/cuda_ipc/cuda_ipc_transport.h"

namespace refit::transport {

std::optional<TransportDescriptor> CudaIpcTransport() { return std::nullopt; }

}  // namespace refit::transport
