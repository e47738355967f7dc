// Options of the CUDA IPC data plane (CudaIpcReceiver, CudaIpcSender).
#ifndef REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_OPTIONS_H_
#define REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace refit::transport {

struct CudaIpcOptions {
  // CUDA device this end uses (receiver: where exported buffers are mapped and copies run; sender:
  // where its bounce buffer lives). Both ends may be the same GPU: that is the colocated case.
  int device = 0;
  // Receiver: the Unix socket of the control channel. Empty: an abstract-namespace name chosen at
  // listen time ("@refitd-cuda-ipc-<pid>-<random>"); otherwise a filesystem path (created with
  // mode 0600 after removing a stale socket; the directory must exist).
  std::string socket_path;
  // Sender: wait this long for the receiver's hello acknowledgement.
  absl::Duration connect_timeout = absl::Seconds(30);
  // Sender: wait this long for the receiver to acknowledge an orderly close.
  absl::Duration close_timeout = absl::Seconds(5);
  // Receiver: messages up to this size that arrive before a matching Receive are copied into host
  // memory (their sender released at once); a larger one waits, its sender blocked, until a
  // Receive for its tag is posted.
  uint64_t eager_bytes = 1ull << 20;
  // Receiver: at most this many bytes held that way (beyond it, messages wait like large ones).
  uint64_t eager_limit_bytes = 64ull << 20;
  // Sender: its name in the receiver's errors; empty: <hostname>:<pid>.
  std::string peer_name;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_OPTIONS_H_
