// The service manager's notification protocol (sd_notify(3)), without libsystemd: state lines
// such as "READY=1" or "WATCHDOG=1" sent as one datagram to the AF_UNIX socket named by
// $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace). systemd sets it for
// Type=notify units; elsewhere it is unset and FromEnvironment returns null, so the daemon runs
// the same with or without a service manager.
//
// refitd sends READY=1 once the control socket listens (a client connecting after that is
// accepted), STOPPING=1 when it begins to shut down, and WATCHDOG=1 every half of WATCHDOG_USEC
// from a timer on the event loop: a loop that stops turning stops the pings, and systemd
// restarts the daemon (WatchdogSec= in deploy/systemd/refitd.service).
//
// Threading: one thread (the event loop's).
#ifndef REFIT_SERVER_SD_NOTIFY_H_
#define REFIT_SERVER_SD_NOTIFY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kj/async.h"
#include "kj/timer.h"

namespace refit::server {

class ServiceNotifier {
 public:
  // Null when $NOTIFY_SOCKET is unset or empty; an error when it names no usable address.
  static absl::StatusOr<std::unique_ptr<ServiceNotifier>> FromEnvironment();
  ~ServiceNotifier();
  ServiceNotifier(const ServiceNotifier&) = delete;
  ServiceNotifier& operator=(const ServiceNotifier&) = delete;

  // Sends newline-separated assignments ("READY=1", "STATUS=...") as one datagram.
  absl::Status Notify(std::string_view state);

  // The watchdog interval systemd expects pings within ($WATCHDOG_USEC, when $WATCHDOG_PID is
  // unset or this process); nullopt when the watchdog is off.
  std::optional<uint64_t> watchdog_usec() const { return watchdog_usec_; }

 private:
  ServiceNotifier(int fd, std::string address, std::optional<uint64_t> watchdog_usec)
      : fd_(fd), address_(std::move(address)), watchdog_usec_(watchdog_usec) {}

  int fd_;               // owned: an AF_UNIX datagram socket, closed by the destructor
  std::string address_;  // sun_path bytes; a leading '\0' for the abstract namespace
  std::optional<uint64_t> watchdog_usec_;
};

// Sends WATCHDOG=1 every watchdog_usec / 2 until the promise is dropped. A failed send is logged
// and the pings go on (the next one may get through).
// REQUIRES: notifier.watchdog_usec() is set; `notifier` and `timer` outlive the promise.
kj::Promise<void> PingWatchdog(ServiceNotifier& notifier, kj::Timer& timer);

}  // namespace refit::server

#endif  // REFIT_SERVER_SD_NOTIFY_H_
