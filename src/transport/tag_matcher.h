// Tag matching of a data-plane receiver whose senders each deliver one message at a time from a
// thread of their own (the NCCL and CUDA IPC receivers): posted receives (tag -> buffer,
// capacity), messages that arrive before their Receive (small ones held in host memory, within a
// byte limit; larger ones wait, their sender blocked, for a Receive of their tag, and are dropped
// once the session that sent them ends), oversized messages, the Receive's wait and deadline, and
// the peer-failure state (every Receive fails until Reset() once a sender that delivered since the
// last Reset() failed). It moves no byte itself: the receiver transfers each message where
// Arrive() says and then reports it with Complete(). Transport-neutral (no CUDA).
//
// A message's path through it: Arrive(sender, tag, bytes) waits until the message has a place (a
// posted Receive of its tag, none of the tag's held messages ahead of it; else room to hold it)
// and returns it: into the Receive's buffer (post), into host memory (held), or nowhere (drop: too
// large to hold and its session ended). The receiver moves the bytes, then Complete(arrival,
// status, host bytes). A Receive that finds the tag's oldest held message waits for it to be
// complete and copies it into its buffer through the receiver's `copy`.
//
// Threading: thread-safe; its mutex is a leaf (callbacks run without it, except `copy`, which
// runs under it and must not call back in).
#ifndef REFIT_TRANSPORT_TAG_MATCHER_H_
#define REFIT_TRANSPORT_TAG_MATCHER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace refit::transport {

class TagMatcher {
 public:
  struct Options {
    // Messages up to this size that arrive before a matching Receive are held in host memory.
    uint64_t eager_bytes = 1ull << 20;
    // At most this many bytes held that way (beyond it, messages wait like large ones).
    uint64_t eager_limit_bytes = 64ull << 20;
    // A Receive whose deadline passes while its message is still being transferred (the sender
    // stalled mid-message) sets the sender's abort_requested and waits for the transfer to end;
    // false: it waits for the transfer without a deadline (a local copy: the bytes are all there).
    bool abort_stalled = false;
    // Messages wait for their session rather than for the current one: a message that has no
    // place yet is dropped only once its session (tag >> 32) ended (EndSession), not when the
    // matcher is reset or cancelled, so a sender may send a session's first messages before the
    // receiving side began it (a trainer's begin answered later). False: dropped once the
    // matcher is reset or cancelled after it arrived.
    bool wait_for_sessions = false;
  };
  // The matcher's part of a connected sender (a receiver's peer derives from it).
  struct Sender {
    uint64_t active_in = UINT64_MAX;  // Reset() count of its last delivery (guarded by the matcher)
    std::atomic<bool> abort_requested{false};  // a Receive's deadline passed mid-message
  };

  struct Post;
  struct Held;
  // Bytes a receiver lends a Receive instead of moving them into its buffer (Receiver::ReceiveOrLend):
  // where they are and the receiver's number for the loan (0: none, the bytes were moved).
  struct Loan {
    const void* data = nullptr;
    uint64_t id = 0;
  };
  // Where an arriving message goes.
  struct Arrival {
    enum Kind { kStop, kPost, kHold, kDrop };
    Kind kind = kStop;
    void* dst = nullptr;     // kPost: the Receive's buffer
    uint64_t capacity = 0;   // kPost: its capacity
    bool oversized = false;  // kPost: the message is larger than the buffer (nothing to move)
    bool lendable = false;   // kPost: the Receive takes a loan instead (Complete's `loan`)
    uint64_t tag = 0;
    uint64_t bytes = 0;
    Post* post = nullptr;
    Held* held = nullptr;
  };

  explicit TagMatcher(Options options) : options_(options) {}
  TagMatcher(const TagMatcher&) = delete;
  TagMatcher& operator=(const TagMatcher&) = delete;

  // Waits for a place for the message (tag, bytes) from `sender`. Every 20 ms without one it asks
  // `alive`; false (the receiver has recorded any failure itself) ends the wait with kStop, as
  // does Shutdown(). Anything but kStop must be followed by Complete().
  Arrival Arrive(Sender& sender, uint64_t tag, uint64_t bytes, const std::function<bool()>& alive);
  // The transfer of an arrival ended with `status` (`host`: a held message's bytes; `loan`: for a
  // lendable post, the bytes lent instead of moved into its buffer).
  void Complete(const Arrival& arrival, const absl::Status& status, std::vector<uint8_t> host);
  void Complete(const Arrival& arrival, const absl::Status& status, std::vector<uint8_t> host, Loan loan);

  // Transport::Receive. `copy` moves a held message's bytes into dst (host to wherever dst is).
  // With `loan`, the post is lendable: *loan is what the receiver lent (id 0: moved into dst).
  absl::StatusOr<uint64_t> Receive(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline,
                                   const std::function<absl::Status(void* dst, const void* src, uint64_t bytes)>& copy,
                                   Loan* loan = nullptr);
  void Cancel();
  void Reset();
  // Session `session_id` ended (or was never begun): its messages still waiting for a place are
  // dropped, and its held ones freed (Options::wait_for_sessions; the last kEndedSessions ids
  // are remembered).
  void EndSession(uint64_t session_id);
  static constexpr size_t kEndedSessions = 64;
  // Ends every wait for good (the receiver is being destroyed).
  void Shutdown();
  // Records a sender's failure: every Receive fails with `status` until Reset(), when the sender
  // delivered anything since the last Reset() (one idle since then, e.g. left over from an
  // earlier session, fails alone).
  void PeerFailed(Sender& sender, const absl::Status& status);

  // Held bytes now (for tests).
  uint64_t held_bytes() const;

  struct Post {
    uint64_t tag;
    void* dst;
    uint64_t capacity;
    bool claimed = false;
    bool done = false;
    absl::StatusOr<uint64_t> result = uint64_t{0};
    Sender* owner = nullptr;  // the sender writing into dst, once claimed
    bool lendable = false;
    Loan loan;
  };
  // Entered (not ready) when its transfer starts, so that a Receive that comes meanwhile waits for
  // it rather than posting past it, and later messages of the tag queue behind it: the order of a
  // tag's messages is kept.
  struct Held {
    Sender* owner;
    uint64_t bytes;
    bool ready = false;
    absl::Status status;
    std::vector<uint8_t> data;
  };

 private:
  std::list<Post*>::iterator FindPost(uint64_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::list<Post*> posted_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::deque<Held>> eager_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> ended_ ABSL_GUARDED_BY(mu_);  // EndSession's ids, oldest first
  uint64_t eager_held_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // Reset() count
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;       // Cancel() and Reset() count
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_TAG_MATCHER_H_
