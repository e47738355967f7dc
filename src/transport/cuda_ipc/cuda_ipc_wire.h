// The control channel of the CUDA IPC data plane: a Unix stream socket per sender, carrying
// fixed-size records (no payload bytes ever cross it).
//
//   sender -> receiver: Hello (+ name), then Frames: kExport (a buffer's IPC handle, once per
//                       buffer), kExportVmm (a run of CUDA virtual-memory pieces: the frame, then
//                       one record of the pieces' sizes carrying their POSIX descriptors by
//                       SCM_RIGHTS), kMessage (tag, size, buffer, offset), kForget (a buffer no
//                       longer used), kGoodbye.
//   receiver -> sender: Reply kHelloAck (the receiver's process token), one kReleased per
//                       kMessage once the receiver's copy out of the buffer has completed (its
//                       stream synchronized), kGoodbyeAck.
//
// A process token is a random 64-bit value per process: equal tokens mean both ends are one
// process, where a CUDA IPC handle cannot be opened and the buffer's address is used instead.
#ifndef REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_WIRE_H_
#define REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_WIRE_H_

#include <cstdint>

namespace refit::transport::cuda_ipc {

inline constexpr uint64_t kMagic = 0x3130435049434652ull;  // "RFCIPC01"
inline constexpr uint32_t kMaxNameBytes = 1024;
inline constexpr uint32_t kHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
// Buffers one sender may have exported at once (the sender forgets its oldest beyond this).
inline constexpr uint32_t kMaxExports = 64;
// Pieces one kExportVmm may carry (one descriptor each).
inline constexpr uint32_t kMaxVmmPieces = 64;

struct Hello {
  uint64_t magic = kMagic;
  uint64_t process_token = 0;
  int32_t device = 0;  // the sender's CUDA device (for errors)
  uint32_t name_bytes = 0;  // followed by the sender's name
};
static_assert(sizeof(Hello) == 24);

struct Frame {
  enum Kind : uint32_t { kExport = 1, kForget = 2, kMessage = 3, kGoodbye = 4, kExportVmm = 5 };
  uint64_t magic = kMagic;
  uint32_t kind = 0;
  uint32_t pieces = 0;     // kExportVmm: the number of pieces (and descriptors) that follow
  uint64_t tag = 0;        // kMessage
  uint64_t bytes = 0;      // kMessage: payload size; kExport, kExportVmm: the buffer's size
  uint64_t buffer_id = 0;  // kExport, kForget, kMessage (0: an empty message)
  uint64_t offset = 0;     // kMessage: the payload's offset in the buffer
  uint64_t address = 0;    // kExport: the buffer's address in the sender (used within one process)
  uint8_t handle[kHandleBytes] = {};  // kExport: cudaIpcMemHandle_t
};
static_assert(sizeof(Frame) == 120);

struct Reply {
  enum Kind : uint32_t { kHelloAck = 1, kReleased = 2, kGoodbyeAck = 3 };
  uint64_t magic = kMagic;
  uint32_t kind = 0;
  uint32_t reserved = 0;
  uint64_t value = 0;  // kHelloAck: the receiver's process token; kReleased: the message's tag
};
static_assert(sizeof(Reply) == 24);

}  // namespace refit::transport::cuda_ipc

#endif  // REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_WIRE_H_
