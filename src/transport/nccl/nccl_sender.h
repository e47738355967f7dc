// NCCL data plane, sending end (trainer). Connect() performs the rendezvous (hello, unique id)
// and creates rank 1 of a two-rank non-blocking communicator with the receiver. Send() writes a
// frame header on the rendezvous socket, sends the payload with ncclSend and polls until it left
// `src`: device memory of
// this sender's GPU goes out directly, anything else through a device bounce buffer. The
// rendezvous socket doubles as liveness: if it closes, a blocked Send aborts the communicator
// and returns Unavailable. The destructor sends a goodbye frame and waits for its
// acknowledgement (close_timeout), so the receiver knows the disconnect was orderly.
//
// Threading: one thread at a time (transport.h).
#ifndef REFIT_TRANSPORT_NCCL_NCCL_SENDER_H_
#define REFIT_TRANSPORT_NCCL_NCCL_SENDER_H_

#include <cstdint>
#include <memory>
#include <string>

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

class NcclSender final : public Sender {
 public:
  static absl::StatusOr<std::unique_ptr<NcclSender>> Connect(const std::string& endpoint, const NcclOptions& options);
  ~NcclSender() override;

  absl::Status Send(uint64_t tag, const void* src, uint64_t bytes) override;
  int device() const { return options_.device; }

 private:
  NcclSender(NcclOptions options, std::string endpoint, UniqueFd fd);
  absl::Status SendFrame(uint64_t tag, const void* payload, uint64_t bytes, uint64_t flags, absl::Time deadline);

  const NcclOptions options_;
  const std::string endpoint_;
  const UniqueFd fd_;  // the rendezvous socket: frames, goodbye, liveness
  std::unique_ptr<nccl::Communicator> comm_;
  std::unique_ptr<nccl::Stream> stream_;
  std::unique_ptr<nccl::DeviceBuffer> bounce_;
  absl::Status failed_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_NCCL_NCCL_SENDER_H_
