#include "transport/nccl/nccl_broadcaster.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/nccl/nccl_handles.h"
#include "transport/nccl/nccl_wire.h"

namespace refit::transport {

using nccl::CudaStatus;
using nccl::Frame;

absl::StatusOr<std::unique_ptr<NcclBroadcaster>> NcclBroadcaster::Connect(const std::vector<std::string>& endpoints,
                                                                         const NcclOptions& options) {
  if (endpoints.empty()) return absl::InvalidArgumentError("NCCL fan-out: no receivers");
  if (endpoints.size() + 1 > static_cast<size_t>(nccl::kMaxGroupRanks)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL fan-out: ", endpoints.size(), " receivers; at most ",
                                                   nccl::kMaxGroupRanks - 1, " are supported"));
  }
  if (absl::Status st = CudaStatus(cudaSetDevice(options.device), absl::StrCat("NCCL sender: device ", options.device));
      !st.ok()) {
    return st;
  }
  std::unique_ptr<NcclBroadcaster> b(new NcclBroadcaster(options, endpoints));
  const std::string name = nccl::SenderName(options.peer_name);
  ncclUniqueId id;
  if (absl::Status st = nccl::NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !st.ok()) return st;
  const int nranks = static_cast<int>(endpoints.size()) + 1;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    std::string host;
    uint16_t port = 0;
    if (absl::Status st = nccl::ParseEndpoint(endpoints[i], host, port); !st.ok()) return st;
    absl::StatusOr<UniqueFd> fd = nccl::ConnectTcp(host, port);
    if (!fd.ok()) return absl::UnavailableError(absl::StrCat("NCCL fan-out to ", endpoints[i], ": ", fd.status().message()));
    b->fds_.push_back(std::move(*fd));
    nccl::Hello hello;
    hello.magic = nccl::Hello::kGroupMagic;
    hello.name_bytes = static_cast<uint32_t>(name.size());
    hello.nccl_version = nccl::LoadedNcclVersion();
    nccl::GroupJoin join;
    join.nranks = nranks;
    join.rank = static_cast<int32_t>(i) + 1;
    std::memcpy(join.unique_id, &id, sizeof(id));
    const int sock = b->fds_.back().get();
    absl::Status st = nccl::WriteAll(sock, &hello, sizeof(hello));
    if (st.ok()) st = nccl::WriteAll(sock, name.data(), name.size());
    if (st.ok()) st = nccl::WriteAll(sock, &join, sizeof(join));
    if (st.ok()) {
      st =
          nccl::AwaitNcclVersion(sock, absl::StrCat("refitd at ", endpoints[i]), absl::Now() + options.connect_timeout);
      if (absl::IsFailedPrecondition(st)) return st;
    }
    if (!st.ok()) return absl::UnavailableError(absl::StrCat("NCCL fan-out rendezvous with ", endpoints[i], ": ", st.message()));
  }
  NcclBroadcaster* self = b.get();
  absl::StatusOr<std::unique_ptr<nccl::Communicator>> comm = nccl::Communicator::Init(
      options.device, id, nranks, 0, absl::Now() + options.connect_timeout, [self] { return self->CheckReceivers(); });
  if (!comm.ok()) return comm.status();
  b->comm_ = std::move(*comm);
  absl::StatusOr<std::unique_ptr<nccl::Stream>> stream = nccl::Stream::Create(options.device);
  if (!stream.ok()) return stream.status();
  b->stream_ = std::move(*stream);
  return b;
}

NcclBroadcaster::NcclBroadcaster(NcclOptions options, std::vector<std::string> endpoints)
    : options_(std::move(options)),
      endpoints_(std::move(endpoints)),
      bounce_(std::make_unique<nccl::DeviceBuffer>(options_.device)) {}

NcclBroadcaster::~NcclBroadcaster() {
  if (comm_ != nullptr && !comm_->aborted() && failed_.ok()) {
    const absl::Time deadline = absl::Now() + options_.close_timeout;
    std::vector<uint64_t> none(endpoints_.size(), 0);
    if (SendFrame(none, nullptr, 0, Frame::kGoodbye, deadline).ok()) {
      for (const UniqueFd& fd : fds_) {
        char ack = 0;
        (void)nccl::ReadAll(fd.get(), &ack, 1, deadline);
      }
    }
  }
  comm_.reset();
  stream_.reset();
  bounce_.reset();
}  // fds_ close last

absl::Status NcclBroadcaster::CheckReceivers() const {
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (absl::Status st = nccl::CheckIdle(fds_[i].get(), absl::StrCat("receiver ", endpoints_[i])); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status NcclBroadcaster::SendFrame(std::span<const uint64_t> tags, const void* payload, uint64_t bytes,
                                        uint64_t flags, absl::Time deadline) {
  cudaStream_t s = stream_->get();
  absl::StatusOr<const void*> src = nccl::OnDevice(payload, bytes, *bounce_, s);
  absl::Status st = src.status();
  for (size_t i = 0; i < fds_.size() && st.ok(); ++i) {
    Frame f;
    f.tag = tags[i];
    f.bytes = bytes;
    f.flags = flags;
    st = nccl::WriteAll(fds_[i].get(), &f, sizeof(f));
  }
  // The root's buffer is only read by the in-place broadcast.
  if (st.ok() && bytes > 0) st = comm_->Broadcast(const_cast<void*>(*src), bytes, 0, s);
  if (st.ok()) st = comm_->Wait(s, deadline, [this] { return CheckReceivers(); });
  return st;
}

absl::Status NcclBroadcaster::Send(std::span<const uint64_t> tags, const void* src, uint64_t bytes) {
  if (!failed_.ok()) return failed_;
  if (tags.size() != endpoints_.size()) return absl::InvalidArgumentError("NCCL fan-out: one tag per receiver expected");
  cudaSetDevice(options_.device);
  absl::Status st = CheckReceivers();
  if (st.ok()) st = SendFrame(tags, src, bytes, 0, absl::InfiniteFuture());
  if (!st.ok()) {
    // One receiver failing ends the broadcast for all: abort, and close every socket so the other
    // receivers abort their side of the communicator too rather than wait for the next message.
    if (comm_ != nullptr) comm_->Abort();
    for (const UniqueFd& fd : fds_) shutdown(fd.get(), SHUT_RDWR);
    failed_ = absl::UnavailableError(absl::StrCat("NCCL fan-out send: ", st.message()));
    return failed_;
  }
  return absl::OkStatus();
}

}  // namespace refit::transport
