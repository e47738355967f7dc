// refitd's daemon configuration (YAML), with safe defaults for every limit.
// docs/config.md is the reference. Immutable after load.
#ifndef REFIT_SERVER_CONFIG_H_
#define REFIT_SERVER_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/control_connect.h"
#include "refit/types.h"
#include "transport/registry.h"

namespace refit::server {

struct Config {
  // Control plane: "unix:/path" (default kDefaultControlAddress, common/control_connect.h) or
  // "HOST:PORT". The socket's directory is checked at start (server/socket_dir.h).
  std::string listen = kDefaultControlAddress;
  uint32_t socket_mode = 0660;  // for unix sockets
  std::string socket_group;     // group owning the unix socket; "" leaves refitd's own
  // Access control (docs/security.md). Unix-socket peers: refitd's own uid plus these.
  std::vector<uint32_t> allowed_uids;
  // Shared secret for TCP control connections (first line of the file). Listening on TCP
  // without one is a startup error.
  std::string token_file;
  // TLS for a TCP control plane (docs/security.md): certificate chain and key (PEM); with
  // tls_client_ca, clients must present a certificate signed by one of its CAs.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string model_spec;       // path to the model spec YAML
  std::string model_spec_inline;  // or the spec itself (the embedded demo config uses this)
  // The served model's config.json: the sizes the spec leaves to the model (expert counts,
  // heads, vocabulary) are read from it at start (spec/model_config.h). "": none.
  std::string model_config;
  // Data plane: one transport of the registry the config was parsed against (docs/transports.md).
  std::string transport;  // data_plane.transport; the registry's default when not set
  // The transport's own data_plane keys (its descriptor's config_keys), every one present.
  std::map<std::string, std::string> transport_keys;
  std::string data_host = "127.0.0.1";
  int data_device = 0;  // the CUDA device of the bucket slots when payloads live on the GPU (the engine's GPU)
  std::string staging = "host";  // host | device | direct
  // The event loop spins while a refit is in flight (main.cc): auto (common/busy_poll.h) | on | off.
  std::string busy_poll = "auto";
  SessionLimits limits;
  uint64_t max_message_words = 64ull << 20;  // Cap'n Proto traversal limit per message (words)
  // Control connections (server/connection_limits.h): caps, buffered message bytes, stalls.
  uint32_t max_connections = 128;
  uint32_t max_connections_per_uid = 64;
  uint64_t connection_buffer_bytes = 512ull << 20;
  uint64_t buffered_message_bytes = 1ull << 30;
  uint64_t idle_timeout_ms = 30000;
  std::string admin_listen = "127.0.0.1:0";  // metrics/health HTTP; "" disables
  // With a token (first line of the file), every admin request needs "Authorization: Bearer T".
  std::string admin_token_file;
  uint32_t admin_max_connections = 16;
  // Log (docs/config.md, `log:`): format text | json, level debug | info | warn | error. The
  // level is re-read from the config file on SIGHUP; the format is fixed at start.
  std::string log_format = "text";
  std::string log_level = "info";
  // The engine's pause and resume must answer within these (docs/reliability.md).
  uint32_t pause_timeout_ms = 10'000;
  uint32_t resume_timeout_ms = 10'000;
  // engine.verify_after_commit: after each copy, checksum the engine's bytes against the staged
  // ones before resuming it (docs/reliability.md).
  bool verify_after_commit = false;
  // engine.asleep_refits: stage | refuse. What a refit does while the engine sleeps (released its
  // weights): staged, it is validated and commits when the engine wakes; refused, begin (and a
  // commit of a session the engine fell asleep during) is refused.
  std::string asleep_refits = "stage";
  // hold: K (docs/versions.md): stage-only refits kept in staging, committed later by tag; with
  // K > 0 the current and previous committed versions are kept for rollback while staging has
  // room. 0: none.
  uint32_t hold = 0;
  // group: (docs/config.md "Engine groups"): this daemon serves part of an engine whose ranks span
  // several daemons; group_members 0: none. Needs hold >= 1 (each group version is held first).
  std::string group_name;
  uint32_t group_members = 0;
  uint32_t group_member = 0;
  uint32_t group_decision_timeout_ms = 30'000;
  // Every member's control address in member order (this daemon's own entry is not asked): a
  // member that starts joining asks the others for the group's version (late join). Empty: it
  // does not ask.
  std::vector<std::string> group_addresses;
  // group.peers_unreachable: while no peer answers a joining member (the group's version unknown),
  // "hold" (true) keeps its engine's ranks paused; "serve" lets them run what they hold.
  bool group_hold_unanswered = true;
};

// Largest config file read (bytes); a bigger file, or one that is not a regular file, is refused.
inline constexpr uint64_t kMaxConfigFileBytes = 1 << 20;
// Largest access.allowed_uids list.
inline constexpr size_t kMaxAllowedUids = 4096;

// `transports`: the data-plane transports this refitd has (transport/builtin_transports.h);
// data_plane.transport must name one of them, and its keys are checked against its descriptor.
absl::StatusOr<Config> LoadConfigFile(const std::string& path, const transport::TransportRegistry& transports);
absl::StatusOr<Config> ParseConfig(const std::string& yaml, const std::string& path,
                                   const transport::TransportRegistry& transports);
// The embedded default: listens on kDefaultControlAddress with the demo model spec inline, on
// the registry's default transport.
Config DefaultConfig(const transport::TransportRegistry& transports);

// The first line of a secret file (a token): at least 16 bytes. `setting` names the config key
// in errors.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& setting);

}  // namespace refit::server

#endif  // REFIT_SERVER_CONFIG_H_
