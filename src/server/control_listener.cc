#include "server/control_listener.h"

#include <sys/socket.h>
#include <sys/types.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "capnp/rpc.capnp.h"
#include "capnp/serialize-async.h"
#include "common/auth_preamble.h"
#include "common/fd_passing.h"
#include "server/forwarding_stream.h"
#include "server/log.h"

namespace refit::server {
namespace {

constexpr uint8_t kTlsHandshakeRecord = 0x16;
constexpr kj::Duration kAcceptBackoff = 100 * kj::MILLISECONDS;
constexpr uint32_t kLogLinesPerSecond = 10;

// A refusal: its description is the reason that is logged.
kj::Exception Refusal(const std::string& reason) {
  return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::heapString(reason.c_str()));
}

// A stream that first returns bytes already read from `inner` (the peeked first byte), then
// reads from `inner`; writes go straight to `inner`.
class PrefixedStream final : public ForwardingStream {
 public:
  PrefixedStream(kj::Own<kj::AsyncIoStream> inner, uint8_t first) : ForwardingStream(kj::mv(inner)), first_(first) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    if (!pending_ || max_bytes == 0) return inner().tryRead(buffer, min_bytes, max_bytes);
    pending_ = false;
    auto* out = static_cast<uint8_t*>(buffer);
    out[0] = first_;
    if (min_bytes <= 1) return size_t(1);
    return inner().tryRead(out + 1, min_bytes - 1, max_bytes - 1).then([](size_t n) { return n + 1; });
  }

 private:
  uint8_t first_;
  bool pending_ = true;
};

// Reads and drops what the peer still sends, up to `budget` bytes or its end of stream, so that
// closing the connection does not reset it before the peer read our last message.
kj::Promise<void> Drain(kj::AsyncIoStream& stream, size_t budget) {
  if (budget == 0) return kj::READY_NOW;
  auto buf = kj::heapArray<uint8_t>(4096);
  auto* p = buf.begin();
  return stream.tryRead(p, 1, buf.size()).then([&stream, budget, buf = kj::mv(buf)](size_t n) -> kj::Promise<void> {
    if (n == 0) return kj::READY_NOW;
    return Drain(stream, budget > n ? budget - n : 0);
  });
}

// A client without TLS on a TLS listener sent the preamble and then expects Cap'n Proto RPC:
// answer with an RPC Abort, which its RPC system reports as the reason of its failure.
kj::Promise<void> TellPlainClient(kj::AsyncIoStream& stream) {
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  auto abort = message->initRoot<capnp::rpc::Message>().initAbort();
  abort.setType(capnp::rpc::Exception::Type::FAILED);
  abort.setReason(
      "refitd requires TLS on this port: set REFIT_TLS_CA to the CA that signed its certificate "
      "(docs/security.md)");
  auto& m = *message;
  return capnp::writeMessage(stream, m)
      .then([&stream]() {
        stream.shutdownWrite();
        return Drain(stream, 64 * 1024);
      })
      .attach(kj::mv(message))
      .catch_([](kj::Exception&&) {});
}

}  // namespace

// One admitted connection; members are destroyed in reverse order (RPC system, network, stream).
struct ControlListener::Connection {
  kj::Own<ConnectionCounter::Slot> slot;  // first: released last
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyVatNetwork> network;
  kj::Own<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpc;
};

ControlListener::ControlListener(capnp::Capability::Client bootstrap, capnp::ReaderOptions reader_options,
                                 AccessPolicy policy, kj::Timer& timer, kj::Own<kj::TlsContext> tls,
                                 ConnectionLimits limits, ListenerMetrics metrics)
    : bootstrap_(kj::mv(bootstrap)),
      reader_options_(reader_options),
      policy_(std::move(policy)),
      timer_(timer),
      tls_(kj::mv(tls)),
      limits_(limits),
      metrics_(metrics),
      counter_(limits.max_connections, limits.max_connections_per_uid,
               [open = metrics.open](uint32_t n) {
                 if (open != nullptr) open->Labels({"control"}).Set(n);
               }),
      budget_(limits.buffered_message_bytes, metrics.buffered_bytes),
      tasks_(error_handler_) {}

