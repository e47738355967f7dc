// refitd's daemon configuration (YAML), with safe defaults for every limit.
// docs/config.md is the reference. Immutable after load.
#ifndef REFIT_SERVER_CONFIG_H_
#define REFIT_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/control_connect.h"
#include "refit/types.h"

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
  // Data plane.
  std::string transport = "ucx";  // ucx | nccl (nccl needs staging: device)
  std::string ucx_tls = "tcp,sm,self";
  std::string data_host = "127.0.0.1";
  int data_device = 0;  // nccl: the CUDA device of the bucket slots (the engine's GPU)
  std::string staging = "host";  // host | device
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
  std::string log_level = "info";
};

absl::StatusOr<Config> LoadConfigFile(const std::string& path);
absl::StatusOr<Config> ParseConfig(const std::string& yaml, const std::string& path = "<string>");
// The embedded default: listens on kDefaultControlAddress with the demo model spec inline.
Config DefaultConfig();

// The first line of a secret file (a token): at least 16 bytes. `setting` names the config key
// in errors.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& setting);

}  // namespace refit::server

#endif  // REFIT_SERVER_CONFIG_H_
