#include "transport/cuda_ipc/cuda_ipc_receiver.h"

#include <cuda_runtime.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda_handles.h"
#include "common/device_env.h"
#include "common/trace.h"
#include "storage/vmm_import.h"
#include "transport/cuda_ipc/cuda_ipc_handles.h"
#include "transport/peer_threads.h"

namespace refit::transport {

using cuda_ipc::CudaStatus;
using cuda_ipc::Frame;
using cuda_ipc::Reply;

struct CudaIpcReceiver::Peer : TagMatcher::Sender {
  explicit Peer(UniqueFd fd_in) : fd(std::move(fd_in)) {}
  ~Peer() {
    if (thread.joinable()) thread.join();
  }  // the socket closes last
  const UniqueFd fd;
  std::string name = "(connecting)";
  bool same_process = false;  // the sender is this process: buffers are used at their address
  CudaStream stream;          // the copies out of this sender's buffers
  struct Buffer {
    uint8_t* base = nullptr;
    uint64_t size = 0;
    bool mapped = false;    // opened from a handle (else the sender's own address)
    bool lendable = false;  // device memory of the receiver's GPU: lent to ReceiveOrLend, not copied
    HandleKey key{};
    std::shared_ptr<storage::VmmImport> vmm;  // a run of virtual-memory pieces, imported
  };
  std::map<uint64_t, Buffer> buffers;  // by the sender's buffer id; the peer's thread only
  std::atomic<bool> dropped{false};    // DisconnectPeers shut its socket: not a failure
  bool lending = false;                // a message of it is lent (guarded by the receiver's mu_)
  std::atomic<bool> finished{false};
  std::thread thread;
};

absl::StatusOr<std::unique_ptr<CudaIpcReceiver>> CudaIpcReceiver::Listen(const CudaIpcOptions& options) {
  int count = 0;
  if (absl::Status st = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !st.ok()) return st;
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC receiver: CUDA device ", options.device,
                                                   " does not exist (", count, " present)"));
  }
  std::string bound;
  absl::StatusOr<UniqueFd> fd = cuda_ipc::ListenUnix(options.socket_path, bound);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<CudaIpcReceiver> r(new CudaIpcReceiver(options, std::move(*fd), cuda_ipc::FormatEndpoint(bound)));
  r->accept_thread_ = std::thread([p = r.get()] { p->AcceptLoop(); });
  return r;
}

CudaIpcReceiver::CudaIpcReceiver(CudaIpcOptions options, UniqueFd listen_fd, std::string endpoint)
    : options_(std::move(options)),
      listen_fd_(std::move(listen_fd)),
      endpoint_(std::move(endpoint)),
      matcher_(TagMatcher::Options{options_.eager_bytes, options_.eager_limit_bytes, /*abort_stalled=*/false,
                                   /*wait_for_sessions=*/true}) {}

CudaIpcReceiver::~CudaIpcReceiver() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& p : peers_) shutdown(p->fd.get(), SHUT_RDWR);  // a blocked sender fails at once
  }
  { absl::MutexLock lock(&loan_mu_); }  // a peer waiting for a loan re-checks stopping_
  matcher_.Shutdown();
  accept_thread_.join();
  std::vector<std::unique_ptr<Peer>> peers;
  {
    absl::MutexLock lock(&mu_);
    peers.swap(peers_);
  }
  peers.clear();  // joins every peer thread; each unmapped its buffers
  if (!options_.socket_path.empty()) unlink(options_.socket_path.c_str());
}  // listen_fd_ closes last

int CudaIpcReceiver::connected() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& p : peers_) n += !p->finished;
  return n;
}

int CudaIpcReceiver::mapped() const {
  absl::MutexLock lock(&map_mu_);
  return static_cast<int>(mappings_.size());
}

void CudaIpcReceiver::AcceptLoop() {
  AcceptPeers<Peer>(
      listen_fd_.get(), stopping_, mu_, peers_, [](UniqueFd fd) { return std::make_unique<Peer>(std::move(fd)); },
      [this](Peer& p) { ServePeer(p); });
}

void CudaIpcReceiver::PeerFailed(Peer& peer, const absl::Status& status) {
  if (peer.dropped || stopping_) return;
  matcher_.PeerFailed(peer, status);
}

