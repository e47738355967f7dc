// The UCX transport's descriptor (registry.h): host payloads over UCP tag matching, bucket ring in
// pinned host memory, integrity checked by the session (Checksum64 of every bucket).
// Config key: data_plane.ucx_tls (UCX_TLS of refitd's receiver, default "tcp,sm,self").
#ifndef REFIT_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define REFIT_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include "transport/registry.h"

namespace refit::transport {

TransportDescriptor UcxTransport();

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_UCX_UCX_TRANSPORT_H_
