// CUDA IPC data plane, receiving end (refitd), for a trainer on the same host, usually the same
// GPU (colocated RL). Senders connect to a Unix socket (Endpoint() = "cuda_ipc:<socket>"); no
// payload byte crosses it. Each sender exports each of its device buffers once (its bucket
// buffers: a CUDA IPC handle per allocation, not per bucket); the receiver maps each buffer once
// (cudaIpcOpenMemHandle, shared by every peer of this process and counted) and keeps it mapped
// until the sender forgets it or disconnects. A run of CUDA virtual-memory pieces comes as their
// POSIX descriptors and is imported (storage::VmmImport) for that sender alone. A message is a frame naming (tag, size, buffer,
// offset): its bytes are copied out of the mapped buffer into the matching Receive's buffer on
// this receiver's GPU (a device-to-device copy on the peer's stream), and only once that stream
// has synchronized is the sender released (a kReleased reply), so the trainer reuses a buffer only
// after refitd has finished reading it. Small messages with no Receive posted yet are copied into
// host memory and released at once; larger ones wait (their sender blocked) for their Receive.
// ReceiveOrLend copies nothing when the sender's buffer is device memory of this receiver's GPU
// (the colocated case): it lends the mapped bytes, and the sender is released only at GiveBack, so
// refitd's converter reads the trainer's buffer in place (no copy into a ring slot). A sender
// whose bytes are lent when DisconnectPeers() comes has its socket shut at the GiveBack.
//
// Failure: a sender whose socket closes without the goodbye frame failed; every Receive returns
// Unavailable until Reset() (only if it delivered anything since the last Reset()); its buffers
// are unmapped. A large message still waiting for its Receive when Cancel() or Reset() is called
// (its session ended) is dropped and its sender released. DisconnectPeers() shuts every sender's
// socket: a sender blocked in Send fails, and reconnects for its next session.
//
// Threading: as transport.h; one thread per connected sender.
#ifndef REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_RECEIVER_H_
#define REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_RECEIVER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "transport/cuda_ipc/cuda_ipc_options.h"
#include "transport/cuda_ipc/cuda_ipc_wire.h"
#include "transport/tag_matcher.h"
#include "transport/transport.h"

namespace refit::transport {

class CudaIpcReceiver final : public Receiver {
 public:
  static absl::StatusOr<std::unique_ptr<CudaIpcReceiver>> Listen(const CudaIpcOptions& options);
  ~CudaIpcReceiver() override;

  std::string Endpoint() const override { return endpoint_; }
  // Copies within GPU memory: nothing on the way can change a byte (no checksum is announced).
  bool ChecksIntegrity() const override { return true; }
  absl::StatusOr<uint64_t> Receive(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) override;
  // Lends a message in a buffer on this receiver's GPU (no copy); others are copied into dst.
  absl::StatusOr<Message> ReceiveOrLend(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) override;
  void GiveBack(uint64_t loan) override;
  void Cancel() override;
  void Reset() override;
  void EndSession(uint64_t session_id) override;
  void DisconnectPeers() override;

  int device() const { return options_.device; }
  // Senders connected now, and buffers mapped now (for status and tests).
  int connected() const;
  int mapped() const;

 private:
  struct Peer;
  using HandleKey = std::array<uint8_t, cuda_ipc::kHandleBytes>;
  struct Mapping {
    void* base = nullptr;
    int refs = 0;
  };

  CudaIpcReceiver(CudaIpcOptions options, UniqueFd listen_fd, std::string endpoint);
  void AcceptLoop();
  void ServePeer(Peer& peer);
  absl::Status Export(Peer& peer, const cuda_ipc::Frame& f);
  // A run of CUDA virtual-memory pieces: its descriptors read off the socket and imported.
  absl::Status ExportVmm(Peer& peer, const cuda_ipc::Frame& f);
  void Forget(Peer& peer, uint64_t buffer_id);
  // Delivers one message whose frame was just read; false when the peer must stop.
  bool Deliver(Peer& peer, const cuda_ipc::Frame& f);
  // Deliver's loan of `src` to a ReceiveOrLend: completes it, waits for GiveBack, then releases the
  // sender (or shuts its socket, if DisconnectPeers came meanwhile).
  bool Lend(Peer& peer, const TagMatcher::Arrival& a, const uint8_t* src, uint64_t tag);
  // Records the failure in the matcher unless the peer was dropped or the receiver is stopping.
  void PeerFailed(Peer& peer, const absl::Status& status);

  const CudaIpcOptions options_;
  const UniqueFd listen_fd_;
  const std::string endpoint_;

  // Posted receives, held messages and the failure state (tag_matcher.h).
  TagMatcher matcher_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};

  // Mapped IPC handles of this process, shared by its peers (a handle is opened once per process).
  mutable absl::Mutex map_mu_;
  std::map<HandleKey, Mapping> mappings_ ABSL_GUARDED_BY(map_mu_);

  // Loans of ReceiveOrLend: numbered, and given back (GiveBack) to the peer thread waiting.
  absl::Mutex loan_mu_;
  uint64_t next_loan_ ABSL_GUARDED_BY(loan_mu_) = 0;
  std::set<uint64_t> returned_ ABSL_GUARDED_BY(loan_mu_);

  std::thread accept_thread_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_RECEIVER_H_
