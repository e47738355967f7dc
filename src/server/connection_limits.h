// Bounds on what network peers can make refitd hold, before and after admission
// (docs/security.md, "Connections"):
//   - how many connections a listener keeps open, and how many one Unix-socket peer uid keeps;
//   - how many bytes of unfinished Cap'n Proto messages refitd buffers: per connection (the
//     declared size of the message being read) and for the whole daemon (the sum over every
//     connection), reserved when a message's segment table has arrived, before Cap'n Proto
//     allocates for it, and released when the message has been read;
//   - how long a control connection may stall: one that sends no byte for `idle_timeout` while
//     it has not finished a message (including before its first one) is dropped. A connection
//     between messages (an engine waiting for its next refit) is not timed out.
// A connection over a limit is closed, logged and counted (ListenerMetrics); refitd keeps serving.
//
// Threading: ConnectionCounter, MessageBudget and MessageLimitedStream are used on the one KJ
// event loop thread that runs the listener. ListenerMetrics' families are thread-safe.
#ifndef REFIT_SERVER_CONNECTION_LIMITS_H_
#define REFIT_SERVER_CONNECTION_LIMITS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "kj/async-io.h"
#include "kj/timer.h"
#include "metrics/registry.h"
#include "server/admin/admin_server.h"
#include "server/forwarding_stream.h"

namespace refit::server {

struct Config;

struct ConnectionLimits {
  uint32_t max_connections = 128;         // per listener, admitted or still in admission
  uint32_t max_connections_per_uid = 64;  // Unix-socket peers of one uid
  uint64_t connection_buffer_bytes = 512ull << 20;  // one unfinished message, declared size
  uint64_t buffered_message_bytes = 1ull << 30;     // all unfinished messages of the daemon
  kj::Duration idle_timeout = 30 * kj::SECONDS;     // no byte while inside a message
};

// Messages of at most this many bytes are not counted against the daemon budget, so that peers
// holding the budget with large messages cannot stop small calls (status, abort) of others.
// Each connection still holds at most one of them (max_connections bound the sum).
inline constexpr uint64_t kUncountedMessageBytes = 64 * 1024;

// The limits of the `limits:` keys of the daemon config.
ConnectionLimits ConnectionLimitsFromConfig(const Config& config);

// The admin endpoint's options from the `admin:` keys (reads admin.token_file), counted in
// `metrics` under {listener="admin"}.
struct ListenerMetrics;
absl::StatusOr<admin::AdminOptions> AdminOptionsFromConfig(const Config& config, const ListenerMetrics& metrics);

// Counters of every listener (control and admin), labelled {listener}. Null members: not counted.
struct ListenerMetrics {
  metrics::CounterFamily* accept_errors = nullptr;  // {listener}: accept() failed (EMFILE, ...)
  metrics::CounterFamily* refused = nullptr;        // {listener, reason}: closed at accept
  metrics::CounterFamily* dropped = nullptr;        // {listener, reason}: closed after admission
  metrics::GaugeFamily* open = nullptr;             // {listener}: open connections
  metrics::Gauge* buffered_bytes = nullptr;         // bytes reserved for unfinished messages

  static absl::StatusOr<ListenerMetrics> Register(metrics::Registry& registry);
  void Count(metrics::CounterFamily* family, const char* listener, const char* reason = nullptr) const;
};

// Open connections of one listener, in total and per peer uid.
class ConnectionCounter {
 public:
  // A held place; releases it when destroyed.
  class Slot {
   public:
    Slot(ConnectionCounter& counter, int64_t uid) : counter_(counter), uid_(uid) {}
    ~Slot() { counter_.Release(uid_); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    ConnectionCounter& counter_;
    const int64_t uid_;
  };

  // `on_change`: called with the new total after every change (for a gauge); may be empty.
  ConnectionCounter(uint32_t max_total, uint32_t max_per_uid, std::function<void(uint32_t)> on_change = {})
      : max_total_(max_total), max_per_uid_(max_per_uid), on_change_(std::move(on_change)) {}

  // A slot for a peer of `uid` (-1: no uid, a TCP peer: counted in the total only), or null
  // with `reason` set to "max_connections" or "max_connections_per_uid".
  kj::Own<Slot> TryAcquire(int64_t uid, const char** reason);
  uint32_t open() const { return total_; }

 private:
  void Release(int64_t uid);

  const uint32_t max_total_, max_per_uid_;
  std::function<void(uint32_t)> on_change_;
  uint32_t total_ = 0;
  std::map<int64_t, uint32_t> per_uid_;
};

// Bytes reserved for unfinished messages across the daemon.
class MessageBudget {
 public:
  MessageBudget(uint64_t limit_bytes, metrics::Gauge* gauge) : limit_(limit_bytes), gauge_(gauge) {}
  bool TryReserve(uint64_t bytes);
  void Release(uint64_t bytes);
  uint64_t used() const { return used_; }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  metrics::Gauge* const gauge_;
  uint64_t used_ = 0;
};

// The limits above on one control connection: follows the message framing (segment count,
// segment sizes, segments) of the bytes read, and fails a read (which drops the connection) with
// the reason when a limit is exceeded. Shared by the two stream wrappers below.
// `on_drop(reason, detail)` is called once, before that failure.
class MessageLimiter {
 public:
  MessageLimiter(const ConnectionLimits& limits, MessageBudget& budget, kj::Timer& timer,
                 std::function<void(const char*, const std::string&)> on_drop);
  ~MessageLimiter();
  MessageLimiter(const MessageLimiter&) = delete;
  MessageLimiter& operator=(const MessageLimiter&) = delete;

