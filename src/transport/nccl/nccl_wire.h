// The rendezvous handshake of the NCCL data plane: the sender's hello on the socket; the
// receiver answers with a fresh ncclUniqueId, and after the goodbye frame with one byte 'A'.
// A fan-out group's sender (NcclBroadcaster) instead sends a group hello: the hello with
// kGroupMagic, its name, then a GroupJoin carrying the group's ncclUniqueId (made by the sender,
// rank 0) and this receiver's rank; nothing is answered before the communicator exists.
#ifndef REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_
#define REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_

#include <cstdint>

namespace refit::transport::nccl {

struct Hello {
  static constexpr uint32_t kMagic = 0x4C43434Eu;  // "NCCL"
  static constexpr uint32_t kGroupMagic = 0x5047434Eu;  // "NCGP"
  uint32_t magic = kMagic;
  uint32_t name_bytes = 0;  // followed by the sender's name
};

struct GroupJoin {
  int32_t nranks = 0;  // the sender (rank 0) and every receiver of the group
  int32_t rank = 0;    // this receiver's rank, 1 .. nranks-1
  uint8_t unique_id[128] = {};  // ncclUniqueId
};

}  // namespace refit::transport::nccl

#endif  // REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_
