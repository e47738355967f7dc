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

namespace refit::transport {

using nccl::CheckIdle;
using nccl::Communicator;
using nccl::CudaStatus;
using nccl::DeviceBuffer;
using nccl::Frame;

struct NcclReceiver::Peer {
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
  std::atomic<bool> abort_requested{false};  // a Receive's deadline passed mid-message
  uint64_t active_in = UINT64_MAX;  // generation_ of its last delivery (guarded by the receiver's mu_)
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
    : options_(std::move(options)), listen_fd_(std::move(listen_fd)), endpoint_(std::move(endpoint)) {}

NcclReceiver::~NcclReceiver() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    stopping_ = true;
  }
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
  while (!stopping_) {
    pollfd pfd{listen_fd_.get(), POLLIN, 0};
    int rc = poll(&pfd, 1, 100);
    std::vector<std::unique_ptr<Peer>> done;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = peers_.begin(); it != peers_.end();) {
        if ((*it)->finished) {
          done.push_back(std::move(*it));
          it = peers_.erase(it);
        } else {
          ++it;
        }
      }
    }
    done.clear();
    if (rc <= 0 || stopping_) continue;
    UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto peer = std::make_unique<Peer>(std::move(fd), options_.device);
    Peer* p = peer.get();
    {
      absl::MutexLock lock(&mu_);
      peers_.push_back(std::move(peer));
    }
    p->thread = std::thread([this, p] { ServePeer(*p); });
  }
}

void NcclReceiver::PeerFailed(Peer& peer, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok() && peer.active_in == generation_) failure_ = status;
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
  } else {
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
      PeerFailed(peer, absl::UnavailableError(msg));
      return;
    }
    if (f.flags & Frame::kGoodbye) {
      (void)nccl::WriteAll(peer.fd.get(), "A", 1);
      return;
    }
    if (!Deliver(peer, f.tag, f.bytes)) return;
  }
}

std::list<NcclReceiver::Post*>::iterator NcclReceiver::FindPost(uint64_t tag) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->tag == tag && !(*it)->claimed) return it;
  }
  return posted_.end();
}

bool NcclReceiver::Deliver(Peer& peer, uint64_t tag, uint64_t bytes) {
  Post* post = nullptr;
  Held* held = nullptr;
  bool drop = false;  // nobody will receive it: its session ended
  uint64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    epoch = epoch_;
  }
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto queued = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto it = eager_.find(tag);
        return it != eager_.end() && !it->second.empty();
      };
      auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return bytes <= options_.eager_bytes && eager_held_ + bytes <= options_.eager_limit_bytes;
      };
      auto matched = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queued() && FindPost(tag) != posted_.end(); };
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ || matched() || fits(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(20));
      if (shutdown_) return false;
      if (!matched() && !fits() && (cancelled_ || epoch_ != epoch)) {
        drop = true;
        break;
      }
      if (matched()) {
        auto it = FindPost(tag);
        post = *it;
        post->claimed = true;
        post->owner = &peer;
        posted_.erase(it);
        peer.active_in = generation_;
        break;
      }
      if (fits()) {
        eager_held_ += bytes;
        eager_[tag].push_back(Held{&peer, bytes, false, absl::OkStatus(), {}});
        held = &eager_[tag].back();
        peer.active_in = generation_;
        break;
      }
    }
    if (absl::Status st = CheckIdle(peer.fd.get(), peer.name); !st.ok()) {
      PeerFailed(peer, st);
      return false;
    }
  }
  const bool oversized = post != nullptr && bytes > post->capacity;
  const bool direct = post != nullptr && !oversized && nccl::IsDeviceMemoryOf(post->dst, options_.device);
  std::vector<uint8_t> host;
  absl::Status st;
  if (bytes > 0) {
    absl::StatusOr<void*> buf = direct ? absl::StatusOr<void*>(post->dst) : peer.bounce.Reserve(bytes, peer.stream->get());
    st = buf.status();
    if (st.ok()) st = peer.ReceiveBytes(*buf, bytes);
    if (st.ok()) st = peer.comm->Wait(peer.stream->get(), absl::InfiniteFuture(), peer.interrupt);
    if (st.ok() && held != nullptr) {
      host.resize(bytes);
      st = CudaStatus(cudaMemcpy(host.data(), *buf, bytes, cudaMemcpyDeviceToHost), "eager copy");
    } else if (st.ok() && drop) {
      // received into the bounce buffer and dropped
    } else if (st.ok() && post != nullptr && !direct && !oversized) {
      st = CudaStatus(cudaMemcpy(post->dst, *buf, bytes, cudaMemcpyDefault), "copy into the receive buffer");
    }
  }
  if (!st.ok() && !stopping_) {
    std::string msg(st.message());
    if (msg.rfind("NCCL peer ", 0) != 0) msg = absl::StrCat("NCCL peer ", peer.name, " failed: ", msg);
    st = absl::UnavailableError(msg);
    PeerFailed(peer, st);
  } else if (!st.ok()) {
    st = absl::CancelledError("NCCL receiver shutting down");
  }
  absl::MutexLock lock(&mu_);
  if (drop) return st.ok();
  if (held != nullptr) {
    held->status = st;
    held->data = std::move(host);
    held->ready = true;
  } else {
    if (!st.ok()) {
      post->result = st;
    } else if (oversized) {
      post->result = absl::InvalidArgumentError(absl::StrCat("message of ", bytes, " bytes on tag ", tag,
                                                             " exceeds the receive buffer of ", post->capacity,
                                                             " bytes; dropped"));
    } else {
      post->result = bytes;
    }
    post->done = true;
  }
  return st.ok();
}

