#include "common/fd_passing.h"

#include <sys/socket.h>

namespace refit {

kj::Maybe<kj::AsyncCapabilityStream&> UnixCapabilityStream(kj::AsyncIoStream& stream) {
  KJ_IF_MAYBE(caps, kj::dynamicDowncastIfAvailable<kj::AsyncCapabilityStream>(stream)) {
    struct sockaddr_storage addr {};
    uint len = sizeof(addr);
    bool unix_socket = false;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      stream.getsockname(reinterpret_cast<struct sockaddr*>(&addr), &len);
      unix_socket = len >= sizeof(addr.ss_family) && addr.ss_family == AF_UNIX;
    })) {
      (void)e;  // not a socket
    }
    if (unix_socket) return *caps;
  }
  return nullptr;
}

}  // namespace refit
