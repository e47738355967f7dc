// CUDA IPC data plane, sending end (trainer). Connect() opens the receiver's Unix socket and
// exchanges hellos. Send(tag, src, bytes) finds the CUDA allocation holding `src`; the first
// message from an allocation exports it (cudaIpcGetMemHandle, one handle per buffer: the trainer
// client's two bucket buffers are exported once each, whatever the number of buckets), then every
// message is a frame (tag, size, buffer, offset) on the socket, and Send blocks until the receiver
// replies that its copy out of the buffer has completed; only then may `src` be reused. `src`
// that cannot be exported (host memory, managed or stream-ordered pool memory) is first copied
// into a bounce buffer of this sender's device, which is exported once like any other. CUDA
// virtual memory (PyTorch's expandable segments, sleep-mode allocators) is exported as the run of
// mapped pieces holding the message, one POSIX descriptor per piece (kExportVmm), and reused for
// every later message inside the run; refitd maps it with cuMemImportFromShareableHandle, which
// its kernels read as fast as their own memory (memory opened by cudaIpcOpenMemHandle reads about
// 40% slower in refitd's conversion kernels: kernel_bench --sequence). Virtual memory that
// cannot be exported (no POSIX descriptor handle type) is bounced. The bytes
// at `src` must be complete when Send is called (the trainer client synchronizes its packing
// stream first). At most kMaxExports buffers are exported at once (the oldest is forgotten).
// An exported buffer keeps its memory allocated while the receiver maps it, even once the
// trainer freed it: whenever a new buffer is exported, every earlier one whose allocation is
// gone (or replaced by another at the same address) is forgotten first, so a trainer that frees
// and reallocates its weights does not pin the old allocation in refitd.
// The socket is the liveness signal: if it closes, Send returns Unavailable. The destructor sends
// a goodbye frame and waits for its acknowledgement (close_timeout).
//
// Threading: one thread at a time (transport.h).
#ifndef REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_SENDER_H_
#define REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_SENDER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device_allocation.h"
#include "common/unique_fd.h"
#include "transport/cuda_ipc/cuda_ipc_options.h"
#include "transport/transport.h"

namespace refit::transport {

class CudaIpcSender final : public Sender {
 public:
  static absl::StatusOr<std::unique_ptr<CudaIpcSender>> Connect(const std::string& endpoint,
                                                                const CudaIpcOptions& options);
  ~CudaIpcSender() override;

  absl::Status Send(uint64_t tag, const void* src, uint64_t bytes) override;
  // Post writes the message's frame at once (exporting its buffer first if needed) unless it needs
  // the bounce buffer (false: Send it instead); Finish waits for the receiver's release.
  absl::StatusOr<bool> Post(uint64_t tag, const void* src, uint64_t bytes) override;
  absl::Status Finish() override;
  int device() const { return options_.device; }
  // Buffers exported so far (for tests: the bucket buffers, once each).
  uint64_t exports() const { return exports_; }
  // Of those, runs of CUDA virtual-memory pieces.
  uint64_t vmm_exports() const { return vmm_runs_; }
  // Buffers exported and not forgotten (the receiver maps each).
  size_t live_exports() const { return exported_.size(); }

 private:
  CudaIpcSender(CudaIpcOptions options, std::string endpoint, UniqueFd fd);
  // The buffer id and offset of `src` in an exported buffer (true), exporting it or copying `src`
  // into the bounce buffer first; false, and nothing done, when it needs the bounce buffer and
  // !may_bounce.
  absl::StatusOr<bool> Place(const void* src, uint64_t bytes, bool may_bounce, uint64_t& buffer_id, uint64_t& offset);
  // Places the message and writes its frame (true), or does nothing when it needs the bounce
  // buffer and !may_bounce (false). A failure fails the sender.
  absl::StatusOr<bool> Start(uint64_t tag, const void* src, uint64_t bytes, bool may_bounce);
  absl::Status Fail(const absl::Status& st);
  absl::Status ExportBuffer(uint64_t buffer_id, uint64_t base, uint64_t size, bool& exported);
  // Place for CUDA virtual memory: true when `src` lies in an exported run of pieces (exporting
  // it first); false when it cannot be exported (the caller bounces it).
  absl::StatusOr<bool> PlaceVmm(const void* src, uint64_t bytes, uint64_t& buffer_id, uint64_t& offset);
  absl::Status Remember(uint64_t buffer_id, uint64_t base, uint64_t size,
                        std::vector<std::pair<uint64_t, uint64_t>> pieces);
  // Forgets (tells the receiver to unmap) every exported buffer whose allocation is gone.
  absl::Status ForgetFreed();
  absl::Status SendForget(uint64_t buffer_id);
  absl::Status AwaitReply(uint32_t kind, absl::Time deadline);

  const CudaIpcOptions options_;
  const std::string endpoint_;
  const UniqueFd fd_;
  bool same_process_ = false;
  struct Export {
    uint64_t buffer_id;
    uint64_t base;  // where the allocation lay when it was exported
    uint64_t size = 0;
    // A run of virtual-memory pieces: each piece's (base, CUDA buffer id) when it was exported.
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
  };
  // Exported and not yet gone: every piece of a run still mapped as it was.
  static bool Live(const Export& e);
  std::deque<Export> exported_;  // oldest first
  std::deque<uint64_t> unexportable_;  // device buffers cudaIpcGetMemHandle refused
  DeviceAllocation bounce_;
  uint64_t exports_ = 0;
  uint64_t vmm_runs_ = 0;  // ids of exported runs: kVmmRunBit | count
  absl::Status failed_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_SENDER_H_
