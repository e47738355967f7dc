#include "transport/nccl/nccl_receiver.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/nccl/nccl_handles.h"
#include "transport/nccl/nccl_wire.h"
#include "transport/peer_threads.h"

namespace refit::transport {

using nccl::CheckIdle;
using nccl::Communicator;
using nccl::CudaStatus;
using nccl::DeviceBuffer;
using nccl::Frame;

struct NcclReceiver::Peer : TagMatcher::Sender {
  explicit Peer(UniqueFd fd_in, int device) : fd(std::move(fd_in)), bounce(device) {}
  ~Peer() {
    if (thread.joinable()) thread.join();
    comm.reset();
    stream.reset();
  }  // the socket closes last
  const UniqueFd fd;
  std::string name = "(connecting)";
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<nccl::Stream> stream;
  DeviceBuffer bounce;
  nccl::Interrupt interrupt;
  std::atomic<bool> ready{false};
  std::atomic<bool> finished{false};
  std::thread thread;
  // A point-to-point sender is rank 1 of a two-rank communicator (this receiver rank 0); a fan-out
  // group's sender is rank 0 and broadcasts to every receiver of the group (this one `rank`).
  int nranks = 2;
  int rank = 0;
  bool group() const { return rank != 0; }
  // Enqueues the receipt of the sender's next `bytes` into buf.
  absl::Status ReceiveBytes(void* buf, uint64_t bytes) {
    return group() ? comm->Broadcast(buf, bytes, 0, stream->get()) : comm->Recv(buf, bytes, 1, stream->get());
  }
};

absl::StatusOr<std::unique_ptr<NcclReceiver>> NcclReceiver::Listen(const NcclOptions& options) {
  int count = 0;
  if (absl::Status st = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !st.ok()) return st;
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL receiver: CUDA device ", options.device, " does not exist (",
                                                   count, " present)"));
  }
  uint16_t port = 0;
  absl::StatusOr<UniqueFd> fd = nccl::ListenTcp(options.listen_host, options.listen_port, port);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<NcclReceiver> r(
      new NcclReceiver(options, std::move(*fd), nccl::FormatEndpoint(options.listen_host, port)));
  r->accept_thread_ = std::thread([p = r.get()] { p->AcceptLoop(); });
  return r;
}

NcclReceiver::NcclReceiver(NcclOptions options, UniqueFd listen_fd, std::string endpoint)
    : options_(std::move(options)),
      listen_fd_(std::move(listen_fd)),
      endpoint_(std::move(endpoint)),
      matcher_(TagMatcher::Options{options_.eager_bytes, options_.eager_limit_bytes, /*abort_stalled=*/true}) {}

NcclReceiver::~NcclReceiver() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  matcher_.Shutdown();
  accept_thread_.join();
  std::vector<std::unique_ptr<Peer>> peers;
  {
    absl::MutexLock lock(&mu_);
    peers.swap(peers_);
  }
  peers.clear();  // joins every progress thread; their communicators are aborted
}  // listen_fd_ closes last

int NcclReceiver::connected() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& p : peers_) n += p->ready && !p->finished;
  return n;
}

void NcclReceiver::AcceptLoop() {
  AcceptPeers<Peer>(
      listen_fd_.get(), stopping_, mu_, peers_,
      [this](UniqueFd fd) {
        int one = 1;
        setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return std::make_unique<Peer>(std::move(fd), options_.device);
      },
      [this](Peer& p) { ServePeer(p); });
}

