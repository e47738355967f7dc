// NCCL data plane, fan-out sending end (trainer): one trainer rank feeding several refitd
// daemons with one NCCL broadcast per message instead of one point-to-point send per daemon.
// Connect() sends a group hello to every receiver's rendezvous socket with an ncclUniqueId it made
// itself, and the sender (rank 0) and the receivers (ranks 1..N, in endpoint order) create one
// non-blocking communicator. Send() writes every receiver its frame (its own tag) on its socket,
// then broadcasts the payload. The sockets are the liveness signal: when any
// receiver's socket closes, a blocked Send aborts the communicator, shuts every socket down (so
// the other receivers abort theirs instead of waiting) and returns Unavailable; the broadcaster is
// then spent and the caller connects a new one. The destructor broadcasts a goodbye and waits for
// every receiver's acknowledgement (close_timeout).
//
// Every receiver must be on a different GPU from the sender and from each other (NCCL refuses
// two ranks of one communicator on one device).
//
// Threading: one thread at a time (transport.h).
#ifndef REFIT_TRANSPORT_NCCL_NCCL_BROADCASTER_H_
#define REFIT_TRANSPORT_NCCL_NCCL_BROADCASTER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "transport/nccl/nccl_options.h"
#include "transport/transport.h"

namespace refit::transport {

namespace nccl {
class Communicator;
class Stream;
class DeviceBuffer;
}  // namespace nccl

class NcclBroadcaster final : public GroupSender {
 public:
  static absl::StatusOr<std::unique_ptr<NcclBroadcaster>> Connect(const std::vector<std::string>& endpoints,
                                                                   const NcclOptions& options);
  ~NcclBroadcaster() override;

  size_t size() const override { return endpoints_.size(); }
  absl::Status Send(std::span<const uint64_t> tags, const void* src, uint64_t bytes) override;
  int device() const { return options_.device; }

 private:
  NcclBroadcaster(NcclOptions options, std::vector<std::string> endpoints);
  absl::Status SendFrame(std::span<const uint64_t> tags, const void* payload, uint64_t bytes, uint64_t flags,
                         absl::Time deadline);
  // OK while every receiver's socket is open.
  absl::Status CheckReceivers() const;

  const NcclOptions options_;
  const std::vector<std::string> endpoints_;
  std::vector<UniqueFd> fds_;  // rendezvous sockets, one per receiver
  std::unique_ptr<nccl::Communicator> comm_;
  std::unique_ptr<nccl::Stream> stream_;
  std::unique_ptr<nccl::DeviceBuffer> bounce_;
  absl::Status failed_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_NCCL_NCCL_BROADCASTER_H_