void CudaIpcReceiver::ServePeer(Peer& peer) {
  struct Finish {
    CudaIpcReceiver& r;
    Peer& p;
    ~Finish() {
      // Every copy out of the sender's buffers has completed (Deliver synchronizes): unmap them.
      std::vector<uint64_t> ids;
      for (const auto& [id, b] : p.buffers) ids.push_back(id);
      for (uint64_t id : ids) r.Forget(p, id);
      // Whatever ended the peer, its sender must notice: a blocked Send polls the socket.
      shutdown(p.fd.get(), SHUT_RDWR);
      p.finished = true;
    }
  } finish{*this, peer};
  cudaSetDevice(options_.device);
  auto stop = [this, &peer] { return stopping_.load() || peer.dropped.load(); };
  cuda_ipc::Hello hello;
  if (!cuda_ipc::ReadAll(peer.fd.get(), &hello, sizeof(hello), absl::Now() + absl::Seconds(10), stop).ok() ||
      hello.magic != cuda_ipc::kMagic || hello.name_bytes > cuda_ipc::kMaxNameBytes) {
    return;  // not a sender of ours
  }
  std::string name(hello.name_bytes, '\0');
  if (!cuda_ipc::ReadAll(peer.fd.get(), name.data(), name.size(), absl::Now() + absl::Seconds(10), stop).ok()) return;
  peer.name = absl::StrCat(name, " (GPU ", hello.device, ") at ", endpoint_);
  peer.same_process = hello.process_token == cuda_ipc::ProcessToken();
  absl::StatusOr<CudaStream> stream = CudaStream::Create(options_.device);
  if (!stream.ok()) return;  // the sender's handshake fails: no acknowledgement
  peer.stream = std::move(*stream);
  Reply ack;
  ack.kind = Reply::kHelloAck;
  ack.value = cuda_ipc::ProcessToken();
  if (!cuda_ipc::WriteAll(peer.fd.get(), &ack, sizeof(ack)).ok()) return;
  while (true) {
    Frame f;
    absl::Status st = cuda_ipc::ReadAll(peer.fd.get(), &f, sizeof(f), absl::InfiniteFuture(), stop);
    if (!st.ok()) {
      PeerFailed(peer, absl::UnavailableError(
                           absl::StrCat("CUDA IPC peer ", peer.name, " failed: connection closed without goodbye")));
      return;
    }
    if (f.magic != cuda_ipc::kMagic) {
      PeerFailed(peer, absl::UnavailableError(
                           absl::StrCat("CUDA IPC peer ", peer.name, " sent bytes that are not a frame")));
      return;
    }
    switch (f.kind) {
      case Frame::kExport:
        if (absl::Status e = Export(peer, f); !e.ok()) {
          PeerFailed(peer, e);
          return;
        }
        break;
      case Frame::kExportVmm:
        if (absl::Status e = ExportVmm(peer, f); !e.ok()) {
          PeerFailed(peer, e);
          return;
        }
        break;
      case Frame::kForget:
        Forget(peer, f.buffer_id);
        break;
      case Frame::kMessage:
        if (!Deliver(peer, f)) return;
        break;
      case Frame::kGoodbye: {
        Reply bye;
        bye.kind = Reply::kGoodbyeAck;
        (void)cuda_ipc::WriteAll(peer.fd.get(), &bye, sizeof(bye));
        return;
      }
      default:
        PeerFailed(peer, absl::UnavailableError(
                             absl::StrCat("CUDA IPC peer ", peer.name, " sent an unknown frame kind ", f.kind)));
        return;
    }
  }
}

absl::Status CudaIpcReceiver::Export(Peer& peer, const Frame& f) {
  if (f.buffer_id == 0 || peer.buffers.count(f.buffer_id) != 0 || peer.buffers.size() >= 2 * cuda_ipc::kMaxExports) {
    return absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, " exported buffer ", f.buffer_id,
                                               " twice, as 0, or past ", 2 * cuda_ipc::kMaxExports, " buffers"));
  }
  Peer::Buffer b;
  b.size = f.bytes;
  if (peer.same_process) {
    b.base = reinterpret_cast<uint8_t*>(f.address);
  } else {
    std::memcpy(b.key.data(), f.handle, b.key.size());
    absl::MutexLock lock(&map_mu_);
    auto it = mappings_.find(b.key);
    if (it == mappings_.end()) {
      cudaIpcMemHandle_t h;
      static_assert(sizeof(h) == cuda_ipc::kHandleBytes);
      std::memcpy(&h, f.handle, sizeof(h));
      void* base = nullptr;
      cudaSetDevice(options_.device);
      if (absl::Status st = CudaStatus(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
                                       absl::StrCat("CUDA IPC peer ", peer.name, ": cudaIpcOpenMemHandle of its buffer of ",
                                                    f.bytes, " bytes"));
          !st.ok()) {
        return st;
      }
      it = mappings_.emplace(b.key, Mapping{base, 0}).first;
    }
    ++it->second.refs;
    b.base = static_cast<uint8_t*>(it->second.base);
    b.mapped = true;
  }
  if (absl::StatusOr<PointerInfo> info = DefaultDeviceEnv().QueryPointer(b.base); info.ok()) {
    b.lendable = info->memory == PointerMemory::kDevice && info->device == options_.device;
  }
  peer.buffers.emplace(f.buffer_id, b);
  return absl::OkStatus();
}

