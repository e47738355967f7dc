// The data-plane seam: moves opaque bucket payloads from trainer processes to refitd.
// Implementations live in src/transport/<name>/, each described by a TransportDescriptor
// (registry.h) and listed in builtin_transports.cc. The control plane
// (Cap'n Proto) announces each bucket (tag, size, tensor descriptors, checksum); the data plane
// only carries bytes matched by tag. The core (src/refit/) sees only this interface.
//
// Threading: a Receiver is used by one receiving thread at a time, except Cancel() and
// GiveBack(), which any thread may call. A Sender is used by one thread at a time.
#ifndef REFIT_TRANSPORT_TRANSPORT_H_
#define REFIT_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace refit::transport {

// Receiving end, owned by refitd. Long-lived: one per daemon, shared by consecutive sessions.
class Receiver {
 public:
  virtual ~Receiver() = default;

  // An opaque string that a Sender passes to Connect (e.g. "ucx:tcp:127.0.0.1:40123"). Handed to
  // trainers only over the authenticated control plane.
  virtual std::string Endpoint() const = 0;

  // Blocks until the next message with `tag` has fully arrived in dst[0, capacity). Returns its
  // size. Errors: DeadlineExceeded (deadline passed), Cancelled (Cancel() called),
  // InvalidArgument (the message is larger than capacity; the message is consumed and dropped),
  // Unavailable (the transport failed).
  virtual absl::StatusOr<uint64_t> Receive(uint64_t tag, void* dst, uint64_t capacity,
                                           absl::Time deadline) = 0;

  // A received message: where its bytes are, how many, and the loan that GiveBack ends (0: none).
  struct Message {
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
    uint64_t loan = 0;
  };
  // Receive, except that a transport whose message already lies where dst's reader can read it
  // (CUDA IPC: the sender's buffer, mapped on this receiver's GPU) may lend it instead of copying:
  // `data` is then the sender's bytes, unchanged and the sender blocked in Send until
  // GiveBack(loan). Otherwise `data` is dst and `loan` 0. Errors as Receive. Every loan must be
  // given back, also when the session ends (refit/session.cc does).
  virtual absl::StatusOr<Message> ReceiveOrLend(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) {
    absl::StatusOr<uint64_t> n = Receive(tag, dst, capacity, deadline);
    if (!n.ok()) return n.status();
    return Message{static_cast<const uint8_t*>(dst), *n, 0};
  }
  // Ends a loan of ReceiveOrLend: its reader has finished (every read complete), so the sender may
  // reuse its buffer. Any thread; loan 0 is ignored.
  virtual void GiveBack(uint64_t loan) { (void)loan; }
  // Makes a blocked or later Receive return Cancelled until Reset().
  virtual void Cancel() = 0;
  virtual void Reset() = 0;
  // Session `session_id` ended, or a begin that named its id was refused: messages of its tags
  // still waiting for a receive are dropped. For a receiver that holds a session's messages sent
  // before the session began (a trainer that chose its session id and did not wait for the
  // begin's answer: CUDA IPC); others drop waiting messages at Cancel/Reset already.
  virtual void EndSession(uint64_t session_id) { (void)session_id; }

  // Drops every connected sender, so that one blocked in Send fails instead of waiting for a
  // receive that an aborted session will never post. Senders reconnect for their next session.
  virtual void DisconnectPeers() {}
  // The process exits next (refitd, after its shutdown drained every session): stops accepting
  // and serving senders. What the transport cannot free safely while a sender may still be
  // connecting is left to the exit, which also closes the connections it keeps (UCX:
  // ucx_receiver.h). Receive answers Unavailable afterwards; destroying the receiver is allowed.
  virtual void CloseForExit() {}
  // True when the transport itself guarantees that received bytes equal the sent ones (its
  // descriptor's checks_integrity, registry.h): the session then verifies no announced checksum.
  virtual bool ChecksIntegrity() const { return false; }
};

// Sending end, owned by a trainer process; one per connection to one refitd.
class Sender {
 public:
  virtual ~Sender() = default;
  // Blocks until `src` may be reused (the bytes are on the wire or delivered).
  // Errors: Unavailable when the peer is gone.
  virtual absl::Status Send(uint64_t tag, const void* src, uint64_t bytes) = 0;

  // A send in two steps, for a caller that waits for its sends on another thread: Post starts the
  // send on the calling thread, so that the receiver may read the message at once, not once the
  // waiting thread woke (a sleeping thread's wake-up costs 0.1-0.3 ms on a virtualized GPU host:
  // docs/benchmarks.md run 32). true: started, and Finish (on the same or another thread, before
  // the next Post or Send) blocks until `src` may be reused, as Send would have; false: nothing
  // started, the caller Sends as usual. The default starts nothing; a transport whose Send writes
  // a descriptor and then only waits for the receiver (CUDA IPC) posts. Errors as Send.
  virtual absl::StatusOr<bool> Post(uint64_t tag, const void* src, uint64_t bytes) {
    (void)tag, (void)src, (void)bytes;
    return false;
  }
  virtual absl::Status Finish() { return absl::FailedPreconditionError("no message posted"); }
};

// Sending end of a fan-out: the same payload to several receivers (one trainer rank feeding
// several refitd daemons), each receiver matching it under its own tag. Implementations:
// SequentialGroupSender (any transport, one point-to-point send after another) and
// NcclBroadcaster (one NCCL broadcast to every receiver).
class GroupSender {
 public:
  virtual ~GroupSender() = default;
  virtual size_t size() const = 0;
  // tags[i] is receiver i's tag (tags.size() == size()). Blocks until `src` may be reused.
  // Errors: Unavailable when any receiver is gone (the message may have reached the others).
  virtual absl::Status Send(std::span<const uint64_t> tags, const void* src, uint64_t bytes) = 0;
};

// Fans out over point-to-point senders, one after another.
class SequentialGroupSender final : public GroupSender {
 public:
  explicit SequentialGroupSender(std::vector<std::unique_ptr<Sender>> senders) : senders_(std::move(senders)) {}
  size_t size() const override { return senders_.size(); }
  absl::Status Send(std::span<const uint64_t> tags, const void* src, uint64_t bytes) override {
    if (tags.size() != senders_.size()) return absl::InvalidArgumentError("one tag per receiver expected");
    for (size_t i = 0; i < senders_.size(); ++i) {
      if (absl::Status st = senders_[i]->Send(tags[i], src, bytes); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Sender>> senders_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_TRANSPORT_H_