ControlListener::~ControlListener() = default;

void ControlListener::ErrorHandler::taskFailed(kj::Exception&& e) {
  const kj::StringPtr error = e.getDescription();
  LogEvent(LogLevel::kDebug, "connection_closed").Add("error", absl::string_view(error.begin(), error.size()));
}

kj::Promise<void> ControlListener::Listen(kj::ConnectionReceiver& listener, bool unix_socket) {
  // KJ's accept() tries accept(2) at once and throws EMFILE synchronously: that must reach
  // AcceptFailed too, not the promise of the previous accept.
  kj::Maybe<kj::Promise<kj::Own<kj::AsyncIoStream>>> accepted;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { accepted = listener.accept(); })) {
    return AcceptFailed(listener, unix_socket, kj::mv(*e));
  }
  return KJ_ASSERT_NONNULL(accepted)
      .then(
          [this, &listener, unix_socket](kj::Own<kj::AsyncIoStream>&& stream) {
            tasks_.add(Admit(kj::mv(stream), unix_socket));
            return Listen(listener, unix_socket);
          },
          [this, &listener, unix_socket](kj::Exception&& e) {
            return AcceptFailed(listener, unix_socket, kj::mv(e));
          });
}

// Out of file descriptors (EMFILE, ENFILE), or any other accept() error: the pending
// connection stays queued, and accepting again at once would spin. Wait, then go on.
kj::Promise<void> ControlListener::AcceptFailed(kj::ConnectionReceiver& listener, bool unix_socket,
                                                kj::Exception&& e) {
  metrics_.Count(metrics_.accept_errors, "control");
  if (LogAllowed()) {
    Log(LogLevel::kWarn, absl::StrCat("event=accept_failed listener=control open_connections=", counter_.open(),
                                      " backoff_ms=", kAcceptBackoff / kj::MILLISECONDS, " error=\"",
                                      e.getDescription().cStr(), "\""));
  }
  return timer_.afterDelay(kAcceptBackoff).then([this, &listener, unix_socket]() { return Listen(listener, unix_socket); });
}

bool ControlListener::LogAllowed() {
  const int64_t second = (timer_.now() - kj::origin<kj::TimePoint>()) / kj::SECONDS;
  if (second != log_second_) {
    if (log_suppressed_ > 0) {
      Log(LogLevel::kWarn, absl::StrCat("event=connection_log_suppressed lines=", log_suppressed_));
    }
    log_second_ = second;
    logged_this_second_ = 0;
    log_suppressed_ = 0;
  }
  if (logged_this_second_ >= kLogLinesPerSecond) {
    ++log_suppressed_;
    return false;
  }
  ++logged_this_second_;
  return true;
}

void ControlListener::RefuseOverCap(const char* cap, const std::string& peer) {
  ++refused_;
  metrics_.Count(metrics_.refused, "control", cap);
  if (LogAllowed()) {
    Log(LogLevel::kWarn, absl::StrCat("event=connection_refused reason=\"", peer, ": limits.", cap, " (",
                                      std::string(cap) == "max_connections" ? limits_.max_connections
                                                                            : limits_.max_connections_per_uid,
                                      ") reached\" open_connections=", counter_.open()));
  }
}

void ControlListener::ReplaceTls(kj::Own<kj::TlsContext> tls) {
  KJ_REQUIRE(tls_.get() != nullptr && tls.get() != nullptr, "ReplaceTls on a listener without TLS");
  tls_ = kj::mv(tls);
}

