// The NCCL transport's descriptor (registry.h): device payloads over NCCL point-to-point (and one
// broadcast for fan-out), bucket ring on refitd's data_plane.device, integrity left to NCCL's
// transports (no announced checksum: reading a device bucket back would cost a device-to-host copy).
// Needs `staging: device` in refitd (its payloads live on the GPU). Registered only in builds with
// CUDA and NCCL: without them the descriptor is none (nccl_transport_absent.cc, compiled instead
// of the transport).
#ifndef REFIT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
#define REFIT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_

#include <optional>

#include "transport/registry.h"

namespace refit::transport {

// The descriptor; nullopt in a build without CUDA or NCCL.
std::optional<TransportDescriptor> NcclTransport();

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
