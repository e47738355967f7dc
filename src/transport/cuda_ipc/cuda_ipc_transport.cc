#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include "transport/cuda_ipc/cuda_ipc_receiver.h"
#include "transport/cuda_ipc/cuda_ipc_sender.h"

namespace refit::transport {

std::optional<TransportDescriptor> CudaIpcTransport() {
  TransportDescriptor d;
  d.name = "cuda_ipc";
  d.scheme = "cuda_ipc:";
  // The control socket: empty, an abstract-namespace name made at start; else a filesystem path.
  d.config_keys = {{"cuda_ipc_socket", ""}};
  d.payload_memory = storage::MemoryKind::kDevice;
  d.checks_integrity = true;
  d.shares_device = true;
  d.sends_in_place = true;
  d.early_sends = true;  // its TagMatcher drops a message of a session that ended
  d.listen = [](const ListenConfig& c) -> absl::StatusOr<std::unique_ptr<Receiver>> {
    CudaIpcOptions options;
    options.device = c.device;
    if (auto it = c.keys.find("cuda_ipc_socket"); it != c.keys.end()) options.socket_path = it->second;
    absl::StatusOr<std::unique_ptr<CudaIpcReceiver>> r = CudaIpcReceiver::Listen(options);
    if (!r.ok()) return r.status();
    return std::unique_ptr<Receiver>(std::move(*r));
  };
  // The trainer's current CUDA device holds its buckets (refitd's device or another one).
  d.connect = [](const std::string& endpoint, const ConnectConfig& c) -> absl::StatusOr<std::unique_ptr<Sender>> {
    CudaIpcOptions options;
    options.device = c.device;
    absl::StatusOr<std::unique_ptr<CudaIpcSender>> s = CudaIpcSender::Connect(endpoint, options);
    if (!s.ok()) return s.status();
    return std::unique_ptr<Sender>(std::move(*s));
  };
  // cudaMalloc'ed buffers: exportable with cudaIpcGetMemHandle (pool memory is not).
  d.bucket_memory = [](int device) { return storage::NewDeviceMemory(device); };
  return d;
}

}  // namespace refit::transport
