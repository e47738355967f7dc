#include "transport/cuda_ipc/cuda_ipc_sender.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/cuda_ipc/cuda_ipc_handles.h"
#include "transport/cuda_ipc/cuda_ipc_wire.h"

namespace refit::transport {

using cuda_ipc::CudaStatus;
using cuda_ipc::Frame;
using cuda_ipc::Reply;

namespace {

std::string SenderName(const std::string& configured) {
  if (!configured.empty()) return configured;
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  return absl::StrCat(hostname, ":", getpid());
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcSender>> CudaIpcSender::Connect(const std::string& endpoint,
                                                                       const CudaIpcOptions& options) {
  absl::StatusOr<std::string> socket_name = cuda_ipc::ParseEndpoint(endpoint);
  if (!socket_name.ok()) return socket_name.status();
  if (absl::Status st = CudaStatus(cudaSetDevice(options.device), absl::StrCat("CUDA IPC sender: device ", options.device));
      !st.ok()) {
    return st;
  }
  absl::StatusOr<UniqueFd> fd = cuda_ipc::ConnectUnix(*socket_name);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<CudaIpcSender> s(new CudaIpcSender(options, endpoint, std::move(*fd)));
  const std::string name = SenderName(options.peer_name);
  cuda_ipc::Hello hello;
  hello.process_token = cuda_ipc::ProcessToken();
  hello.device = options.device;
  hello.name_bytes = static_cast<uint32_t>(std::min<size_t>(name.size(), cuda_ipc::kMaxNameBytes));
  absl::Status st = cuda_ipc::WriteAll(s->fd_.get(), &hello, sizeof(hello));
  if (st.ok()) st = cuda_ipc::WriteAll(s->fd_.get(), name.data(), hello.name_bytes);
  Reply ack;
  if (st.ok()) st = cuda_ipc::ReadAll(s->fd_.get(), &ack, sizeof(ack), absl::Now() + options.connect_timeout);
  if (st.ok() && (ack.magic != cuda_ipc::kMagic || ack.kind != Reply::kHelloAck)) {
    st = absl::UnavailableError("the receiver answered with bytes that are not a hello acknowledgement");
  }
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("CUDA IPC handshake with ", endpoint, ": ", st.message()));
  s->same_process_ = ack.value == cuda_ipc::ProcessToken();
  return s;
}

CudaIpcSender::CudaIpcSender(CudaIpcOptions options, std::string endpoint, UniqueFd fd)
    : options_(std::move(options)), endpoint_(std::move(endpoint)), fd_(std::move(fd)) {}

CudaIpcSender::~CudaIpcSender() {
  if (failed_.ok()) {
    Frame bye;
    bye.kind = Frame::kGoodbye;
    if (cuda_ipc::WriteAll(fd_.get(), &bye, sizeof(bye)).ok()) {
      (void)AwaitReply(Reply::kGoodbyeAck, absl::Now() + options_.close_timeout);
    }
  }
  bounce_.Reset();  // the receiver has unmapped it (or is gone)
}  // fd_ closes last

absl::Status CudaIpcSender::AwaitReply(uint32_t kind, absl::Time deadline) {
  Reply r;
  absl::Status st = cuda_ipc::ReadAll(fd_.get(), &r, sizeof(r), deadline);
  if (!st.ok()) return st;
  if (r.magic != cuda_ipc::kMagic || r.kind != kind) {
    return absl::UnavailableError(absl::StrCat("unexpected reply ", r.kind, " (expected ", kind, ")"));
  }
  return absl::OkStatus();
}

absl::Status CudaIpcSender::SendForget(uint64_t buffer_id) {
  Frame forget;
  forget.kind = Frame::kForget;
  forget.buffer_id = buffer_id;
  return cuda_ipc::WriteAll(fd_.get(), &forget, sizeof(forget));
}

bool CudaIpcSender::Live(const Export& e) {
  auto same = [](uint64_t base, uint64_t buffer_id) {
    absl::StatusOr<cuda_ipc::Allocation> a = cuda_ipc::QueryAllocation(reinterpret_cast<const void*>(base));
    return a.ok() && a->device && a->buffer_id == buffer_id;
  };
  if (e.pieces.empty()) return same(e.base, e.buffer_id);
  return std::all_of(e.pieces.begin(), e.pieces.end(), [&](const auto& p) { return same(p.first, p.second); });
}

absl::Status CudaIpcSender::ForgetFreed() {
  for (auto it = exported_.begin(); it != exported_.end();) {
    if (Live(*it)) {
      ++it;
      continue;
    }
    if (absl::Status st = SendForget(it->buffer_id); !st.ok()) return st;
    it = exported_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status CudaIpcSender::ExportBuffer(uint64_t buffer_id, uint64_t base, uint64_t size, bool& exported) {
  exported = true;
  if (std::any_of(exported_.begin(), exported_.end(), [&](const Export& e) { return e.buffer_id == buffer_id; })) {
    return absl::OkStatus();
  }
  // A new buffer: the trainer may have freed an earlier one (its memory stays allocated while
  // the receiver maps it).
  if (absl::Status st = ForgetFreed(); !st.ok()) return st;
  Frame f;
  f.kind = Frame::kExport;
  f.buffer_id = buffer_id;
  f.bytes = size;
  f.address = base;
  if (!same_process_) {
    cudaIpcMemHandle_t h;
    static_assert(sizeof(h) == sizeof(f.handle));
    if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)) != cudaSuccess) {
      (void)cudaGetLastError();
      exported = false;  // not exportable: the caller bounces
      return absl::OkStatus();
    }
    std::memcpy(f.handle, &h, sizeof(h));
  }
  if (absl::Status st = cuda_ipc::WriteAll(fd_.get(), &f, sizeof(f)); !st.ok()) return st;
  return Remember(buffer_id, base, size, {});
}

absl::Status CudaIpcSender::Remember(uint64_t buffer_id, uint64_t base, uint64_t size,
                                     std::vector<std::pair<uint64_t, uint64_t>> pieces) {
  ++exports_;
  exported_.push_back({buffer_id, base, size, std::move(pieces)});
  if (exported_.size() > cuda_ipc::kMaxExports) {
    const uint64_t oldest = exported_.front().buffer_id;
    exported_.pop_front();
    if (absl::Status st = SendForget(oldest); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaIpcSender::PlaceVmm(const void* src, uint64_t bytes, uint64_t& buffer_id, uint64_t& offset) {
  const uint64_t s = reinterpret_cast<uint64_t>(src);
  for (const Export& e : exported_) {
    if (!e.pieces.empty() && s >= e.base && bytes <= e.size - (s - e.base) && s - e.base < e.size && Live(e)) {
      buffer_id = e.buffer_id;
      offset = s - e.base;
      return true;
    }
  }
  std::vector<cuda_ipc::VmmPiece> pieces = cuda_ipc::ExportVmmPieces(src, bytes);
  if (pieces.empty()) return false;
  if (absl::Status st = ForgetFreed(); !st.ok()) return st;
  // Run ids cannot collide with CUDA buffer ids (small counters from 1).
  constexpr uint64_t kVmmRunBit = uint64_t{1} << 63;
  Frame f;
  f.kind = Frame::kExportVmm;
  f.buffer_id = kVmmRunBit | ++vmm_runs_;
  f.address = pieces.front().base;
  f.pieces = static_cast<uint32_t>(pieces.size());
  std::vector<uint64_t> sizes;
  std::vector<int> fds;
  std::vector<std::pair<uint64_t, uint64_t>> ids;
  for (const cuda_ipc::VmmPiece& p : pieces) {
    f.bytes += p.size;
    sizes.push_back(p.size);
    fds.push_back(p.fd.get());
    ids.emplace_back(p.base, p.buffer_id);
  }
  if (absl::Status st = cuda_ipc::WriteAll(fd_.get(), &f, sizeof(f)); !st.ok()) return st;
  if (absl::Status st = cuda_ipc::SendWithFds(fd_.get(), sizes.data(), sizes.size() * sizeof(uint64_t), fds);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = Remember(f.buffer_id, f.address, f.bytes, std::move(ids)); !st.ok()) return st;
  buffer_id = f.buffer_id;
  offset = s - f.address;
  return true;
}

absl::StatusOr<bool> CudaIpcSender::Place(const void* src, uint64_t bytes, bool may_bounce, uint64_t& buffer_id,
                                            uint64_t& offset) {
  buffer_id = 0;
  offset = 0;
  if (bytes == 0) return true;
  absl::StatusOr<cuda_ipc::Allocation> a = cuda_ipc::QueryAllocation(src);
  if (!a.ok()) return a.status();
  if (a->device && a->ipc_capable &&
      std::find(unexportable_.begin(), unexportable_.end(), a->buffer_id) == unexportable_.end()) {
    bool exported = false;
    if (absl::Status st = ExportBuffer(a->buffer_id, a->base, a->size, exported); !st.ok()) return st;
    if (exported) {
      buffer_id = a->buffer_id;
      offset = reinterpret_cast<uint64_t>(src) - a->base;
      return true;
    }
    unexportable_.push_back(a->buffer_id);
    if (unexportable_.size() > cuda_ipc::kMaxExports) unexportable_.pop_front();
  } else if (a->device && !a->ipc_capable) {
    // CUDA virtual memory (the legacy IPC handle does not cover it).
    absl::StatusOr<bool> placed = PlaceVmm(src, bytes, buffer_id, offset);
    if (!placed.ok()) return placed.status();
    if (*placed) return true;
  }
  if (!may_bounce) return false;
  // Through the bounce buffer (grown as needed; the old one is forgotten first).
  if (bounce_.bytes() < bytes) {
    const uint64_t grown = std::max<uint64_t>({bytes, 2 * bounce_.bytes(), 1ull << 20});
    if (bounce_) {
      absl::StatusOr<cuda_ipc::Allocation> old = cuda_ipc::QueryAllocation(bounce_.get());
      auto it = old.ok() ? std::find_if(exported_.begin(), exported_.end(),
                                        [&](const Export& e) { return e.buffer_id == old->buffer_id; })
                         : exported_.end();
      if (it != exported_.end()) {
        const uint64_t id = it->buffer_id;
        exported_.erase(it);
        if (absl::Status st = SendForget(id); !st.ok()) return st;
      }
      bounce_.Reset();
    }
    absl::StatusOr<DeviceAllocation> b = DeviceAllocation::Allocate(options_.device, grown);
    if (!b.ok()) return b.status();
    bounce_ = std::move(*b);
  }
  if (absl::Status st = CudaStatus(cudaMemcpy(bounce_.get(), src, bytes, cudaMemcpyDefault), "copy into the bounce buffer");
      !st.ok()) {
    return st;
  }
  absl::StatusOr<cuda_ipc::Allocation> b = cuda_ipc::QueryAllocation(bounce_.get());
  if (!b.ok()) return b.status();
  bool exported = false;
  if (absl::Status st = ExportBuffer(b->buffer_id, b->base, b->size, exported); !st.ok()) return st;
  if (!exported) return absl::UnavailableError("cudaIpcGetMemHandle refused the bounce buffer");
  buffer_id = b->buffer_id;
  offset = reinterpret_cast<uint64_t>(bounce_.get()) - b->base;
  return true;
}

absl::StatusOr<bool> CudaIpcSender::Start(uint64_t tag, const void* src, uint64_t bytes, bool may_bounce) {
  if (!failed_.ok()) return failed_;
  absl::Status st = cuda_ipc::CheckOpen(fd_.get(), absl::StrCat("receiver ", endpoint_));
  Frame f;
  f.kind = Frame::kMessage;
  f.tag = tag;
  f.bytes = bytes;
  absl::StatusOr<bool> placed = false;
  if (st.ok()) {
    placed = Place(src, bytes, may_bounce, f.buffer_id, f.offset);
    st = placed.status();
  }
  if (st.ok() && *placed) st = cuda_ipc::WriteAll(fd_.get(), &f, sizeof(f));
  if (!st.ok()) return Fail(st);
  return *placed;
}

absl::Status CudaIpcSender::Fail(const absl::Status& st) {
  failed_ = absl::UnavailableError(absl::StrCat("CUDA IPC send to ", endpoint_, ": ", st.message()));
  return failed_;
}

absl::Status CudaIpcSender::Send(uint64_t tag, const void* src, uint64_t bytes) {
  cudaSetDevice(options_.device);
  absl::StatusOr<bool> started = Start(tag, src, bytes, /*may_bounce=*/true);
  if (!started.ok()) return started.status();
  return Finish();
}

absl::StatusOr<bool> CudaIpcSender::Post(uint64_t tag, const void* src, uint64_t bytes) {
  // On the caller's thread: its current device is set back as it was (a message that needs the
  // bounce buffer, whose copy would block this thread, is left to Send).
  int current = -1;
  const bool switch_device = cudaGetDevice(&current) != cudaSuccess || current != options_.device;
  if (switch_device) cudaSetDevice(options_.device);
  absl::StatusOr<bool> started = Start(tag, src, bytes, /*may_bounce=*/false);
  if (switch_device && current >= 0) cudaSetDevice(current);
  return started;
}

absl::Status CudaIpcSender::Finish() {
  if (!failed_.ok()) return failed_;
  // The buffer is the receiver's until it says its copy completed.
  if (absl::Status st = AwaitReply(Reply::kReleased, absl::InfiniteFuture()); !st.ok()) return Fail(st);
  return absl::OkStatus();
}

}  // namespace refit::transport
