// Receiver over UCX (UCP tag matching). Listens on a TCP socket address; any number of senders
// connect to it and push tagged messages, which Receive() matches by tag (full 64-bit mask) and
// lands directly in the caller's buffer (eager or rendezvous, chosen by UCX by size).
//
// A dedicated progress thread drives the UCP worker for the receiver's whole life, so connections
// are accepted, orderly closes acknowledged and dead peers noticed even while no Receive is
// waiting; it sleeps on the worker's event fd when idle. Receive() posts the tag receive and
// waits for its completion, its deadline, Cancel() or a peer failure.
//
// Failure behaviour: a connected sender whose endpoint fails without having closed in order (its
// process died, its host went away, the keepalive expired) puts the receiver in a failed state:
// the waiting Receive and every later one return Unavailable naming that peer, until Reset().
// Messages that peers sent and that were not yet received stay queued across Cancel/Reset.
//
// Threading: as transport.h: one receiving thread at a time; Cancel() and Reset() from any
// thread. The UCP worker runs in UCS_THREAD_MODE_MULTI because the receiving thread posts and
// cancels requests while the progress thread progresses.
#ifndef REFIT_TRANSPORT_UCX_UCX_RECEIVER_H_
#define REFIT_TRANSPORT_UCX_UCX_RECEIVER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_options.h"

namespace refit::transport {

class UcxReceiver final : public Receiver {
 public:
  // Creates the UCP context, worker and listener on options.listen_host:listen_port and starts
  // the progress thread. Errors: InvalidArgument (bad options or address), Unavailable or
  // FailedPrecondition (UCX could not bring up the transports or bind).
  static absl::StatusOr<std::unique_ptr<UcxReceiver>> Listen(const UcxOptions& options);

  // Stops the progress thread, drops all peer connections (which completes every request on
  // them), completes receives that returned before UCX did, then frees listener, worker, context.
  // REQUIRES: no Receive in progress.
  ~UcxReceiver() override;

  // As the destructor, except that the listener, worker and context are never freed: they stay
  // (reachable) until the process exits. UCX frees a listener while a connection it accepted may
  // still deliver its connection request (the sender's handshake message), which then runs
  // ucp_cm_server_conn_request_cb on the freed listener and crashes the process; a trainer that
  // connects while refitd shuts down hits it. A connection request arriving after this call is
  // rejected or left unanswered. The peers' endpoints are closed, but the worker's connections
  // stay open until the exit closes them. REQUIRES: no Receive in progress.
  void CloseForExit() override;

  // "ucx:<listen_host>:<port>".
  std::string Endpoint() const override;
  absl::StatusOr<uint64_t> Receive(uint64_t tag, void* dst, uint64_t capacity,
                                   absl::Time deadline) override;
  void Cancel() override;
  void Reset() override;
  void DisconnectPeers() override;

 private:
  struct Peer;
  struct PendingReceive;

  explicit UcxReceiver(const UcxOptions& options);
  absl::Status Start();
  void ProgressLoop();
  // Progress thread: sends pending acknowledgements, closes failed endpoints and forgets peers
  // whose close finished. Returns whether it did anything.
  bool ServicePeers();
  bool HasPeerWork() const;
  // The destructor's and CloseForExit's work (once): `for_exit` keeps the UCX objects.
  void Close(bool for_exit);
  // Progress thread: frees the orphaned receives that completed meanwhile.
  void ReapOrphans();
  Peer* FindPeer(ucp_ep_h ep);

  static void OnConnRequest(ucp_conn_request_h request, void* self);
  static void OnPeerError(void* peer, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnHello(void* self, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnGoodbye(void* self, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static void OnReceiveDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                            void* pending);

  const UcxOptions options_;
  std::string endpoint_;
  // Declared in creation order; destroyed in reverse.
  ucx::UcpContext context_;
  ucx::UcpWorker worker_;
  ucx::UcpListener listener_;
  // Touched only by the progress thread (callbacks run inside its ucp_worker_progress), and by
  // the destructor after that thread has stopped.
  std::map<ucp_ep_h, std::unique_ptr<Peer>> peers_;
  std::atomic<bool> stopping_{false};
  bool closed_ = false;  // Close ran (the destructor's thread, or the one that called CloseForExit)
  std::thread progress_thread_;

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Receives to cancel. UCX 1.13's ucp_request_cancel races with a completion running in another
  // thread's ucp_worker_progress (it asserts in ucp_tag_exp_remove), so the progress thread
  // performs every cancel; the receiving thread waits until its entry was consumed.
  std::vector<std::pair<void*, PendingReceive*>> cancels_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancel_pending_{false};
  std::atomic<bool> drop_peers_{false};  // DisconnectPeers: close every peer endpoint
  // A receive whose Receive returned (Unavailable) before UCX completed its request: kept until
  // it completes, because freeing an in-flight request leaves UCX holding it past the worker.
  struct Orphan {
    std::shared_ptr<PendingReceive> pending;  // written by the completion callback
    ucx::UcpRequest request;                  // destroyed first: completes, then frees
  };
  std::vector<Orphan> orphans_ ABSL_GUARDED_BY(mu_);
  void ServiceCancels();
  // Non-empty once a peer failed: the Unavailable message.
  std::string failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_UCX_UCX_RECEIVER_H_
