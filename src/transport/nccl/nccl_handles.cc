#include "transport/nccl/nccl_handles.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda_status.h"
#include "common/device_env.h"
#include "common/hot_wait.h"

namespace refit::transport::nccl {

absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  // The project's helper, re-coded at this seam: a transport reports its failures as Unavailable.
  absl::Status st = ::refit::CudaStatus(e, what);
  return st.ok() ? st : absl::UnavailableError(st.message());
}

absl::Status NcclStatus(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ")"));
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Create(int device) {
  if (absl::Status st = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")); !st.ok()) return st;
  cudaStream_t s = nullptr;
  if (absl::Status st = CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); !st.ok()) {
    return st;
  }
  return std::unique_ptr<Stream>(new Stream(device, s));
}

Stream::~Stream() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) {
    cudaSetDevice(device_);
    cudaFreeAsync(data_, nullptr);  // no longer used by any stream; no device-wide wait
  }
}

absl::StatusOr<void*> DeviceBuffer::Reserve(uint64_t bytes, cudaStream_t stream) {
  if (bytes <= size_ && data_ != nullptr) return data_;
  cudaSetDevice(device_);
  if (data_ != nullptr) cudaFreeAsync(data_, stream);
  data_ = nullptr;
  uint64_t want = std::max<uint64_t>({bytes, 2 * size_, 4096});
  size_ = 0;
  if (absl::Status st = CudaStatus(cudaMallocAsync(&data_, want, stream), absl::StrCat("cudaMallocAsync(", want, ")"));
      !st.ok()) {
    data_ = nullptr;
    return st;
  }
  size_ = want;
  return data_;
}

bool IsDeviceMemoryOf(const void* p, int device) {
  absl::StatusOr<PointerInfo> info = DefaultDeviceEnv().QueryPointer(p);
  return info.ok() && info->memory == PointerMemory::kDevice && info->device == device;
}

absl::StatusOr<const void*> OnDevice(const void* payload, uint64_t bytes, DeviceBuffer& bounce, cudaStream_t stream) {
  if (bytes == 0 || IsDeviceMemoryOf(payload, bounce.device())) return payload;
  absl::StatusOr<void*> copy = bounce.Reserve(bytes, stream);
  if (!copy.ok()) return copy.status();
  if (absl::Status st = CudaStatus(cudaMemcpyAsync(*copy, payload, bytes, cudaMemcpyDefault, stream), "payload copy");
      !st.ok()) {
    return st;
  }
  return static_cast<const void*>(*copy);
}

int32_t LoadedNcclVersion() {
  int version = 0;
  ncclGetVersion(&version);
  return version;
}

std::string NcclVersionText(int32_t code) {
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z from 2.9 on; X * 1000 + Y * 100 + Z before.
  if (code >= 20900) return absl::StrCat(code / 10000, ".", code / 100 % 100, ".", code % 100);
  return absl::StrCat(code / 1000, ".", code / 100 % 10, ".", code % 100);
}

std::string LoadedNcclLibrary() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

absl::Status SameNcclVersion(int32_t mine, int32_t theirs, absl::string_view peer) {
  if (mine == theirs) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "NCCL version mismatch with ", peer, ": this process runs NCCL ", NcclVersionText(mine), " (",
      LoadedNcclLibrary(), "), the peer runs NCCL ", NcclVersionText(theirs),
      "; NCCL connects only processes of the same version: give refitd the trainer's libnccl.so.2 "
      "(LD_LIBRARY_PATH ahead of the copy the package carries, docs/operations.md \"NCCL version\") or build "
      "the trainer against refitd's"));
}

absl::Status AnswerNcclVersion(int fd, int32_t sender_version) {
  const int32_t mine = LoadedNcclVersion();
  if (absl::Status st = WriteAll(fd, &mine, sizeof(mine)); !st.ok()) return st;
  return SameNcclVersion(mine, sender_version, "the sender");
}

absl::Status AwaitNcclVersion(int fd, absl::string_view peer, absl::Time deadline) {
  int32_t theirs = 0;
  if (absl::Status st = ReadAll(fd, &theirs, sizeof(theirs), deadline); !st.ok()) return st;
  return SameNcclVersion(LoadedNcclVersion(), theirs, peer);
}

std::string SenderName(const std::string& configured) {
  if (!configured.empty()) return configured;
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  return absl::StrCat(hostname, ":", getpid());
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Init(int device, const ncclUniqueId& id, int nranks,
                                                                 int rank, absl::Time deadline,
                                                                 const Interrupt& interrupt) {
  if (absl::Status st = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")); !st.ok()) return st;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclStatus(r, "ncclCommInitRankConfig");
  }
  std::unique_ptr<Communicator> c(new Communicator(device, comm));
  if (absl::Status st = c->Wait(nullptr, deadline, interrupt); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("NCCL communicator setup (rank ", rank, " of ", nranks, "): ", st.message()));
  }
  return c;
}

Communicator::~Communicator() { Abort(); }

void Communicator::Abort() {
  if (comm_ == nullptr) return;
  cudaSetDevice(device_);
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

absl::Status Communicator::AfterEnqueue(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  if (r != ncclInProgress) {
    Abort();
    return NcclStatus(r, what);
  }
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      Abort();
      return NcclStatus(state, what);
    }
    std::this_thread::yield();
  }
}

