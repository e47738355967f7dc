#include "server/connection_limits.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "server/config.h"
#include "server/log.h"

namespace refit::server {
namespace {

// Cap'n Proto refuses a segment table of more segments than this (serialize.c++).
constexpr uint64_t kMaxSegments = 512;

}  // namespace

ConnectionLimits ConnectionLimitsFromConfig(const Config& config) {
  ConnectionLimits l;
  l.max_connections = config.max_connections;
  l.max_connections_per_uid = config.max_connections_per_uid;
  l.connection_buffer_bytes = config.connection_buffer_bytes;
  l.buffered_message_bytes = config.buffered_message_bytes;
  l.idle_timeout = static_cast<int64_t>(config.idle_timeout_ms) * kj::MILLISECONDS;
  return l;
}

absl::StatusOr<admin::AdminOptions> AdminOptionsFromConfig(const Config& config, const ListenerMetrics& metrics) {
  admin::AdminOptions o;
  o.listen_address = config.admin_listen;
  o.max_connections = config.admin_max_connections;
  if (!config.admin_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(config.admin_token_file, "admin.token_file");
    if (!token.ok()) return token.status();
    o.token = *token;
  }
  if (metrics.accept_errors != nullptr) o.accept_errors = &metrics.accept_errors->Labels({"admin"});
  if (metrics.refused != nullptr) o.refused_connections = &metrics.refused->Labels({"admin", "max_connections"});
  if (metrics.open != nullptr) o.open_connections = &metrics.open->Labels({"admin"});
  o.warn = [](const std::string& line) { Log(LogLevel::kWarn, line); };
  return o;
}

absl::StatusOr<ListenerMetrics> ListenerMetrics::Register(metrics::Registry& registry) {
  ListenerMetrics m;
  absl::StatusOr<metrics::CounterFamily*> accept_errors = registry.AddCounter(
      "refit_accept_errors_total", "accept() failures of a listener (EMFILE, ENFILE, ...); it retries after 100 ms.",
      {"listener"});
  if (!accept_errors.ok()) return accept_errors.status();
  m.accept_errors = *accept_errors;
  absl::StatusOr<metrics::CounterFamily*> refused = registry.AddCounter(
      "refit_connections_refused_total", "Connections closed at accept because a connection cap was reached.",
      {"listener", "reason"});
  if (!refused.ok()) return refused.status();
  m.refused = *refused;
  absl::StatusOr<metrics::CounterFamily*> dropped = registry.AddCounter(
      "refit_connections_dropped_total",
      "Control connections dropped for a message over a buffer limit or for stalling inside a message.",
      {"listener", "reason"});
  if (!dropped.ok()) return dropped.status();
  m.dropped = *dropped;
  m.dropped->Labels({"control", "idle_timeout"});  // the family is listed before its first drop
  absl::StatusOr<metrics::GaugeFamily*> open =
      registry.AddGauge("refit_open_connections", "Open connections of a listener.", {"listener"});
  if (!open.ok()) return open.status();
  m.open = *open;
  absl::StatusOr<metrics::GaugeFamily*> buffered = registry.AddGauge(
      "refit_control_buffered_bytes", "Bytes reserved for control messages being received (limits.buffered_message_bytes).");
  if (!buffered.ok()) return buffered.status();
  m.buffered_bytes = &(*buffered)->Labels({});
  return m;
}

void ListenerMetrics::Count(metrics::CounterFamily* family, const char* listener, const char* reason) const {
  if (family == nullptr) return;
  if (reason == nullptr) {
    family->Labels({listener}).Inc();
  } else {
    family->Labels({listener, reason}).Inc();
  }
}

kj::Own<ConnectionCounter::Slot> ConnectionCounter::TryAcquire(int64_t uid, const char** reason) {
  if (total_ >= max_total_) {
    *reason = "max_connections";
    return kj::Own<Slot>();
  }
  if (uid >= 0) {
    uint32_t& n = per_uid_[uid];
    if (n >= max_per_uid_) {
      if (n == 0) per_uid_.erase(uid);
      *reason = "max_connections_per_uid";
      return kj::Own<Slot>();
    }
    ++n;
  }
  ++total_;
  if (on_change_) on_change_(total_);
  return kj::heap<Slot>(*this, uid);
}

void ConnectionCounter::Release(int64_t uid) {
  if (uid >= 0) {
    auto it = per_uid_.find(uid);
    if (it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
  }
  --total_;
  if (on_change_) on_change_(total_);
}

bool MessageBudget::TryReserve(uint64_t bytes) {
  if (bytes > limit_ || used_ > limit_ - bytes) return false;
  used_ += bytes;
  if (gauge_ != nullptr) gauge_->Set(static_cast<double>(used_));
  return true;
}

void MessageBudget::Release(uint64_t bytes) {
  used_ -= std::min(bytes, used_);
  if (gauge_ != nullptr) gauge_->Set(static_cast<double>(used_));
}

MessageLimiter::MessageLimiter(const ConnectionLimits& limits, MessageBudget& budget, kj::Timer& timer,
                               std::function<void(const char*, const std::string&)> on_drop)
    : limits_(limits), budget_(budget), timer_(timer), on_drop_(std::move(on_drop)) {}

MessageLimiter::~MessageLimiter() { budget_.Release(reserved_); }

kj::Exception MessageLimiter::Drop(const char* reason, const std::string& detail) {
  if (!dropped_) {
    dropped_ = true;
    budget_.Release(reserved_);
    reserved_ = 0;
    if (on_drop_) on_drop_(reason, detail);
  }
  return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                       kj::heapString(absl::StrCat("connection dropped: ", detail).c_str()));
}

kj::Exception MessageLimiter::IdleTimeout() {
  return Drop("idle_timeout", absl::StrCat("no byte for ", limits_.idle_timeout / kj::MILLISECONDS,
                                           " ms inside a message (limits.idle_timeout_ms)"));
}

namespace {

size_t BytesOf(const size_t& n) { return n; }
size_t BytesOfResult(const kj::AsyncCapabilityStream::ReadResult& r) { return r.byteCount; }

}  // namespace

MessageLimitedStream::MessageLimitedStream(kj::Own<kj::AsyncIoStream> inner, const ConnectionLimits& limits,
                                           MessageBudget& budget, kj::Timer& timer,
                                           std::function<void(const char*, const std::string&)> on_drop)
    : ForwardingStream(kj::mv(inner)), limiter_(limits, budget, timer, std::move(on_drop)) {}

kj::Promise<size_t> MessageLimitedStream::tryRead(void* buffer, size_t min_bytes, size_t max_bytes) {
  if (limiter_.dropped()) return size_t(0);  // after a drop: end of stream
  return limiter_.Guard<size_t>(inner().tryRead(buffer, min_bytes, max_bytes), buffer, &BytesOf);
}

MessageLimitedCapabilityStream::MessageLimitedCapabilityStream(
    kj::Own<kj::AsyncIoStream> inner, kj::AsyncCapabilityStream& caps, const ConnectionLimits& limits,
    MessageBudget& budget, kj::Timer& timer, std::function<void(const char*, const std::string&)> on_drop)
    : inner_(kj::mv(inner)), caps_(caps), limiter_(limits, budget, timer, std::move(on_drop)) {}

kj::Promise<size_t> MessageLimitedCapabilityStream::tryRead(void* buffer, size_t min_bytes, size_t max_bytes) {
  if (limiter_.dropped()) return size_t(0);
  return limiter_.Guard<size_t>(caps_.tryRead(buffer, min_bytes, max_bytes), buffer, &BytesOf);
}

kj::Promise<kj::AsyncCapabilityStream::ReadResult> MessageLimitedCapabilityStream::tryReadWithFds(
    void* buffer, size_t min_bytes, size_t max_bytes, kj::AutoCloseFd* fds, size_t max_fds) {
  if (limiter_.dropped()) return ReadResult{0, 0};
  return limiter_.Guard<ReadResult>(caps_.tryReadWithFds(buffer, min_bytes, max_bytes, fds, max_fds), buffer,
                                    &BytesOfResult);
}

kj::Promise<kj::AsyncCapabilityStream::ReadResult> MessageLimitedCapabilityStream::tryReadWithStreams(
    void* buffer, size_t min_bytes, size_t max_bytes, kj::Own<kj::AsyncCapabilityStream>* streams,
    size_t max_streams) {
  if (limiter_.dropped()) return ReadResult{0, 0};
  return limiter_.Guard<ReadResult>(caps_.tryReadWithStreams(buffer, min_bytes, max_bytes, streams, max_streams),
                                    buffer, &BytesOfResult);
}

kj::Maybe<kj::Exception> MessageLimiter::Observe(const uint8_t* bytes, size_t n) {
  while (n > 0 && !untracked_) {
    if (body_left_ > 0) {
      const uint64_t take = std::min<uint64_t>(n, body_left_);
      body_left_ -= take;
      bytes += take;
      n -= take;
      if (body_left_ == 0) {
        budget_.Release(reserved_);
        reserved_ = 0;
        first_message_done_ = true;
      }
      continue;
    }
    // In the segment table: collect one 32-bit word.
    const uint32_t take = std::min<uint32_t>(static_cast<uint32_t>(std::min<size_t>(n, 4)), 4 - word_fill_);
    std::memcpy(word_ + word_fill_, bytes, take);
    word_fill_ += take;
    bytes += take;
    n -= take;
    if (word_fill_ < 4) continue;
    word_fill_ = 0;
    const uint64_t value = uint64_t(word_[0]) | uint64_t(word_[1]) << 8 | uint64_t(word_[2]) << 16 |
                           uint64_t(word_[3]) << 24;
    if (header_words_seen_ == 0) {
      segments_ = value + 1;
      if (segments_ > kMaxSegments) {
        untracked_ = true;  // Cap'n Proto refuses the message and drops the connection
        break;
      }
      header_words_ = (1 + segments_ + 1) & ~uint64_t(1);
      declared_words_ = 0;
    } else if (header_words_seen_ <= segments_) {
      declared_words_ += value;
    }
    ++header_words_seen_;
    if (header_words_seen_ < header_words_) continue;
    // The whole table has arrived: reserve the message's bytes before Cap'n Proto allocates them.
    header_words_seen_ = 0;
    const uint64_t declared = declared_words_ * 8;
    if (declared > limits_.connection_buffer_bytes) {
      return Drop("message_too_large",
                  absl::StrCat("a message of ", declared, " bytes is over limits.connection_buffer_bytes (",
                               limits_.connection_buffer_bytes, ")"));
    }
    if (declared > kUncountedMessageBytes) {
      if (!budget_.TryReserve(declared)) {
        return Drop("buffer_budget",
                    absl::StrCat("a message of ", declared, " bytes does not fit limits.buffered_message_bytes (",
                                 budget_.used(), " of ", budget_.limit(), " bytes held by unfinished messages)"));
      }
      reserved_ = declared;
    }
    body_left_ = declared;
    if (body_left_ == 0) first_message_done_ = true;
  }
  return nullptr;
}

}  // namespace refit::server
