// Sender over UCX (UCP tag matching): one client endpoint to one UcxReceiver. Connect() waits
// until the receiver has accepted the connection (a hello/ack handshake, see ucx_wire.h), so an
// unreachable receiver is reported there rather than on the first Send. The destructor says
// goodbye and waits (bounded by options.close_timeout) for the acknowledgement before closing,
// so the receiver can tell an orderly close from a dead sender.
//
// Threading: one thread at a time (UCS_THREAD_MODE_SERIALIZED); all progress happens inside the
// calls, sleeping on the worker's event fd while waiting.
#ifndef REFIT_TRANSPORT_UCX_UCX_SENDER_H_
#define REFIT_TRANSPORT_UCX_UCX_SENDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_options.h"

namespace refit::transport {

class UcxSender final : public Sender {
 public:
  // Connects to `endpoint` ("ucx:<host>:<port>", from UcxReceiver::Endpoint()). Errors:
  // InvalidArgument (malformed endpoint or options), Unavailable (refused, unreachable, or not
  // accepted within options.connect_timeout).
  static absl::StatusOr<std::unique_ptr<UcxSender>> Connect(std::string_view endpoint,
                                                            const UcxOptions& options);
  ~UcxSender() override;

  // Blocks until the message left `src` (small messages) or the receiver fetched it (large ones,
  // rendezvous). A zero-byte message is allowed. Unavailable once the receiver is gone.
  absl::Status Send(uint64_t tag, const void* src, uint64_t bytes) override;

  // UCX's description of the endpoint's lanes (which transport carries what), for diagnostics.
  std::string DescribeLanes() const;

 private:
  UcxSender(std::string_view endpoint, const UcxOptions& options);
  absl::Status Start();
  absl::Status PeerGone(std::string_view during) const;
  // Goodbye, its acknowledgement, then an orderly close, all within options_.close_timeout;
  // drops the connection where that fails.
  void CloseInOrder();
  // Drops the connection if still open (UcpEndpoint::BeginForcedClose), which completes every
  // request still in flight on it, and waits up to options_.close_timeout for the close.
  void CloseEndpoint();
  bool Failed() const { return ep_status_ != UCS_OK; }

  static void OnError(void* self, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnAck(void* flag, const void* header, size_t header_length, void* data,
                            size_t length, const ucp_am_recv_param_t* param);

  const std::string endpoint_;
  const UcxOptions options_;
  std::string name_;  // announced in the hello; must outlive the hello send
  bool hello_acked_ = false;
  bool goodbye_acked_ = false;
  ucs_status_t ep_status_ = UCS_OK;  // first error reported for the endpoint
  // Declared in creation order; destroyed in reverse, after the destructor closed the endpoint
  // (which completes hello_'s request).
  ucx::UcpContext context_;
  ucx::UcpWorker worker_;
  ucx::UcpEndpoint ep_;
  ucx::Started hello_;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_UCX_UCX_SENDER_H_
