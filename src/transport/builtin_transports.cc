#include "transport/builtin_transports.h"

#include <cstdlib>
#include <cstdio>

#include "transport/ucx/ucx_transport.h"
#if REFIT_HAVE_NCCL
#include "transport/nccl/nccl_transport.h"
#endif
#if REFIT_HAVE_CUDA_IPC
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#endif

namespace refit::transport {
namespace {

void Register(TransportRegistry& r, TransportDescriptor d) {
  if (absl::Status st = r.Add(std::move(d)); !st.ok()) {
    std::fprintf(stderr, "built-in transports: %s\n", std::string(st.message()).c_str());
    std::abort();  // a bug in this file, not an input
  }
}

}  // namespace

TransportRegistry BuiltinTransports() {
  TransportRegistry r;
  Register(r, UcxTransport());  // the default
#if REFIT_HAVE_NCCL
  Register(r, NcclTransport());
#endif
#if REFIT_HAVE_CUDA_IPC
  Register(r, CudaIpcTransport());
#endif
  return r;
}

}  // namespace refit::transport