absl::Status CudaIpcReceiver::ExportVmm(Peer& peer, const Frame& f) {
  if (f.buffer_id == 0 || peer.buffers.count(f.buffer_id) != 0 || peer.buffers.size() >= 2 * cuda_ipc::kMaxExports ||
      f.pieces == 0 || f.pieces > cuda_ipc::kMaxVmmPieces) {
    return absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, " exported virtual-memory buffer ", f.buffer_id,
                                               " twice, as 0, past ", 2 * cuda_ipc::kMaxExports, " buffers, or in ",
                                               f.pieces, " pieces"));
  }
  std::vector<uint64_t> sizes(f.pieces);
  std::vector<UniqueFd> fds;
  if (absl::Status st = cuda_ipc::RecvWithFds(peer.fd.get(), sizes.data(), sizes.size() * sizeof(uint64_t), fds,
                                              absl::Now() + absl::Seconds(10));
      !st.ok()) {
    return absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, ": its virtual-memory pieces: ", st.message()));
  }
  uint64_t total = 0;
  std::vector<storage::VmmImport::Piece> pieces;
  for (size_t i = 0; i < sizes.size() && i < fds.size(); ++i) {
    pieces.push_back({fds[i].get(), sizes[i]});
    total += sizes[i];
  }
  if (fds.size() != sizes.size() || total != f.bytes) {
    return absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, " sent ", fds.size(), " descriptors for ",
                                               sizes.size(), " virtual-memory pieces of ", total, " bytes (frame: ",
                                               f.bytes, ")"));
  }
  cudaSetDevice(options_.device);
  absl::StatusOr<std::unique_ptr<storage::VmmImport>> imported = storage::VmmImport::Import(pieces, options_.device);
  if (!imported.ok()) {
    return absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, ": importing its virtual memory of ",
                                               f.bytes, " bytes: ", imported.status().message()));
  }
  Peer::Buffer b;
  b.size = f.bytes;
  b.base = (*imported)->address();
  b.vmm = std::move(*imported);
  b.lendable = true;  // imported onto this receiver's GPU
  peer.buffers.emplace(f.buffer_id, std::move(b));
  return absl::OkStatus();
}

void CudaIpcReceiver::Forget(Peer& peer, uint64_t buffer_id) {
  auto it = peer.buffers.find(buffer_id);
  if (it == peer.buffers.end()) return;
  if (it->second.mapped) {
    absl::MutexLock lock(&map_mu_);
    auto m = mappings_.find(it->second.key);
    if (m != mappings_.end() && --m->second.refs == 0) {
      cudaSetDevice(options_.device);
      cudaIpcCloseMemHandle(m->second.base);
      (void)cudaGetLastError();
      mappings_.erase(m);
    }
  }
  peer.buffers.erase(it);
}

bool CudaIpcReceiver::Deliver(Peer& peer, const Frame& f) {
  const uint64_t tag = f.tag;
  TracePoint("daemon.run_arrived", tag & 0xFFFFFFFFu);
  const uint64_t bytes = f.bytes;
  const uint8_t* src = nullptr;
  bool lendable = false;
  if (bytes > 0) {
    auto b = peer.buffers.find(f.buffer_id);
    if (b == peer.buffers.end() || f.offset > b->second.size || bytes > b->second.size - f.offset) {
      PeerFailed(peer, absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, " announced ", bytes,
                                                           " bytes at offset ", f.offset, " of buffer ", f.buffer_id,
                                                           ", which it did not export or which is smaller")));
      return false;
    }
    src = b->second.base + f.offset;
    lendable = b->second.lendable;
  }
  const TagMatcher::Arrival a = matcher_.Arrive(peer, tag, bytes, [&] {
    if (peer.dropped) return false;
    if (absl::Status st = cuda_ipc::CheckOpen(peer.fd.get(), peer.name); !st.ok()) {
      PeerFailed(peer, st);
      return false;
    }
    return true;
  });
  if (a.kind == TagMatcher::Arrival::kStop) return false;
  if (a.kind == TagMatcher::Arrival::kPost && a.lendable && lendable && !a.oversized) {
    // Not dropped yet (a peer dropped meanwhile is released by the copy path below, as before).
    bool lend = false;
    {
      absl::MutexLock lock(&mu_);
      if (!peer.dropped) lend = peer.lending = true;
    }
    if (lend) return Lend(peer, a, src, tag);
  }
  std::vector<uint8_t> host;
  absl::Status st;
  if (bytes > 0 && a.kind != TagMatcher::Arrival::kDrop && !a.oversized) {
    void* dst = a.dst;
    if (a.kind == TagMatcher::Arrival::kHold) {
      host.resize(bytes);
      dst = host.data();
    }
    cudaSetDevice(options_.device);
    st = CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, peer.stream.get()),
                    absl::StrCat("copy of ", bytes, " bytes out of the sender's buffer"));
    // The sender is released only once the copy has completed.
    if (st.ok()) st = CudaStatus(cudaStreamSynchronize(peer.stream.get()), "copy out of the sender's buffer");
  }
  if (st.ok()) {
    Reply released;
    released.kind = Reply::kReleased;
    released.value = tag;
    st = cuda_ipc::WriteAll(peer.fd.get(), &released, sizeof(released));
  }
  if (!st.ok() && !stopping_) {
    st = absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, " failed: ", st.message()));
    PeerFailed(peer, st);
  } else if (!st.ok()) {
    st = absl::CancelledError("CUDA IPC receiver shutting down");
  }
  matcher_.Complete(a, st, std::move(host));
  return st.ok();
}