void NcclReceiver::ServePeer(Peer& peer) {
  struct Finish {
    Peer& p;
    ~Finish() {
      // Whatever ended the peer, its sender must notice: a blocked Send polls the socket.
      p.comm.reset();
      shutdown(p.fd.get(), SHUT_RDWR);
      p.finished = true;
    }
  } finish{peer};
  cudaSetDevice(options_.device);
  nccl::Hello hello;
  if (!nccl::ReadAll(peer.fd.get(), &hello, sizeof(hello), absl::Now() + absl::Seconds(10)).ok() ||
      (hello.magic != nccl::Hello::kMagic && hello.magic != nccl::Hello::kGroupMagic) || hello.name_bytes > 1024) {
    return;  // not a sender of ours
  }
  std::string name(hello.name_bytes, '\0');
  if (!nccl::ReadAll(peer.fd.get(), name.data(), name.size(), absl::Now() + absl::Seconds(10)).ok()) return;
  peer.name = absl::StrCat(name, " at ", endpoint_);
  ncclUniqueId id;
  if (hello.magic == nccl::Hello::kGroupMagic) {
    // A fan-out group: the sender made the unique id and is rank 0; this receiver is one of the
    // group's other ranks and receives every message by broadcast.
    nccl::GroupJoin join;
    if (!nccl::ReadAll(peer.fd.get(), &join, sizeof(join), absl::Now() + absl::Seconds(10)).ok() || join.nranks < 2 ||
        join.nranks > nccl::kMaxGroupRanks || join.rank < 1 || join.rank >= join.nranks) {
      return;
    }
    static_assert(sizeof(id) == sizeof(join.unique_id));
    std::memcpy(&id, join.unique_id, sizeof(id));
    peer.nranks = join.nranks;
    peer.rank = join.rank;
    peer.name = absl::StrCat(peer.name, " (fan-out rank ", join.rank, " of ", join.nranks, ")");
  }
  // The sender names the mismatch in its error (which reaches the session's abort reason).
  if (!nccl::AnswerNcclVersion(peer.fd.get(), hello.nccl_version).ok()) return;
  if (hello.magic != nccl::Hello::kGroupMagic) {
    if (!nccl::NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId").ok()) return;
    if (!nccl::WriteAll(peer.fd.get(), &id, sizeof(id)).ok()) return;
  }
  peer.interrupt = [this, &peer]() -> absl::Status {
    if (stopping_) return absl::CancelledError("NCCL receiver shutting down");
    if (peer.abort_requested) {
      return absl::DeadlineExceededError(absl::StrCat("NCCL peer ", peer.name, " stalled mid-message past the deadline; communicator aborted"));
    }
    return CheckIdle(peer.fd.get(), peer.name);
  };
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Init(
      options_.device, id, peer.nranks, peer.rank, absl::Now() + options_.connect_timeout, peer.interrupt);
  if (!comm.ok()) return;
  peer.comm = std::move(*comm);
  absl::StatusOr<std::unique_ptr<nccl::Stream>> stream = nccl::Stream::Create(options_.device);
  if (!stream.ok()) return;
  peer.stream = std::move(*stream);
  peer.ready = true;
  while (true) {
    Frame f;
    absl::Status st = nccl::AwaitFrame(peer.fd.get(), peer.name, [this] { return stopping_.load(); }, f);
    if (!st.ok()) {
      if (stopping_) return;
      std::string msg(st.message());
      if (msg.rfind("NCCL peer ", 0) != 0) msg = absl::StrCat("NCCL peer ", peer.name, " failed: ", msg);
      matcher_.PeerFailed(peer, absl::UnavailableError(msg));
      return;
    }
    if (f.flags & Frame::kGoodbye) {
      (void)nccl::WriteAll(peer.fd.get(), "A", 1);
      return;
    }
    if (!Deliver(peer, f.tag, f.bytes)) return;
  }
}

bool NcclReceiver::Deliver(Peer& peer, uint64_t tag, uint64_t bytes) {
  const TagMatcher::Arrival a = matcher_.Arrive(peer, tag, bytes, [&] {
    if (absl::Status st = CheckIdle(peer.fd.get(), peer.name); !st.ok()) {
      matcher_.PeerFailed(peer, st);
      return false;
    }
    return true;
  });
  if (a.kind == TagMatcher::Arrival::kStop) return false;
  const bool post = a.kind == TagMatcher::Arrival::kPost;
  const bool direct = post && !a.oversized && nccl::IsDeviceMemoryOf(a.dst, options_.device);
  std::vector<uint8_t> host;
  absl::Status st;
  if (bytes > 0) {
    absl::StatusOr<void*> buf = direct ? absl::StatusOr<void*>(a.dst) : peer.bounce.Reserve(bytes, peer.stream->get());
    st = buf.status();
    if (st.ok()) st = peer.ReceiveBytes(*buf, bytes);
    if (st.ok()) st = peer.comm->Wait(peer.stream->get(), absl::InfiniteFuture(), peer.interrupt);
    if (st.ok() && a.kind == TagMatcher::Arrival::kHold) {
      host.resize(bytes);
      st = CudaStatus(cudaMemcpy(host.data(), *buf, bytes, cudaMemcpyDeviceToHost), "eager copy");
    } else if (st.ok() && a.kind == TagMatcher::Arrival::kDrop) {
      // received into the bounce buffer and dropped
    } else if (st.ok() && post && !direct && !a.oversized) {
      st = CudaStatus(cudaMemcpy(a.dst, *buf, bytes, cudaMemcpyDefault), "copy into the receive buffer");
    }
  }
  if (!st.ok() && !stopping_) {
    std::string msg(st.message());
    if (msg.rfind("NCCL peer ", 0) != 0) msg = absl::StrCat("NCCL peer ", peer.name, " failed: ", msg);
    st = absl::UnavailableError(msg);
    matcher_.PeerFailed(peer, st);
  } else if (!st.ok()) {
    st = absl::CancelledError("NCCL receiver shutting down");
  }
  matcher_.Complete(a, st, std::move(host));
  return st.ok();
}

absl::StatusOr<uint64_t> NcclReceiver::Receive(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) {
  cudaSetDevice(options_.device);
  return matcher_.Receive(tag, dst, capacity, deadline, [](void* to, const void* from, uint64_t bytes) {
    return CudaStatus(cudaMemcpy(to, from, bytes, cudaMemcpyDefault), "eager delivery");
  });
}

void NcclReceiver::Cancel() { matcher_.Cancel(); }

void NcclReceiver::Reset() { matcher_.Reset(); }

}  // namespace refit::transport
