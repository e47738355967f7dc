// What refitd and the trainer client know about a data-plane transport: one TransportDescriptor
// per implementation (src/transport/<name>/), collected in a TransportRegistry that the wiring
// code builds (BuiltinTransports() in builtin_transports.h) and passes to whoever chooses a
// transport: the daemon's config and main, the trainer client, the conformance suite. Nothing
// outside src/transport/<name>/ and the wiring file names a transport.
//
// Threading: descriptors and registries are immutable values once built; their factories may be
// called from any thread.
#ifndef REFIT_TRANSPORT_REGISTRY_H_
#define REFIT_TRANSPORT_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/memory.h"
#include "transport/transport.h"

namespace refit {
class FailpointSet;
}  // namespace refit

namespace refit::transport {

// A transport-specific key of the daemon's `data_plane:` config section and its default.
struct ConfigKey {
  std::string name;           // e.g. "ucx_tls"
  std::string default_value;  // used when the config does not set the key
};

// The daemon's data-plane settings, for a transport's listen factory.
struct ListenConfig {
  std::string host = "127.0.0.1";  // data_plane.host: the address senders connect to
  int device = 0;                  // data_plane.device: the CUDA device of the bucket ring
  // Values of the descriptor's config keys (every key present: defaults filled in).
  std::map<std::string, std::string> keys;
  // Test builds: refitd's armed failpoints (common/failpoint.h), which outlive the receiver.
  const FailpointSet* failpoints = nullptr;
};

// The trainer client's side, for a transport's connect factories.
struct ConnectConfig {
  int device = 0;  // the caller's current CUDA device (read only when payloads live on the device)
};

struct TransportDescriptor {
  std::string name;    // data_plane.transport in refitd's config, the metric label
  std::string scheme;  // the prefix of every endpoint it hands out, e.g. "ucx:"
  std::vector<ConfigKey> config_keys;
  // Where bucket payloads live on both ends: the daemon's bucket ring, and the buckets the trainer
  // client packs (host: plain memory, copied from device tensors; device: packed on the GPU).
  storage::MemoryKind payload_memory = storage::MemoryKind::kHost;
  // True when the transport itself guarantees that delivered bytes equal sent bytes: the client
  // then announces no checksum and the session verifies none (its receiver's ChecksIntegrity()
  // says the same). Required for payloads outside host memory.
  bool checks_integrity = false;
  // Device payloads: true when the sender and the receiver may use the same GPU (CUDA IPC: the
  // trainer colocated with the engine); false when they need distinct GPUs (NCCL refuses two ranks
  // of one communicator on one device). The conformance suite places both ends by it.
  bool shares_device = false;
  // Device payloads: the sender sends from any device memory of its GPU that lies in one
  // allocation, not only from buckets of `bucket_memory`, so RefitSession::PushInPlace sends
  // tensors from where they are (CUDA IPC exports each allocation once). Off: PushInPlace packs.
  bool sends_in_place = false;
  // A message may be sent before its receive is posted without risking a sender that never
  // returns: the receiver ends a send that no receive will take once the session it was meant for
  // has ended (a TagMatcher-based receiver drops it). The trainer client then sends a bucket
  // without waiting for its announce's answer (a rank numbering its own buckets). Off (UCX: an
  // unmatched message waits in the peer's queue): a bucket is sent once its announce is answered.
  bool early_sends = false;
  // Daemon side: the long-lived receiver.
  std::function<absl::StatusOr<std::unique_ptr<Receiver>>(const ListenConfig&)> listen;
  // Trainer side: one point-to-point connection to `endpoint` (a Receiver's Endpoint()).
  std::function<absl::StatusOr<std::unique_ptr<Sender>>(const std::string& endpoint, const ConnectConfig&)> connect;
  // Trainer side, fan-out: one sender to every endpoint. Empty: a SequentialGroupSender over
  // `connect`.
  std::function<absl::StatusOr<std::unique_ptr<GroupSender>>(const std::vector<std::string>& endpoints,
                                                             const ConnectConfig&)>
      connect_group;
  // Memory for bucket payloads on `device` (the daemon's bucket ring, the client's buckets).
  std::function<absl::StatusOr<std::unique_ptr<storage::Memory>>(int device)> bucket_memory;

  bool Owns(std::string_view endpoint) const { return endpoint.substr(0, scheme.size()) == scheme; }
};

// The transports a binary was built with, in registration order (the first is the default).
class TransportRegistry {
 public:
  // InvalidArgument when the name or scheme is taken or a factory is missing.
  absl::Status Add(TransportDescriptor descriptor);

  // nullptr when no transport has that name / owns that endpoint.
  const TransportDescriptor* Find(std::string_view name) const;
  const TransportDescriptor* FindByEndpoint(std::string_view endpoint) const;
  // The default transport. REQUIRES: !empty().
  const TransportDescriptor& Default() const { return descriptors_.front(); }
  bool empty() const { return descriptors_.empty(); }
  const std::vector<TransportDescriptor>& descriptors() const { return descriptors_; }
  // "ucx, nccl": for error messages.
  std::string Names() const;
  // Every transport's config keys, for validating a `data_plane:` section.
  std::vector<std::string> ConfigKeys() const;

 private:
  std::vector<TransportDescriptor> descriptors_;
};

// Connects the fan-out sender of `d` to `endpoints`: its own group factory when it has one,
// otherwise one point-to-point sender per endpoint.
absl::StatusOr<std::unique_ptr<GroupSender>> ConnectGroup(const TransportDescriptor& d,
                                                          const std::vector<std::string>& endpoints,
                                                          const ConnectConfig& config);

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_REGISTRY_H_
