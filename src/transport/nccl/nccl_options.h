// Options of the NCCL data plane (NcclReceiver, NcclSender).
#ifndef REFIT_TRANSPORT_NCCL_NCCL_OPTIONS_H_
#define REFIT_TRANSPORT_NCCL_NCCL_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace refit::transport {

struct NcclOptions {
  // CUDA device this end uses (receiver: where bucket slots live; sender: where buckets live).
  int device = 0;
  // Receiver: address of the rendezvous socket (port 0: the OS picks). Endpoint() advertises
  // listen_host.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // Sender: wait this long for the receiver to accept and for the communicator to come up.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Sender: wait this long for the receiver to acknowledge an orderly close.
  absl::Duration close_timeout = absl::Seconds(5);
  // Receiver: messages up to this size that arrive before a matching Receive are held in host
  // memory; a larger one waits (its sender blocked) until a Receive for its tag is posted.
  uint64_t eager_bytes = 1ull << 20;
  // Receiver: at most this many bytes held that way (beyond it, messages wait like large ones).
  uint64_t eager_limit_bytes = 64ull << 20;
  // Sender: its name in the receiver's errors; empty: <hostname>:<pid>.
  std::string peer_name;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_NCCL_NCCL_OPTIONS_H_
