// The NCCL transport in a build without CUDA or NCCL (nccl_transport.h): not built, so not
// registered.
#include "transport/nccl/nccl_transport.h"

namespace refit::transport {

std::optional<TransportDescriptor> NcclTransport() { return std::nullopt; }

}  // namespace refit::transport
