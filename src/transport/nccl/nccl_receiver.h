// NCCL data plane, receiving end (refitd). Senders connect to a rendezvous socket
// (Endpoint() = "nccl:<host>:<port>"), receive a fresh ncclUniqueId from it, and both ends create
// a two-rank communicator (receiver rank 0, sender rank 1) in non-blocking mode (a fan-out
// group's sender instead brings its own unique id and rank: nccl_broadcaster.h); the socket then
// carries each message's 32-byte frame (tag, size) and is the liveness signal. Each connected
// sender has a progress thread that waits for the next frame on the socket, then posts the NCCL
// receive of its payload (none is posted on an idle connection); a message goes straight into the buffer of the
// matching Receive (device memory of this receiver's GPU: no copy; anything else through a
// device bounce buffer), small unmatched messages are held in host memory, large ones wait for
// their Receive (their sender stays blocked). A sender whose socket closes without the goodbye
// frame failed: its communicator is aborted (ncclCommAbort, so nothing hangs) and every Receive
// returns Unavailable until Reset(). A Receive whose deadline passes while its message is half
// delivered (the sender stalled mid-message) aborts that sender's communicator, so a stuck
// trainer never holds refitd past the session deadline. A message too large to hold that is
// still waiting for its Receive when Cancel() or Reset() is called (its session ended) is
// received and dropped, so its sender is released and later messages are not held behind it.
//
// Threading: as transport.h; the communicators live across sessions.
#ifndef REFIT_TRANSPORT_NCCL_NCCL_RECEIVER_H_
#define REFIT_TRANSPORT_NCCL_NCCL_RECEIVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/nccl/nccl_options.h"
#include "common/unique_fd.h"
#include "transport/transport.h"

namespace refit::transport {

class NcclReceiver final : public Receiver {
 public:
  static absl::StatusOr<std::unique_ptr<NcclReceiver>> Listen(const NcclOptions& options);
  ~NcclReceiver() override;

  std::string Endpoint() const override { return endpoint_; }
  // NCCL's transports carry their own integrity checks (nccl_transport.h).
  bool ChecksIntegrity() const override { return true; }
  absl::StatusOr<uint64_t> Receive(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) override;
  void Cancel() override;
  void Reset() override;

  int device() const { return options_.device; }
  // Senders connected now (for status and tests).
  int connected() const;

 private:
  struct Peer;
  struct Post {
    uint64_t tag;
    void* dst;
    uint64_t capacity;
    bool claimed = false;
    bool done = false;
    absl::StatusOr<uint64_t> result = uint64_t{0};
    Peer* owner = nullptr;  // the peer writing into dst, once claimed
  };

  NcclReceiver(NcclOptions options, UniqueFd listen_fd, std::string endpoint);
  void AcceptLoop();
  void ServePeer(Peer& peer);
  // Delivers one message whose frame was just received; false when the peer must stop.
  bool Deliver(Peer& peer, uint64_t tag, uint64_t bytes);
  std::list<Post*>::iterator FindPost(uint64_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every Receive until Reset(), when the peer delivered anything since the last Reset()
  // (a sender idle since then, e.g. one left over from an earlier session, fails alone).
  void PeerFailed(Peer& peer, const absl::Status& status);

  const NcclOptions options_;
  const UniqueFd listen_fd_;
  const std::string endpoint_;

  mutable absl::Mutex mu_;
  std::list<Post*> posted_ ABSL_GUARDED_BY(mu_);
  // A message held in host memory for a later Receive. Entered (not ready) when its transfer
  // starts, so a Receive that comes meanwhile waits for it rather than posting past it, and later
  // messages of the tag queue behind it: the order of a tag's messages is kept.
  struct Held {
    Peer* owner;
    uint64_t bytes;
    bool ready = false;
    absl::Status status;
    std::vector<uint8_t> data;
  };
  std::map<uint64_t, std::deque<Held>> eager_ ABSL_GUARDED_BY(mu_);
  uint64_t eager_held_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // Reset() count
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;       // Cancel() and Reset() count
  std::vector<std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};  // mirrors shutdown_ for lock-free polling
  std::thread accept_thread_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_NCCL_NCCL_RECEIVER_H_