  // After a drop, reads return end of stream.
  bool dropped() const { return dropped_; }
  // `read` into `buffer`, failed by the idle timeout when it runs past it inside a message; the
  // bytes it read (`bytes_of` its result) are observed when it completes.
  template <typename T>
  kj::Promise<T> Guard(kj::Promise<T> read, void* buffer, size_t (*bytes_of)(const T&)) {
    if (InsideMessage()) {
      read = read.exclusiveJoin(timer_.afterDelay(limits_.idle_timeout).then([this]() -> T {
        kj::throwFatalException(IdleTimeout());
      }));
    }
    return read.then([this, buffer, bytes_of](T result) -> T {
      KJ_IF_MAYBE(e, Observe(static_cast<const uint8_t*>(buffer), bytes_of(result))) { kj::throwFatalException(kj::mv(*e)); }
      return result;
    });
  }

 private:
  // Follows the framing over `n` bytes just read; a kj::Exception when a limit is exceeded.
  kj::Maybe<kj::Exception> Observe(const uint8_t* bytes, size_t n);
  kj::Exception Drop(const char* reason, const std::string& detail);
  kj::Exception IdleTimeout();
  bool InsideMessage() const { return !first_message_done_ || header_words_seen_ > 0 || word_fill_ > 0 || body_left_ > 0; }

  const ConnectionLimits limits_;
  MessageBudget& budget_;
  kj::Timer& timer_;
  std::function<void(const char*, const std::string&)> on_drop_;
  bool dropped_ = false;
  bool untracked_ = false;  // a segment table Cap'n Proto itself refuses: it drops the connection
  bool first_message_done_ = false;
  // Segment table being read: 32-bit little-endian words.
  uint8_t word_[4] = {};
  uint32_t word_fill_ = 0;
  uint64_t header_words_seen_ = 0;  // 32-bit words of the table seen so far
  uint64_t header_words_ = 0;       // its length: 1 + segments, rounded up to an even count
  uint64_t segments_ = 0;
  uint64_t declared_words_ = 0;
  uint64_t body_left_ = 0;  // bytes of the current message's segments still to come
  uint64_t reserved_ = 0;   // bytes of the budget this connection holds
};

// A control connection's stream as Cap'n Proto reads it, under a MessageLimiter.
class MessageLimitedStream final : public ForwardingStream {
 public:
  MessageLimitedStream(kj::Own<kj::AsyncIoStream> inner, const ConnectionLimits& limits, MessageBudget& budget,
                       kj::Timer& timer, std::function<void(const char*, const std::string&)> on_drop);

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override;

 private:
  MessageLimiter limiter_;
};

// The same over a Unix-socket connection that passes file descriptors (common/fd_passing.h):
// every read, with descriptors or without, goes through the limiter; Cap'n Proto's
// maxFdsPerMessage bounds the descriptors read with each message.
class MessageLimitedCapabilityStream final : public kj::AsyncCapabilityStream {
 public:
  // REQUIRES: `caps` is `*inner` (the capability stream UnixCapabilityStream found in it).
  MessageLimitedCapabilityStream(kj::Own<kj::AsyncIoStream> inner, kj::AsyncCapabilityStream& caps,
                                 const ConnectionLimits& limits, MessageBudget& budget, kj::Timer& timer,
                                 std::function<void(const char*, const std::string&)> on_drop);
  ~MessageLimitedCapabilityStream() noexcept(false) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override;
  kj::Promise<ReadResult> tryReadWithFds(void* buffer, size_t min_bytes, size_t max_bytes, kj::AutoCloseFd* fds,
                                         size_t max_fds) override;
  kj::Promise<ReadResult> tryReadWithStreams(void* buffer, size_t min_bytes, size_t max_bytes,
                                             kj::Own<kj::AsyncCapabilityStream>* streams, size_t max_streams) override;
  kj::Promise<void> write(const void* buffer, size_t size) override { return caps_.write(buffer, size); }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return caps_.write(pieces);
  }
  kj::Promise<void> writeWithFds(kj::ArrayPtr<const kj::byte> data,
                                 kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> more_data,
                                 kj::ArrayPtr<const int> fds) override {
    return caps_.writeWithFds(data, more_data, fds);
  }
  kj::Promise<void> writeWithStreams(kj::ArrayPtr<const kj::byte> data,
                                     kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> more_data,
                                     kj::Array<kj::Own<kj::AsyncCapabilityStream>> streams) override {
    return caps_.writeWithStreams(data, more_data, kj::mv(streams));
  }
  kj::Promise<void> whenWriteDisconnected() override { return caps_.whenWriteDisconnected(); }
  void shutdownWrite() override { caps_.shutdownWrite(); }
  void abortRead() override { caps_.abortRead(); }
  void getsockopt(int level, int option, void* value, uint* length) override {
    caps_.getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, uint length) override {
    caps_.setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, uint* length) override { caps_.getsockname(addr, length); }
  void getpeername(struct sockaddr* addr, uint* length) override { caps_.getpeername(addr, length); }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
  kj::AsyncCapabilityStream& caps_;
  MessageLimiter limiter_;
};

}  // namespace refit::server

#endif  // REFIT_SERVER_CONNECTION_LIMITS_H_
