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
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "transport/nccl/nccl_options.h"
#include "transport/tag_matcher.h"
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

  NcclReceiver(NcclOptions options, UniqueFd listen_fd, std::string endpoint);
  void AcceptLoop();
  void ServePeer(Peer& peer);
  // Delivers one message whose frame was just received; false when the peer must stop.
  bool Deliver(Peer& peer, uint64_t tag, uint64_t bytes);

  const NcclOptions options_;
  const UniqueFd listen_fd_;
  const std::string endpoint_;

  // Posted receives, held messages and the failure state (tag_matcher.h).
  TagMatcher matcher_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};  // the receiver is being destroyed
  std::thread accept_thread_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_NCCL_NCCL_RECEIVER_H_
