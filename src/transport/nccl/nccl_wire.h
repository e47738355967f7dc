// The rendezvous handshake of the NCCL data plane: the sender's hello on the socket (with the
// NCCL version it runs); the receiver answers with its own NCCL version (int32) and, when the two
// are the same, a fresh ncclUniqueId; after the goodbye frame with one byte 'A'. NCCL connects
// only processes of one version, and its own refusal says no more than "invalid usage": both sides
// compare first, and the sender's error names both versions and the library each side loaded.
// A fan-out group's sender (NcclBroadcaster) instead sends a group hello: the hello with
// kGroupMagic, its name, then a GroupJoin carrying the group's ncclUniqueId (made by the sender,
// rank 0) and this receiver's rank; the receiver answers only its version.
#ifndef REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_
#define REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_

#include <cstdint>

namespace refit::transport::nccl {

struct Hello {
  static constexpr uint32_t kMagic = 0x4C43434Eu;  // "NCCL"
  static constexpr uint32_t kGroupMagic = 0x5047434Eu;  // "NCGP"
  uint32_t magic = kMagic;
  uint32_t name_bytes = 0;  // followed by the sender's name
  int32_t nccl_version = 0;  // ncclGetVersion of the sender (e.g. 22809 for 2.28.9)
  uint32_t reserved = 0;
};

struct GroupJoin {
  int32_t nranks = 0;  // the sender (rank 0) and every receiver of the group
  int32_t rank = 0;    // this receiver's rank, 1 .. nranks-1
  uint8_t unique_id[128] = {};  // ncclUniqueId
};

}  // namespace refit::transport::nccl

#endif  // REFIT_TRANSPORT_NCCL_NCCL_WIRE_H_
