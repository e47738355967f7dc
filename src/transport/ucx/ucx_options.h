// Options of the UCX data plane (src/transport/ucx/). Every UCX setting that refitd depends on is
// here and applied per context through ucp_config_modify; the process environment is not touched,
// so two contexts in one process (a test's receiver and sender) can use different transports.
//
// Threading: plain value type.
#ifndef REFIT_TRANSPORT_UCX_UCX_OPTIONS_H_
#define REFIT_TRANSPORT_UCX_UCX_OPTIONS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace refit {
class FailpointSet;
}  // namespace refit

namespace refit::transport {

// How a dead peer is noticed. Sender and receiver must use the same mode.
enum class UcxErrorMode {
  // UCP_ERR_HANDLING_MODE_PEER: every lane must be able to report a dead peer, and keepalive
  // probes idle peers. UCX 1.13 then never selects shared-memory lanes (they lack peer-failure
  // support), so data moves over tcp even between processes of one host.
  kPeer,
  // UCP_ERR_HANDLING_MODE_NONE: lanes may be shared memory (sysv/posix for messages, cma for
  // rendezvous). A dead peer is noticed when its connection-manager socket closes, which the
  // kernel does as soon as the process dies; a vanished remote host is noticed only through TCP
  // keepalive on that socket. Meant for same-host peers.
  kConnectionManager,
};

struct UcxOptions {
  // UCX_TLS for this context. Both ends must share at least one transport. UCX 1.13 needs tcp
  // in the list even for shared memory: the client picks its first lanes on the network device
  // it connects through, and only then moves to shared memory. Shared memory in practice:
  // tls = "sm,self,tcp" with error_mode = kConnectionManager.
  std::string tls = "tcp";
  UcxErrorMode error_mode = UcxErrorMode::kPeer;

  // UCX_NET_DEVICES: which network devices the tcp transport may use ("all", or e.g. "lo,eth0").
  std::string net_devices = "all";

  // Receiver: address the listener binds to, and the one Endpoint() advertises. Port 0 lets the
  // OS pick a free port.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;

  // How often UCX probes peers in kPeer mode, so a silently dead peer is reported as a failure
  // instead of being waited on forever (UCX_KEEPALIVE_INTERVAL).
  absl::Duration keepalive_interval = absl::Seconds(2);

  // Sender: how long Connect waits for the receiver to accept the connection.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Sender: how long the destructor waits for the receiver to acknowledge an orderly close, and
  // then for the endpoint to flush. Past it the endpoint is closed forcibly.
  absl::Duration close_timeout = absl::Seconds(5);

  // Receiver: how long an interrupted Receive (deadline, Cancel, peer failure) waits for UCX to
  // give the caller's buffer back once the receive had matched a message. Past it the Receive
  // returns Unavailable and the receiver keeps the request until UCX completes it.
  absl::Duration buffer_release_timeout = absl::Seconds(10);

  // Sender: the name the receiver uses for this peer in errors and logs. Empty means
  // "<hostname>:<pid>".
  std::string peer_name;

  // Further UCP context settings as (name without the UCX_ prefix, value), applied last,
  // e.g. {"RNDV_THRESH", "64K"}.
  std::vector<std::pair<std::string, std::string>> extra_config;

  // Receiver, test builds: refitd's armed failpoints (data_plane_closing); null: none.
  const FailpointSet* failpoints = nullptr;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_UCX_UCX_OPTIONS_H_