absl::Status Communicator::Send(const void* buf, uint64_t bytes, int peer, cudaStream_t stream) {
  if (comm_ == nullptr) return absl::UnavailableError("NCCL communicator was aborted");
  cudaSetDevice(device_);
  return AfterEnqueue(ncclSend(buf, bytes, ncclUint8, peer, comm_, stream), "ncclSend");
}

absl::Status Communicator::Recv(void* buf, uint64_t bytes, int peer, cudaStream_t stream) {
  if (comm_ == nullptr) return absl::UnavailableError("NCCL communicator was aborted");
  cudaSetDevice(device_);
  return AfterEnqueue(ncclRecv(buf, bytes, ncclUint8, peer, comm_, stream), "ncclRecv");
}

absl::Status Communicator::Broadcast(void* buf, uint64_t bytes, int root, cudaStream_t stream) {
  if (comm_ == nullptr) return absl::UnavailableError("NCCL communicator was aborted");
  cudaSetDevice(device_);
  return AfterEnqueue(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream), "ncclBroadcast");
}

absl::Status Communicator::Wait(cudaStream_t stream, absl::Time deadline, const Interrupt& interrupt) {
  if (comm_ == nullptr) return absl::UnavailableError("NCCL communicator was aborted");
  cudaSetDevice(device_);
  absl::Status failure;
  for (uint64_t spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      failure = NcclStatus(state, "NCCL");
      break;
    }
    if (state == ncclSuccess) {
      if (stream == nullptr) return absl::OkStatus();
      cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        failure = CudaStatus(q, "stream");
        break;
      }
    }
    if (spins % 64 == 0) {
      if (interrupt) {
        if (absl::Status st = interrupt(); !st.ok()) {
          failure = st;
          break;
        }
      }
      if (absl::Now() >= deadline) {
        failure = absl::DeadlineExceededError("deadline passed waiting for NCCL");
        break;
      }
    }
    // Spin briefly (a bucket completes in milliseconds), then sleep between polls.
    if (spins < 200000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  Abort();
  if (stream != nullptr) cudaStreamSynchronize(stream);  // aborted kernels exit; nothing writes after this
  return failure;
}

// ---- rendezvous sockets ----

absl::StatusOr<UniqueFd> ListenTcp(const std::string& host, uint16_t port, uint16_t& bound_port) {
  UniqueFd owner(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int fd = owner.get();
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL listen_host '", host, "' is not an IPv4 address"));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  bound_port = ntohs(addr.sin_port);
  return owner;
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  UniqueFd owner(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int fd = owner.get();
  int rc = fd < 0 ? -1 : connect(fd, res->ai_addr, res->ai_addrlen);
  std::string err = std::strerror(errno);
  freeaddrinfo(res);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to NCCL endpoint ", host, ":", port, ": ", err));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return owner;
}

absl::Status WriteAll(int fd, const void* data, uint64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("rendezvous socket: ", std::strerror(errno)));
    p += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, uint64_t bytes, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("timed out on the rendezvous socket");
    pollfd pfd{fd, POLLIN, 0};
    int rc = HotPoll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) continue;
    ssize_t n = recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return absl::UnavailableError("rendezvous socket closed by the peer");
    if (n < 0) return absl::UnavailableError(absl::StrCat("rendezvous socket: ", std::strerror(errno)));
    p += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status CheckIdle(int fd, absl::string_view peer) {
  pollfd pfd{fd, POLLRDHUP, 0};
  int rc = poll(&pfd, 1, 0);
  if (rc <= 0 || (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("NCCL peer ", peer, " failed: connection closed without goodbye"));
}

absl::Status AwaitFrame(int fd, absl::string_view peer, const std::function<bool()>& stop, Frame& frame) {
  while (true) {
    if (stop()) return absl::CancelledError("stopping");
    pollfd pfd{fd, POLLIN | POLLRDHUP, 0};
    int rc = HotPoll(&pfd, 1, 100);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char* out = reinterpret_cast<char*>(&frame);
    ssize_t n = recv(fd, out, sizeof(frame), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("NCCL peer ", peer, " failed: connection closed without goodbye"));
    // The rest of a frame whose first bytes arrived follows at once (or the peer died).
    if (static_cast<size_t>(n) < sizeof(frame)) {
      absl::Status st = ReadAll(fd, out + n, sizeof(frame) - static_cast<size_t>(n), absl::Now() + absl::Seconds(10));
      if (!st.ok()) return absl::UnavailableError(absl::StrCat("NCCL peer ", peer, " failed mid-frame: ", st.message()));
    }
    if (frame.magic != Frame::kMagic) {
      return absl::DataLossError(absl::StrCat("NCCL peer ", peer, " sent bytes that are not a frame on the rendezvous socket"));
    }
    return absl::OkStatus();
  }
}

std::string FormatEndpoint(const std::string& host, uint16_t port) { return absl::StrCat("nccl:", host, ":", port); }

absl::Status ParseEndpoint(const std::string& endpoint, std::string& host, uint16_t& port) {
  const std::string kPrefix = "nccl:";
  size_t colon = endpoint.rfind(':');
  uint32_t p = 0;
  if (endpoint.rfind(kPrefix, 0) != 0 || colon == std::string::npos || colon < kPrefix.size() + 1 ||
      !absl::SimpleAtoi(absl::string_view(endpoint).substr(colon + 1), &p) || p == 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", endpoint, "' is not an NCCL endpoint (nccl:<host>:<port>)"));
  }
  host = endpoint.substr(kPrefix.size(), colon - kPrefix.size());
  port = static_cast<uint16_t>(p);
  return absl::OkStatus();
}

}  // namespace refit::transport::nccl
