// The accept loop of a data-plane receiver that serves each connected sender on a thread of its
// own (the NCCL and CUDA IPC receivers): every 100 ms it reaps the peers whose thread has finished
// (joined by the peer's destructor, outside the lock) and accepts a waiting connection, which
// becomes a peer in `peers` with its thread running `serve`. Transport-neutral.
//
// Threading: runs on the receiver's accept thread until `stopping`; `peers` is guarded by `mu`.
#ifndef REFIT_TRANSPORT_PEER_THREADS_H_
#define REFIT_TRANSPORT_PEER_THREADS_H_

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"

namespace refit::transport {

// Peer: has std::atomic<bool> finished and std::thread thread. `make` builds the peer of an
// accepted socket.
template <class Peer>
void AcceptPeers(int listen_fd, const std::atomic<bool>& stopping, absl::Mutex& mu,
                 std::vector<std::unique_ptr<Peer>>& peers, const std::function<std::unique_ptr<Peer>(UniqueFd)>& make,
                 const std::function<void(Peer&)>& serve) {
  while (!stopping) {
    pollfd pfd{listen_fd, POLLIN, 0};
    int rc = poll(&pfd, 1, 100);
    std::vector<std::unique_ptr<Peer>> done;
    {
      absl::MutexLock lock(&mu);
      for (auto it = peers.begin(); it != peers.end();) {
        if ((*it)->finished) {
          done.push_back(std::move(*it));
          it = peers.erase(it);
        } else {
          ++it;
        }
      }
    }
    done.clear();
    if (rc <= 0 || stopping) continue;
    UniqueFd fd(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    std::unique_ptr<Peer> peer = make(std::move(fd));
    Peer* p = peer.get();
    {
      absl::MutexLock lock(&mu);
      peers.push_back(std::move(peer));
    }
    p->thread = std::thread([serve, p] { serve(*p); });  // a copy: peers outlive the loop
  }
}

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_PEER_THREADS_H_
