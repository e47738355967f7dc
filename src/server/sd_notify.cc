#include "server/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace refit::server {
namespace {

std::optional<uint64_t> WatchdogFromEnvironment() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return std::nullopt;
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && *pid != '\0') {
    int64_t p = 0;
    if (!absl::SimpleAtoi(pid, &p) || p != getpid()) return std::nullopt;  // meant for another process
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(usec, &v) || v == 0) return std::nullopt;
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceNotifier>> ServiceNotifier::FromEnvironment() {
  const char* socket_env = std::getenv("NOTIFY_SOCKET");
  if (socket_env == nullptr || *socket_env == '\0') return std::unique_ptr<ServiceNotifier>();
  std::string address = socket_env;
  if (address[0] == '@') {
    address[0] = '\0';
  } else if (address[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET '", socket_env, "' is neither a path nor @abstract"));
  }
  if (address.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET '", socket_env, "' is too long"));
  }
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("NOTIFY_SOCKET: socket: ", std::strerror(errno)));
  return std::unique_ptr<ServiceNotifier>(new ServiceNotifier(fd, std::move(address), WatchdogFromEnvironment()));
}

ServiceNotifier::~ServiceNotifier() { close(fd_); }

absl::Status ServiceNotifier::Notify(std::string_view state) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, address_.data(), address_.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size() +
                                               (address_[0] == '\0' ? 0 : 1));
  ssize_t sent;
  do {
    sent = sendto(fd_, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), len);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return absl::UnavailableError(absl::StrCat("NOTIFY_SOCKET: sendto: ", std::strerror(errno)));
  return absl::OkStatus();
}

kj::Promise<void> PingWatchdog(ServiceNotifier& notifier, kj::Timer& timer) {
  const uint64_t half_usec = std::max<uint64_t>(*notifier.watchdog_usec() / 2, 1);
  return timer.afterDelay(half_usec * kj::MICROSECONDS).then([&notifier, &timer]() {
    if (absl::Status st = notifier.Notify("WATCHDOG=1"); !st.ok()) {
      Log(LogLevel::kWarn, absl::StrCat("event=watchdog_ping_failed error=\"", st.message(), "\""));
    }
    return PingWatchdog(notifier, timer);
  });
}

}  // namespace refit::server
