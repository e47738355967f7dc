// RAII owners for the NCCL data plane: a CUDA stream, a growable device buffer, and a
// non-blocking NCCL communicator whose every wait polls (completion, NCCL's asynchronous error,
// a caller-supplied interrupt such as "the peer's socket closed", a deadline) and which is
// aborted, never left hanging, when a wait does not complete. Also the frame header that
// precedes every message and the rendezvous-socket helpers.
//
// Threading: each object is used by one thread at a time; the CUDA device is set by every call
// that needs it, so objects may move between threads.
#ifndef REFIT_TRANSPORT_NCCL_NCCL_HANDLES_H_
#define REFIT_TRANSPORT_NCCL_NCCL_HANDLES_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace refit::transport::nccl {

// CUDA errors as this transport reports them: the project's CudaStatus, as Unavailable.
absl::Status CudaStatus(cudaError_t e, absl::string_view what);
absl::Status NcclStatus(ncclResult_t r, absl::string_view what);

// Returns non-OK to stop a wait (the status is what the wait returns).
using Interrupt = std::function<absl::Status()>;

// Precedes every message: written on the rendezvous socket (32 bytes), after which the payload,
// if any, follows over NCCL. The receiver learns size and tag without an NCCL operation or a
// device-to-host copy, and no NCCL receive is ever posted on an idle connection.
struct Frame {
  static constexpr uint64_t kMagic = 0x31304C43434E4652ull;  // "RFNCCL01"
  static constexpr uint64_t kGoodbye = 1;
  uint64_t magic = kMagic;
  uint64_t tag = 0;
  uint64_t bytes = 0;
  uint64_t flags = 0;
};
static_assert(sizeof(Frame) == 32);

// Ranks of a fan-out group's communicator (the sender and its receivers) at most.
inline constexpr int kMaxGroupRanks = 64;

class Stream {
 public:
  static absl::StatusOr<std::unique_ptr<Stream>> Create(int device);
  ~Stream();
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  Stream(int device, cudaStream_t s) : device_(device), stream_(s) {}
  int device_;
  cudaStream_t stream_;
};

class DeviceBuffer {
 public:
  explicit DeviceBuffer(int device) : device_(device) {}
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // At least `bytes` of device memory (contents not kept when it grows), usable in `stream`'s
  // order. Stream-ordered allocation (cudaMallocAsync/cudaFreeAsync): a plain cudaFree would
  // wait for every kernel on the device, including other communicators' pending receives, which
  // can deadlock two senders sharing a GPU pair.
  absl::StatusOr<void*> Reserve(uint64_t bytes, cudaStream_t stream);
  int device() const { return device_; }

 private:
  int device_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

// True when `p` is device memory of `device` (NCCL can use it directly).
bool IsDeviceMemoryOf(const void* p, int device);

// What a sender sends from: `payload` itself when it is device memory of bounce's device,
// otherwise a copy into `bounce` enqueued on `stream`.
absl::StatusOr<const void*> OnDevice(const void* payload, uint64_t bytes, DeviceBuffer& bounce, cudaStream_t stream);

// A sender's name in its receivers' errors: `configured`, or "<hostname>:<pid>" when empty.
std::string SenderName(const std::string& configured);

class Communicator {
 public:
  // Rank `rank` of `nranks`, created non-blocking; polls until ready. On any failure (including
  // the interrupt or the deadline) the half-made communicator is aborted.
  static absl::StatusOr<std::unique_ptr<Communicator>> Init(int device, const ncclUniqueId& id, int nranks, int rank,
                                                            absl::Time deadline, const Interrupt& interrupt);
  ~Communicator();  // aborts (local, never waits for the peer)
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Enqueue on `stream` (waiting only while NCCL reports the enqueue in progress).
  absl::Status Send(const void* buf, uint64_t bytes, int peer, cudaStream_t stream);
  absl::Status Recv(void* buf, uint64_t bytes, int peer, cudaStream_t stream);
  // In-place broadcast of buf[0, bytes) from `root` to every rank (a fan-out group).
  absl::Status Broadcast(void* buf, uint64_t bytes, int root, cudaStream_t stream);
  // Polls until everything on `stream` completed. When it fails (NCCL error, interrupt,
  // deadline) the communicator is aborted and the stream drained before returning.
  absl::Status Wait(cudaStream_t stream, absl::Time deadline, const Interrupt& interrupt);
  void Abort();
  bool aborted() const { return comm_ == nullptr; }

 private:
  Communicator(int device, ncclComm_t comm) : device_(device), comm_(comm) {}
  absl::Status AfterEnqueue(ncclResult_t r, absl::string_view what);
  int device_;
  ncclComm_t comm_;
};

// Rendezvous sockets (TCP). All return Unavailable on a broken or closed connection.
absl::StatusOr<UniqueFd> ListenTcp(const std::string& host, uint16_t port, uint16_t& bound_port);
absl::StatusOr<UniqueFd> ConnectTcp(const std::string& host, uint16_t port);
absl::Status WriteAll(int fd, const void* data, uint64_t bytes);
absl::Status ReadAll(int fd, void* data, uint64_t bytes, absl::Time deadline);
// OK while the connection is open (the peer has not closed or reset it).
absl::Status CheckIdle(int fd, absl::string_view peer);
// Waits for the next frame on the rendezvous socket (the sender writes it before its NCCL send,
// so the receiver posts a receive only while a sender is sending: no kernel waits on an idle
// connection, and nothing else on the GPU, such as a cudaFree, can end up waiting on one).
// Cancelled when `stop` turns true (polled every 100 ms); Unavailable when the peer closed;
// DataLoss for bytes that are not a frame.
absl::Status AwaitFrame(int fd, absl::string_view peer, const std::function<bool()>& stop, Frame& frame);

// The NCCL this process loaded: ncclGetVersion's code, that code as text ("2.28.9"), and the file
// the library was loaded from (what LD_LIBRARY_PATH or RUNPATH picked).
int32_t LoadedNcclVersion();
std::string NcclVersionText(int32_t code);
std::string LoadedNcclLibrary();
// The version step of the rendezvous (nccl_wire.h). The receiver answers its version after the
// hello and refuses (FailedPrecondition) a sender of another; the sender reads that answer and
// refuses likewise, with an error that names both versions, this process's library and what to
// change.
absl::Status AnswerNcclVersion(int fd, int32_t sender_version);
absl::Status AwaitNcclVersion(int fd, absl::string_view peer, absl::Time deadline);
absl::Status SameNcclVersion(int32_t mine, int32_t theirs, absl::string_view peer);

// "nccl:<host>:<port>" <-> parts.
std::string FormatEndpoint(const std::string& host, uint16_t port);
absl::Status ParseEndpoint(const std::string& endpoint, std::string& host, uint16_t& port);

}  // namespace refit::transport::nccl

#endif  // REFIT_TRANSPORT_NCCL_NCCL_HANDLES_H_