void ControlListener::Refuse(const std::string& reason) {
  ++refused_;
  if (LogAllowed()) LogEvent(LogLevel::kWarn, "connection_refused").Add("reason", reason);
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
    const char* cap = nullptr;
    kj::Own<ConnectionCounter::Slot> slot = counter_.TryAcquire(cred.uid, &cap);
    if (slot.get() == nullptr) {
      RefuseOverCap(cap, absl::StrCat("uid ", cred.uid, " (pid ", cred.pid, ")"));
      return kj::READY_NOW;
    }
    Serve(kj::mv(stream), kj::mv(slot), /*unix_socket=*/true);
    return kj::READY_NOW;
  }
  if (policy_.token.empty() && !(tls_.get() != nullptr && policy_.tls_client_certs)) {
    Refuse("TCP connection, but neither access.token_file nor tls.client_ca is configured");
    return kj::READY_NOW;
  }
  // A TCP peer holds its place from accept on, through the handshake.
  const char* cap = nullptr;
  kj::Own<ConnectionCounter::Slot> slot = counter_.TryAcquire(-1, &cap);
  if (slot.get() == nullptr) {
    RefuseOverCap(cap, "TCP peer");
    return kj::READY_NOW;
  }
  // The whole admission (TLS handshake and preamble) within the handshake timeout: a peer that
  // sends nothing is dropped then, and meanwhile holds only its own task.
  auto timeout = timer_.afterDelay(policy_.handshake_timeout).then([this]() -> kj::Own<kj::AsyncIoStream> {
    kj::throwFatalException(Refusal(absl::StrCat("no authentication within ",
                                                 policy_.handshake_timeout / kj::MILLISECONDS, " ms")));
  });
  return AdmitTcp(kj::mv(stream))
      .exclusiveJoin(kj::mv(timeout))
      .then(
          [this, slot = kj::mv(slot)](kj::Own<kj::AsyncIoStream> admitted) mutable {
            LogEvent(LogLevel::kDebug, "connection_admitted").Add("transport", tls_.get() != nullptr ? "tls" : "tcp");
            Serve(kj::mv(admitted), kj::mv(slot), /*unix_socket=*/false);
          },
            [this](kj::Exception&& e) { Refuse(std::string(e.getDescription().begin(), e.getDescription().size())); });
}

kj::Promise<kj::Own<kj::AsyncIoStream>> ControlListener::AdmitTcp(kj::Own<kj::AsyncIoStream> stream) {
  if (tls_.get() == nullptr) return CheckPreamble(kj::mv(stream));
  return StartTls(kj::mv(stream)).then([this](kj::Own<kj::AsyncIoStream> secured) {
    return CheckPreamble(kj::mv(secured));
  });
}

kj::Promise<kj::Own<kj::AsyncIoStream>> ControlListener::StartTls(kj::Own<kj::AsyncIoStream> stream) {
  // Peek at the first byte: a TLS handshake starts with a handshake record (0x16). Anything else
  // is a client without TLS, which is told so instead of seeing a bare disconnect.
  auto first = kj::heap<uint8_t>(0);
  uint8_t* first_ptr = first.get();
  auto& stream_ref = *stream;
  return stream_ref.tryRead(first_ptr, 1, 1).then(
      [this, stream = kj::mv(stream), first = kj::mv(first)](size_t n) mutable -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        if (n != 1) return Refusal("connection closed before the TLS handshake");
        if (*first != kTlsHandshakeRecord) {
          auto& s = *stream;
          return TellPlainClient(s).then([stream = kj::mv(stream)]() mutable -> kj::Own<kj::AsyncIoStream> {
            kj::throwFatalException(Refusal("client did not start a TLS handshake (a client without REFIT_TLS_CA?)"));
          });
        }
        auto replay = kj::heap<PrefixedStream>(kj::mv(stream), *first);
        return tls_->wrapServer(kj::mv(replay)).catch_([](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
          kj::throwFatalException(Refusal(absl::StrCat("TLS handshake failed: ", e.getDescription().cStr())));
        });
      });
}

