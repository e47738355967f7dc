// The rendezvous handshake of the NCCL data plane: the sender's hello on the socket; the
// receiver answers with a fresh ncclUniqueId, and after the goodbye frame with one byte 'A'.
#ifndef REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_
#define REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_

#include <cstdint>

namespace refit::transport::nccl {

struct Hello {
  static constexpr uint32_t kMagic = 0x4C43434Eu;  // "NCCL"
  uint32_t magic = kMagic;
  uint32_t name_bytes = 0;  // followed by the sender's name
};

}  // namespace refit::transport::nccl

#endif  // REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_