absl::StatusOr<uint64_t> NcclReceiver::Receive(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) {
  cudaSetDevice(options_.device);
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("receive cancelled");
  if (!failure_.ok()) return failure_;
  if (auto it = eager_.find(tag); it != eager_.end() && !it->second.empty()) {
    // The tag's oldest message is held (or on its way into host memory: wait for it; past the
    // deadline its sender stalled mid-message and is aborted).
    Held* front = &it->second.front();
    if (!mu_.AwaitWithDeadline(absl::Condition(&front->ready), deadline)) {
      front->owner->abort_requested = true;
      mu_.Await(absl::Condition(&front->ready));
    }
    Held message = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) eager_.erase(it);
    eager_held_ -= message.bytes;
    if (!message.status.ok()) return message.status;
    if (message.bytes > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("message of ", message.bytes, " bytes on tag ", tag,
                                                     " exceeds the receive buffer of ", capacity, " bytes; dropped"));
    }
    if (message.bytes > 0) {
      absl::Status st = CudaStatus(cudaMemcpy(dst, message.data.data(), message.bytes, cudaMemcpyDefault), "eager delivery");
      if (!st.ok()) return st;
    }
    return message.bytes;
  }
  if (absl::Now() >= deadline) return absl::DeadlineExceededError(absl::StrCat("no message on tag ", tag, " before the deadline"));
  Post post{tag, dst, capacity};
  posted_.push_back(&post);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return post.done || (!post.claimed && (cancelled_ || !failure_.ok() || shutdown_));
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (!post.claimed) {
    posted_.remove(&post);
    if (cancelled_ || shutdown_) return absl::CancelledError("receive cancelled");
    if (!failure_.ok()) return failure_;
    return absl::DeadlineExceededError(absl::StrCat("no message on tag ", tag, " before the deadline"));
  }
  // The message is being written into dst: wait for it. Past the deadline the sender has
  // stalled mid-message; its communicator is aborted, which ends the write.
  if (!mu_.AwaitWithDeadline(absl::Condition(&post.done), deadline)) {
    post.owner->abort_requested = true;
    mu_.Await(absl::Condition(&post.done));
    if (post.result.ok()) return post.result;
    return absl::DeadlineExceededError(absl::StrCat("message on tag ", tag, " still incomplete at the deadline: ",
                                                    post.result.status().message()));
  }
  return post.result;
}

void NcclReceiver::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  ++epoch_;
}

void NcclReceiver::Reset() {
  absl::MutexLock lock(&mu_);
  cancelled_ = false;
  failure_ = absl::OkStatus();
  ++generation_;
  ++epoch_;
}

}  // namespace refit::transport