kj::Promise<kj::Own<kj::AsyncIoStream>> ControlListener::CheckPreamble(kj::Own<kj::AsyncIoStream> stream) {
  auto head = kj::heapArray<uint8_t>(8);
  auto& stream_ref = *stream;
  auto* head_ptr = head.begin();
  return stream_ref.tryRead(head_ptr, 8, 8).then(
      [this, stream = kj::mv(stream), head = kj::mv(head)](size_t n) mutable -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        if (n != 8) return Refusal("connection closed during authentication");
        if (head[0] == kTlsHandshakeRecord && tls_.get() == nullptr) {
          return Refusal("client started a TLS handshake, but this listener has no tls: configured");
        }
        absl::StatusOr<uint32_t> len = ParseAuthHead(head.begin());
        if (!len.ok()) return Refusal(std::string(len.status().message()));
        auto token = kj::heapArray<char>(*len);
        auto& s = *stream;
        char* buf = token.begin();
        // No zero-byte read for an empty token: TLS streams treat it as a read of a record.
        kj::Promise<size_t> read = *len == 0 ? kj::Promise<size_t>(size_t(0)) : s.tryRead(buf, *len, *len);
        return read
            .then([this, stream = kj::mv(stream), token = kj::mv(token)](size_t got) mutable
                  -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
              if (got != token.size()) return Refusal("connection closed during authentication");
              if (policy_.token.empty()) return kj::mv(stream);  // admitted by its client certificate
              if (token.size() == 0) {
                return Refusal("no authentication token (the client has no REFITD_TOKEN or REFITD_TOKEN_FILE)");
              }
              if (!TokensEqual(absl::string_view(token.begin(), token.size()), policy_.token)) {
                return Refusal("wrong authentication token");
              }
              return kj::mv(stream);
            });
      })
      .catch_([this](kj::Exception&& e) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        if (e.getType() != kj::Exception::Type::DISCONNECTED) return kj::mv(e);
        return Refusal(absl::StrCat("connection lost during authentication",
                                    tls_.get() != nullptr ? " (a TLS client that does not trust refitd's certificate "
                                                            "closes here)"
                                                          : "",
                                    ": ", e.getDescription().cStr()));
      });
}

void ControlListener::Serve(kj::Own<kj::AsyncIoStream> stream, kj::Own<ConnectionCounter::Slot> slot, bool unix_socket) {
  ++admitted_;
  auto conn = kj::heap<Connection>();
  conn->slot = kj::mv(slot);
  auto on_drop = [this](const char* reason, const std::string& detail) {
    metrics_.Count(metrics_.dropped, "control", reason);
    if (LogAllowed()) {
      Log(LogLevel::kWarn, absl::StrCat("event=connection_dropped reason=", reason, " detail=\"", detail, "\""));
    }
  };
  kj::Maybe<kj::AsyncCapabilityStream&> caps;
  if (unix_socket) caps = UnixCapabilityStream(*stream);
  KJ_IF_MAYBE(c, caps) {
    // A Unix-socket peer may attach file descriptors (an engine's CUDA virtual-memory
    // allocations), at most kMaxFdsPerMessage to a message; the limits apply as on any connection.
    auto limited = kj::heap<MessageLimitedCapabilityStream>(kj::mv(stream), *c, limits_, budget_, timer_, on_drop);
    conn->network = kj::heap<capnp::TwoPartyVatNetwork>(*limited, kMaxFdsPerMessage,
                                                         capnp::rpc::twoparty::Side::SERVER, reader_options_);
    conn->stream = kj::mv(limited);
  } else {
    conn->stream = kj::heap<MessageLimitedStream>(kj::mv(stream), limits_, budget_, timer_, on_drop);
    conn->network =
        kj::heap<capnp::TwoPartyVatNetwork>(*conn->stream, capnp::rpc::twoparty::Side::SERVER, reader_options_);
  }
  conn->rpc = kj::heap(capnp::makeRpcServer(*conn->network, bootstrap_));
  auto disconnected = conn->network->onDisconnect();
  tasks_.add(disconnected.attach(kj::mv(conn)));
}

}  // namespace refit::server
