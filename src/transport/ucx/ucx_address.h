// Endpoint strings of the UCX data plane ("ucx:<ipv4 or host name>:<port>") and their conversion
// to and from socket addresses.
//
// Threading: pure functions; thread-safe.
#ifndef REFIT_TRANSPORT_UCX_UCX_ADDRESS_H_
#define REFIT_TRANSPORT_UCX_UCX_ADDRESS_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace refit::transport::ucx {

inline constexpr std::string_view kEndpointScheme = "ucx:";

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// "ucx:127.0.0.1:40123".
std::string FormatEndpoint(const HostPort& address);

// Inverse of FormatEndpoint. InvalidArgument naming the endpoint when it is malformed.
absl::StatusOr<HostPort> ParseEndpoint(std::string_view endpoint);

// Resolves `address.host` (dotted IPv4 or a name) to an IPv4 socket address.
absl::StatusOr<sockaddr_in> ResolveIpv4(const HostPort& address);

// "a.b.c.d:port" for IPv4, "[v6]:port" for IPv6, "unknown" otherwise.
std::string SockaddrToString(const sockaddr* address);

}  // namespace refit::transport::ucx

#endif  // REFIT_TRANSPORT_UCX_UCX_ADDRESS_H_
