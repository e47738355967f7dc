#include "transport/ucx/ucx_transport.h"

#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_sender.h"

namespace refit::transport {

TransportDescriptor UcxTransport() {
  TransportDescriptor d;
  d.name = "ucx";
  d.scheme = "ucx:";
  d.config_keys = {{"ucx_tls", "tcp,sm,self"}};
  d.payload_memory = storage::MemoryKind::kHost;
  d.checks_integrity = false;
  d.listen = [](const ListenConfig& c) -> absl::StatusOr<std::unique_ptr<Receiver>> {
    UcxOptions options;
    options.listen_host = c.host;
    options.failpoints = c.failpoints;
    if (auto it = c.keys.find("ucx_tls"); it != c.keys.end()) options.tls = it->second;
    absl::StatusOr<std::unique_ptr<UcxReceiver>> r = UcxReceiver::Listen(options);
    if (!r.ok()) return r.status();
    return std::unique_ptr<Receiver>(std::move(*r));
  };
  d.connect = [](const std::string& endpoint, const ConnectConfig&) -> absl::StatusOr<std::unique_ptr<Sender>> {
    absl::StatusOr<std::unique_ptr<UcxSender>> s = UcxSender::Connect(endpoint, {});
    if (!s.ok()) return s.status();
    return std::unique_ptr<Sender>(std::move(*s));
  };
  // Buckets in page-locked host memory: UCX receives into them, device staging copies from them.
  d.bucket_memory = [](int) -> absl::StatusOr<std::unique_ptr<storage::Memory>> {
    return storage::NewPinnedHostMemory();
  };
  return d;
}

}  // namespace refit::transport
