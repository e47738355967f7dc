#include "transport/nccl/nccl_sender.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/nccl/nccl_handles.h"
#include "transport/nccl/nccl_wire.h"

namespace refit::transport {

using nccl::CudaStatus;
using nccl::Frame;

absl::StatusOr<std::unique_ptr<NcclSender>> NcclSender::Connect(const std::string& endpoint,
                                                                 const NcclOptions& options) {
  std::string host;
  uint16_t port = 0;
  if (absl::Status st = nccl::ParseEndpoint(endpoint, host, port); !st.ok()) return st;
  if (absl::Status st = CudaStatus(cudaSetDevice(options.device), absl::StrCat("NCCL sender: device ", options.device));
      !st.ok()) {
    return st;
  }
  absl::StatusOr<UniqueFd> fd = nccl::ConnectTcp(host, port);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<NcclSender> s(new NcclSender(options, endpoint, std::move(*fd)));
  const std::string name = nccl::SenderName(options.peer_name);
  nccl::Hello hello;
  hello.name_bytes = static_cast<uint32_t>(name.size());
  hello.nccl_version = nccl::LoadedNcclVersion();
  absl::Status st = nccl::WriteAll(s->fd_.get(), &hello, sizeof(hello));
  if (st.ok()) st = nccl::WriteAll(s->fd_.get(), name.data(), name.size());
  ncclUniqueId id;
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  if (st.ok()) st = nccl::AwaitNcclVersion(s->fd_.get(), absl::StrCat("refitd at ", endpoint), deadline);
  if (absl::IsFailedPrecondition(st)) return st;
  if (st.ok()) st = nccl::ReadAll(s->fd_.get(), &id, sizeof(id), deadline);
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("NCCL rendezvous with ", endpoint, ": ", st.message()));
  std::string peer = absl::StrCat("receiver ", endpoint);
  int sock = s->fd_.get();
  absl::StatusOr<std::unique_ptr<nccl::Communicator>> comm = nccl::Communicator::Init(
      options.device, id, 2, 1, deadline, [sock, peer] { return nccl::CheckIdle(sock, peer); });
  if (!comm.ok()) return comm.status();
  s->comm_ = std::move(*comm);
  absl::StatusOr<std::unique_ptr<nccl::Stream>> stream = nccl::Stream::Create(options.device);
  if (!stream.ok()) return stream.status();
  s->stream_ = std::move(*stream);
  return s;
}

NcclSender::NcclSender(NcclOptions options, std::string endpoint, UniqueFd fd)
    : options_(std::move(options)),
      endpoint_(std::move(endpoint)),
      fd_(std::move(fd)),
      bounce_(std::make_unique<nccl::DeviceBuffer>(options_.device)) {}

NcclSender::~NcclSender() {
  if (comm_ != nullptr && !comm_->aborted() && failed_.ok()) {
    const absl::Time deadline = absl::Now() + options_.close_timeout;
    if (SendFrame(0, nullptr, 0, Frame::kGoodbye, deadline).ok()) {
      char ack = 0;
      (void)nccl::ReadAll(fd_.get(), &ack, 1, deadline);
    }
  }
  comm_.reset();
  stream_.reset();
  bounce_.reset();
}  // fd_ closes last

absl::Status NcclSender::SendFrame(uint64_t tag, const void* payload, uint64_t bytes, uint64_t flags,
                                   absl::Time deadline) {
  cudaStream_t s = stream_->get();
  Frame f;
  f.tag = tag;
  f.bytes = bytes;
  f.flags = flags;
  absl::StatusOr<const void*> src = nccl::OnDevice(payload, bytes, *bounce_, s);
  absl::Status st = src.status();
  if (st.ok()) st = nccl::WriteAll(fd_.get(), &f, sizeof(f));
  if (st.ok() && bytes > 0) st = comm_->Send(*src, bytes, 0, s);
  std::string peer = absl::StrCat("receiver ", endpoint_);
  int sock = fd_.get();
  if (st.ok()) st = comm_->Wait(s, deadline, [sock, peer] { return nccl::CheckIdle(sock, peer); });
  return st;
}

absl::Status NcclSender::Send(uint64_t tag, const void* src, uint64_t bytes) {
  if (!failed_.ok()) return failed_;
  cudaSetDevice(options_.device);
  absl::Status st = nccl::CheckIdle(fd_.get(), absl::StrCat("receiver ", endpoint_));
  if (st.ok()) st = SendFrame(tag, src, bytes, 0, absl::InfiniteFuture());
  if (!st.ok()) {
    failed_ = absl::UnavailableError(absl::StrCat("NCCL send to ", endpoint_, ": ", st.message()));
    return failed_;
  }
  return absl::OkStatus();
}

}  // namespace refit::transport
