#include "transport/ucx/ucx_address.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <charconv>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace refit::transport::ucx {

std::string FormatEndpoint(const HostPort& address) {
  return absl::StrCat(std::string(kEndpointScheme), address.host, ":", address.port);
}

absl::StatusOr<HostPort> ParseEndpoint(std::string_view endpoint) {
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("UCX endpoint \"", std::string(endpoint), "\": ", std::string(why),
                                                   " (expected ucx:<host>:<port>)"));
  };
  if (endpoint.substr(0, kEndpointScheme.size()) != kEndpointScheme) return invalid("wrong scheme");
  std::string_view rest = endpoint.substr(kEndpointScheme.size());
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return invalid("missing host or port");
  std::string_view digits = rest.substr(colon + 1);
  uint32_t port = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port == 0 || port > 65535) {
    return invalid("bad port");
  }
  return HostPort{std::string(rest.substr(0, colon)), static_cast<uint16_t>(port)};
}

absl::StatusOr<sockaddr_in> ResolveIpv4(const HostPort& address) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_port = htons(address.port);
  if (inet_pton(AF_INET, address.host.c_str(), &out.sin_addr) == 1) return out;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(address.host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host \"", address.host, "\": ", gai_strerror(rc)));
  }
  out.sin_addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
  freeaddrinfo(found);
  return out;
}

std::string SockaddrToString(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(in->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(in6->sin6_port));
  }
  return "unknown";
}

}  // namespace refit::transport::ucx
