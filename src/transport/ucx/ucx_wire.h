// The small handshake that the UCX data plane runs beside the tagged payload messages, as UCP
// active messages (the tag space stays entirely the caller's):
//   sender -> receiver  kHello    (data: the sender's name)  -> receiver answers kHelloAck
//   sender -> receiver  kGoodbye                               -> receiver answers kGoodbyeAck
// Both requests are sent with UCP_AM_SEND_FLAG_REPLY so the receiver knows the endpoint. A peer
// whose endpoint fails after its goodbye was acknowledged closed in order; any other endpoint
// failure is a dead peer.
//
// Threading: constants only.
#ifndef REFIT_TRANSPORT_UCX_UCX_WIRE_H_
#define REFIT_TRANSPORT_UCX_UCX_WIRE_H_

#include <cstdint>

namespace refit::transport::ucx {

enum AmId : uint16_t {
  kAmHello = 1,
  kAmHelloAck = 2,
  kAmGoodbye = 3,
  kAmGoodbyeAck = 4,
};

// Longest peer name kept by the receiver; longer names are cut.
inline constexpr uint64_t kMaxPeerNameBytes = 256;

}  // namespace refit::transport::ucx

#endif  // REFIT_TRANSPORT_UCX_UCX_WIRE_H_
