#include "server/control_listener.h"

#include <sys/socket.h>
#include <sys/types.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "common/auth_preamble.h"
#include "server/log.h"

namespace refit::server {

// One admitted connection; members are destroyed in reverse order (RPC system, network, stream).
struct ControlListener::Connection {
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyVatNetwork> network;
  kj::Own<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpc;
};

ControlListener::ControlListener(capnp::Capability::Client bootstrap, capnp::ReaderOptions reader_options,
                                 AccessPolicy policy, kj::Timer& timer)
    : bootstrap_(kj::mv(bootstrap)),
      reader_options_(reader_options),
      policy_(std::move(policy)),
      timer_(timer),
      tasks_(error_handler_) {}

ControlListener::~ControlListener() = default;

void ControlListener::ErrorHandler::taskFailed(kj::Exception&& e) {
  Log(LogLevel::kDebug, absl::StrCat("event=connection_closed error=\"", e.getDescription().cStr(), "\""));
}

kj::Promise<void> ControlListener::Listen(kj::ConnectionReceiver& listener, bool unix_socket) {
  return listener.accept().then([this, &listener, unix_socket](kj::Own<kj::AsyncIoStream>&& stream) {
    tasks_.add(Admit(kj::mv(stream), unix_socket));
    return Listen(listener, unix_socket);
  });
}

void ControlListener::Refuse(const std::string& reason) {
  ++refused_;
  Log(LogLevel::kWarn, absl::StrCat("event=connection_refused reason=\"", reason, "\""));
}

kj::Promise<void> ControlListener::Admit(kj::Own<kj::AsyncIoStream> stream, bool unix_socket) {
  if (unix_socket) {
    struct ucred cred {};
    uint len = sizeof(cred);
    bool known = false;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      stream->getsockopt(SOL_SOCKET, SO_PEERCRED, &cred, &len);
      known = len == sizeof(cred);
    })) {
      (void)e;
    }
    if (!known) {
      Refuse("cannot read the peer's credentials");
      return kj::READY_NOW;
    }
    if (policy_.allowed_uids.count(cred.uid) == 0) {
      Refuse(absl::StrCat("uid ", cred.uid, " (pid ", cred.pid, ") is not in access.allowed_uids"));
      return kj::READY_NOW;
    }
    Serve(kj::mv(stream));
    return kj::READY_NOW;
  }
  if (policy_.token.empty()) {
    Refuse("TCP connection, but no access.token_file is configured");
    return kj::READY_NOW;
  }
  // TCP: the shared-secret preamble, within the handshake timeout, before any RPC.
  auto head = kj::heapArray<uint8_t>(8);
  auto& stream_ref = *stream;
  auto read = stream_ref.tryRead(head.begin(), 8, 8).then(
      [this, &stream_ref, head = kj::mv(head)](size_t n) mutable -> kj::Promise<kj::Maybe<kj::String>> {
        if (n != 8) return kj::Maybe<kj::String>(kj::str("connection closed during authentication"));
        absl::StatusOr<uint32_t> len = ParseAuthHead(head.begin());
        if (!len.ok()) return kj::Maybe<kj::String>(kj::str(std::string(len.status().message()).c_str()));
        auto token = kj::heapArray<char>(*len);
        char* buf = token.begin();
        return stream_ref.tryRead(buf, *len, *len)
            .then([this, token = kj::mv(token)](size_t got) -> kj::Maybe<kj::String> {
              if (got != token.size()) return kj::str("connection closed during authentication");
              if (!TokensEqual(absl::string_view(token.begin(), token.size()), policy_.token)) {
                return kj::str("wrong authentication token");
              }
              return nullptr;
            });
      });
  return timer_.timeoutAfter(policy_.handshake_timeout, kj::mv(read))
      .then(
          [this, stream = kj::mv(stream)](kj::Maybe<kj::String> refusal) mutable {
            KJ_IF_MAYBE(r, refusal) {
              Refuse(r->cStr());
              return;
            }
            Serve(kj::mv(stream));
          },
          [this](kj::Exception&& e) { Refuse(absl::StrCat("authentication failed: ", e.getDescription().cStr())); });
}

void ControlListener::Serve(kj::Own<kj::AsyncIoStream> stream) {
  ++admitted_;
  auto conn = kj::heap<Connection>();
  conn->stream = kj::mv(stream);
  conn->network =
      kj::heap<capnp::TwoPartyVatNetwork>(*conn->stream, capnp::rpc::twoparty::Side::SERVER, reader_options_);
  conn->rpc = kj::heap(capnp::makeRpcServer(*conn->network, bootstrap_));
  auto disconnected = conn->network->onDisconnect();
  tasks_.add(disconnected.attach(kj::mv(conn)));
}

}  // namespace refit::server
