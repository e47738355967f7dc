#include "transport/builtin_transports.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace refit::transport {
namespace {

void Register(TransportRegistry& r, TransportDescriptor d) {
  if (absl::Status st = r.Add(std::move(d)); !st.ok()) {
    std::fprintf(stderr, "built-in transports: %s\n", std::string(st.message()).c_str());
    std::abort();  // a bug in this file, not an input
  }
}

// A transport that needs what this build lacks (CUDA, NCCL) has no descriptor: not registered.
void Register(TransportRegistry& r, std::optional<TransportDescriptor> d) {
  if (d.has_value()) Register(r, *std::move(d));
}

}  // namespace

TransportRegistry BuiltinTransports() {
  TransportRegistry r;
  Register(r, UcxTransport());  // the default
  Register(r, NcclTransport());
  Register(r, CudaIpcTransport());
  return r;
}

}  // namespace refit::transport
