#include "transport/nccl/nccl_transport.h"

#include "transport/nccl/nccl_broadcaster.h"
#include "transport/nccl/nccl_receiver.h"
#include "transport/nccl/nccl_sender.h"

namespace refit::transport {

std::optional<TransportDescriptor> NcclTransport() {
  TransportDescriptor d;
  d.name = "nccl";
  d.scheme = "nccl:";
  d.payload_memory = storage::MemoryKind::kDevice;
  d.checks_integrity = true;
  d.listen = [](const ListenConfig& c) -> absl::StatusOr<std::unique_ptr<Receiver>> {
    NcclOptions options;
    options.device = c.device;
    options.listen_host = c.host;
    absl::StatusOr<std::unique_ptr<NcclReceiver>> r = NcclReceiver::Listen(options);
    if (!r.ok()) return r.status();
    return std::unique_ptr<Receiver>(std::move(*r));
  };
  // The trainer's current CUDA device sends (it must differ from refitd's device).
  d.connect = [](const std::string& endpoint, const ConnectConfig& c) -> absl::StatusOr<std::unique_ptr<Sender>> {
    NcclOptions options;
    options.device = c.device;
    absl::StatusOr<std::unique_ptr<NcclSender>> s = NcclSender::Connect(endpoint, options);
    if (!s.ok()) return s.status();
    return std::unique_ptr<Sender>(std::move(*s));
  };
  d.connect_group = [](const std::vector<std::string>& endpoints,
                       const ConnectConfig& c) -> absl::StatusOr<std::unique_ptr<GroupSender>> {
    NcclOptions options;
    options.device = c.device;
    absl::StatusOr<std::unique_ptr<NcclBroadcaster>> g = NcclBroadcaster::Connect(endpoints, options);
    if (!g.ok()) return g.status();
    return std::unique_ptr<GroupSender>(std::move(*g));
  };
  d.bucket_memory = [](int device) { return storage::NewDeviceMemory(device); };
  return d;
}

}  // namespace refit::transport