bool CudaIpcReceiver::Lend(Peer& peer, const TagMatcher::Arrival& a, const uint8_t* src, uint64_t tag) {
  uint64_t loan = 0;
  {
    absl::MutexLock lock(&loan_mu_);
    loan = ++next_loan_;
  }
  matcher_.Complete(a, absl::OkStatus(), {}, TagMatcher::Loan{src, loan});
  // The sender stays blocked until the reader is done with its bytes.
  {
    absl::MutexLock lock(&loan_mu_);
    auto back = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loan_mu_) { return returned_.count(loan) != 0 || stopping_.load(); };
    loan_mu_.Await(absl::Condition(&back));
    returned_.erase(loan);
  }
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    peer.lending = false;
    dropped = peer.dropped;
  }
  if (dropped || stopping_) {
    // DisconnectPeers came while its bytes were lent: its socket is shut only now.
    shutdown(peer.fd.get(), SHUT_RDWR);
    return false;
  }
  Reply released;
  released.kind = Reply::kReleased;
  released.value = tag;
  if (absl::Status st = cuda_ipc::WriteAll(peer.fd.get(), &released, sizeof(released)); !st.ok()) {
    PeerFailed(peer, absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer.name, " failed: ", st.message())));
    return false;
  }
  return true;
}

absl::StatusOr<Receiver::Message> CudaIpcReceiver::ReceiveOrLend(uint64_t tag, void* dst, uint64_t capacity,
                                                                 absl::Time deadline) {
  cudaSetDevice(options_.device);
  TagMatcher::Loan loan;
  absl::StatusOr<uint64_t> n = matcher_.Receive(
      tag, dst, capacity, deadline,
      [](void* to, const void* from, uint64_t bytes) {
        return CudaStatus(cudaMemcpy(to, from, bytes, cudaMemcpyDefault), "eager delivery");
      },
      &loan);
  if (!n.ok()) return n.status();
  if (loan.id == 0) return Message{static_cast<const uint8_t*>(dst), *n, 0};
  return Message{static_cast<const uint8_t*>(loan.data), *n, loan.id};
}

void CudaIpcReceiver::GiveBack(uint64_t loan) {
  if (loan == 0) return;
  absl::MutexLock lock(&loan_mu_);
  returned_.insert(loan);
}

absl::StatusOr<uint64_t> CudaIpcReceiver::Receive(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) {
  cudaSetDevice(options_.device);
  return matcher_.Receive(tag, dst, capacity, deadline, [](void* to, const void* from, uint64_t bytes) {
    return CudaStatus(cudaMemcpy(to, from, bytes, cudaMemcpyDefault), "eager delivery");
  });
}

void CudaIpcReceiver::Cancel() { matcher_.Cancel(); }

void CudaIpcReceiver::Reset() { matcher_.Reset(); }

void CudaIpcReceiver::EndSession(uint64_t session_id) { matcher_.EndSession(session_id); }

void CudaIpcReceiver::DisconnectPeers() {
  absl::MutexLock lock(&mu_);
  for (auto& p : peers_) {
    p->dropped = true;
    // A sender whose bytes are lent stays blocked until they are given back (Lend shuts it then).
    if (!p->lending) shutdown(p->fd.get(), SHUT_RDWR);
  }
}

}  // namespace refit::transport
