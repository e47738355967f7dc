#include "transport/cuda_ipc/cuda_ipc_handles.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda_status.h"
#include "common/cuda_vmm.h"
#include "common/device_env.h"
#include "common/hot_wait.h"
#include "transport/cuda_ipc/cuda_ipc_wire.h"

namespace refit::transport::cuda_ipc {
namespace {

constexpr char kPrefix[] = "cuda_ipc:";
constexpr size_t kPrefixBytes = sizeof(kPrefix) - 1;

absl::StatusOr<std::pair<sockaddr_un, socklen_t>> Address(const std::string& socket) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.empty() || socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC socket name '", socket, "' is empty or longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, socket.data(), socket.size());
  if (socket[0] == '@') addr.sun_path[0] = '\0';  // the abstract namespace
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket.size() +
                                               (socket[0] == '@' ? 0 : 1));
  return std::make_pair(addr, len);
}

}  // namespace

absl::Status CudaStatus(int cuda_error, absl::string_view what) {
  absl::Status st = ::refit::CudaStatus(cuda_error, what);
  return st.ok() ? st : absl::UnavailableError(st.message());
}

uint64_t ProcessToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    uint64_t t = 0;
    while (t == 0) t = (uint64_t{rd()} << 32) ^ rd();
    return t;
  }();
  return token;
}

std::string FormatEndpoint(const std::string& socket) { return absl::StrCat(kPrefix, socket); }

absl::StatusOr<std::string> ParseEndpoint(const std::string& endpoint) {
  if (endpoint.rfind(kPrefix, 0) != 0 || endpoint.size() == kPrefixBytes) {
    return absl::InvalidArgumentError(absl::StrCat("'", endpoint, "' is not a CUDA IPC endpoint (cuda_ipc:<socket>)"));
  }
  return endpoint.substr(kPrefixBytes);
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, std::string& bound) {
  std::string name = path;
  if (name.empty()) {
    std::random_device rd;
    name = absl::StrCat("@refitd-cuda-ipc-", getpid(), "-", absl::Hex((uint64_t{rd()} << 32) ^ rd()));
  }
  absl::StatusOr<std::pair<sockaddr_un, socklen_t>> addr = Address(name);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  if (name[0] != '@') {
    struct stat st{};
    if (lstat(name.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(name.c_str());  // a stale socket
  }
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind the CUDA IPC socket '", name, "': ", std::strerror(errno)));
  }
  if (name[0] != '@') chmod(name.c_str(), 0600);
  if (listen(fd.get(), 64) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", name, "': ", std::strerror(errno)));
  }
  bound = name;
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& socket_name) {
  absl::StatusOr<std::pair<sockaddr_un, socklen_t>> addr = Address(socket_name);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  while (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0) {
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("cannot connect to the CUDA IPC socket '", socket_name, "': ",
                                               std::strerror(errno)));
  }
  return fd;
}

absl::Status WriteAll(int fd, const void* data, uint64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("CUDA IPC control socket: ", std::strerror(errno)));
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, uint64_t bytes, absl::Time deadline, const std::function<bool()>& stop) {
  char* p = static_cast<char*>(data);
  bool started = false;
  while (bytes > 0) {
    if (!started && stop && stop()) return absl::CancelledError("stopping");
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (deadline != absl::InfiniteFuture() && ms <= 0) {
      return absl::DeadlineExceededError("timed out on the CUDA IPC control socket");
    }
    pollfd pfd{fd, POLLIN, 0};
    int rc = HotPoll(&pfd, 1, static_cast<int>(std::clamp<int64_t>(ms, 0, 100)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) continue;
    ssize_t n = recv(fd, p, bytes, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) return absl::UnavailableError("connection closed by the peer");
    if (n < 0) return absl::UnavailableError(absl::StrCat("CUDA IPC control socket: ", std::strerror(errno)));
    started = true;
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status CheckOpen(int fd, absl::string_view peer) {
  pollfd pfd{fd, POLLRDHUP, 0};
  int rc = poll(&pfd, 1, 0);
  if (rc <= 0 || (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("CUDA IPC peer ", peer, " failed: connection closed without goodbye"));
}

absl::StatusOr<Allocation> QueryAllocation(const void* p) { return DefaultDeviceEnv().QueryAllocation(p); }

namespace {

// The piece mapped at `p` (its mapping's base and size), exported; fd < 0 when it cannot be.
VmmPiece ExportPiece(const CudaVmmDriver& d, uint64_t p) {
  VmmPiece piece;
  CUmemGenericAllocationHandle h;
  if (d.retain(&h, reinterpret_cast<void*>(p)) != CUDA_SUCCESS) return piece;
  CUmemAllocationProp prop{};
  CUdeviceptr base = 0;
  size_t size = 0;
  int fd = -1;
  absl::StatusOr<Allocation> a = QueryAllocation(reinterpret_cast<const void*>(p));
  if (a.ok() && a->device && d.properties(&prop, h) == CUDA_SUCCESS &&
      (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0 &&
      d.address_range(&base, &size, static_cast<CUdeviceptr>(p)) == CUDA_SUCCESS &&
      d.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS) {
    piece.base = static_cast<uint64_t>(base);
    piece.size = static_cast<uint64_t>(size);
    piece.buffer_id = a->buffer_id;
    piece.fd = UniqueFd(fd);
  }
  d.release(h);
  return piece;
}

}  // namespace

std::vector<VmmPiece> ExportVmmPieces(const void* p, uint64_t bytes) {
  const CudaVmmDriver& d = VmmDriver();
  std::vector<VmmPiece> pieces;
  if (!d.can_export() || bytes == 0) return pieces;
  const uint64_t begin = reinterpret_cast<uint64_t>(p), end = begin + bytes;
  uint64_t at = begin;
  while (true) {
    VmmPiece piece = ExportPiece(d, at);
    // The first piece holds `p`; each next one starts where the last ended.
    if (!piece.fd.valid() || (pieces.empty() ? piece.base > at : piece.base != at) || pieces.size() >= kMaxVmmPieces) {
      return {};
    }
    at = piece.base + piece.size;
    pieces.push_back(std::move(piece));
    if (at >= end) return pieces;
  }
}

absl::Status SendWithFds(int sock, const void* data, uint64_t bytes, const std::vector<int>& fds) {
  if (fds.size() > kMaxVmmPieces) return absl::InvalidArgumentError("too many descriptors for one message");
  iovec iov{const_cast<void*>(data), bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxVmmPieces)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::UnavailableError(absl::StrCat("CUDA IPC control socket: ", std::strerror(errno)));
  // The descriptors went with the first byte; the rest (if the socket took only part) follows.
  if (static_cast<uint64_t>(n) < bytes) return WriteAll(sock, static_cast<const char*>(data) + n, bytes - n);
  return absl::OkStatus();
}

absl::Status RecvWithFds(int sock, void* data, uint64_t bytes, std::vector<UniqueFd>& fds, absl::Time deadline) {
  fds.clear();
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("timed out on the CUDA IPC control socket");
    pollfd pfd{sock, POLLIN, 0};
    const int rc = HotPoll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms, 100)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) continue;
    iovec iov{p, bytes};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxVmmPieces)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) return absl::UnavailableError("connection closed by the peer");
    if (n < 0) return absl::UnavailableError(absl::StrCat("CUDA IPC control socket: ", std::strerror(errno)));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) return absl::UnavailableError("CUDA IPC control socket: descriptors truncated");
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace refit::transport::cuda_ipc
