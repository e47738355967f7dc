// RAII owners for the UCX handles used by the UCX data plane, the mapping of ucs_status_t to
// absl::Status, and the sleep-until-event progress loop shared by the sender and the receiver.
// Each owner has exactly one cleanup action; owners are destroyed in reverse order of creation by
// declaring them in creation order as members.
//
// Threading: an owner is used by one thread at a time. ProgressUntil must be called by the one
// thread that progresses the worker.
#ifndef REFIT_TRANSPORT_UCX_UCX_HANDLES_H_
#define REFIT_TRANSPORT_UCX_UCX_HANDLES_H_

#include <ucp/api/ucp.h>

#include <string_view>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/ucx/ucx_options.h"

namespace refit::transport::ucx {

// "<what>: <ucs_status_string>" with an absl code chosen by what the failure means to a caller:
// network failures are Unavailable, bad arguments InvalidArgument, resources ResourceExhausted.
absl::Status UcsError(ucs_status_t status, std::string_view what);

// Keeps `handle` in a process-wide list that is never freed (MoveOnlyHandle::LeaveToExit).
void KeepUntilExit(const void* handle);

template <typename T>
class MoveOnlyHandle {
 public:
  MoveOnlyHandle() = default;
  explicit MoveOnlyHandle(T h) : h_(h) {}
  MoveOnlyHandle(MoveOnlyHandle&& o) noexcept : h_(std::exchange(o.h_, T{})) {}
  MoveOnlyHandle& operator=(MoveOnlyHandle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  MoveOnlyHandle(const MoveOnlyHandle&) = delete;
  MoveOnlyHandle& operator=(const MoveOnlyHandle&) = delete;
  T get() const { return h_; }
  explicit operator bool() const { return h_ != T{}; }
  // Never frees the handle: it stays, reachable (for leak checkers), until the process exits.
  // For what UCX cannot free safely while peers may still connect (UcxReceiver::CloseForExit).
  void LeaveToExit() {
    if (h_ != T{}) KeepUntilExit(release());
  }

 protected:
  T release() { return std::exchange(h_, T{}); }
  T h_{};
};

// ucp_config_release.
class UcpConfig : public MoveOnlyHandle<ucp_config_t*> {
 public:
  using MoveOnlyHandle::MoveOnlyHandle;
  UcpConfig(UcpConfig&&) = default;
  UcpConfig& operator=(UcpConfig&&) = default;
  ~UcpConfig();
  // Reads UCX defaults and applies `options` (TLS, NET_DEVICES, KEEPALIVE_INTERVAL, extras).
  static absl::StatusOr<UcpConfig> FromOptions(const UcxOptions& options);
};

// ucp_cleanup. Features: tag matching, active messages (connection handshake) and wakeup.
class UcpContext : public MoveOnlyHandle<ucp_context_h> {
 public:
  using MoveOnlyHandle::MoveOnlyHandle;
  UcpContext(UcpContext&&) = default;
  UcpContext& operator=(UcpContext&&) = default;
  ~UcpContext();
  static absl::StatusOr<UcpContext> Create(const UcxOptions& options, std::string_view name);
};

// ucp_worker_destroy. Also holds the worker's event fd (owned by the worker).
class UcpWorker : public MoveOnlyHandle<ucp_worker_h> {
 public:
  using MoveOnlyHandle::MoveOnlyHandle;
  UcpWorker(UcpWorker&&) = default;
  UcpWorker& operator=(UcpWorker&&) = default;
  ~UcpWorker();
  static absl::StatusOr<UcpWorker> Create(ucp_context_h context, ucs_thread_mode_t mode);
  int event_fd() const { return efd_; }

 private:
  int efd_ = -1;
};

// ucp_listener_destroy.
class UcpListener : public MoveOnlyHandle<ucp_listener_h> {
 public:
  using MoveOnlyHandle::MoveOnlyHandle;
  UcpListener(UcpListener&&) = default;
  UcpListener& operator=(UcpListener&&) = default;
  ~UcpListener();
};

// ucp_request_free, once the request completed. Holds a request returned by a *_nbx call (never
// NULL or an error pointer) and the worker that progresses it.
//
// ucp_request_free on a request still in flight only marks it: UCX goes on using what the request
// holds (the caller's buffer, its registration in the context's registration cache, a slot of the
// worker's request pool) until it completes, and one that never completes is still referenced when
// the worker and context are destroyed (a UCX 1.16+ built with assertions then aborts in
// ucp_cleanup: `region->refcount == 0`). So destroying an in-flight request first finishes it: ucp_request_cancel (a tag receive
// completes as cancelled; UCX ignores it for other requests) and progress until UCX completes it,
// for at most kRequestDrainTimeout. A send or close completes only once its endpoint is closed, so
// owners close the endpoint before they drop its requests.
//
// REQUIRES (destroying an in-flight request): the calling thread may progress the worker and no
// other thread progresses it meanwhile (UCX 1.13's cancel races with a completion running in
// another thread).
class UcpRequest {
 public:
  UcpRequest() = default;
  UcpRequest(void* request, const UcpWorker& worker) : h_(request), worker_(&worker) {}
  UcpRequest(UcpRequest&& o) noexcept
      : h_(std::exchange(o.h_, nullptr)), worker_(std::exchange(o.worker_, nullptr)) {}
  UcpRequest& operator=(UcpRequest&& o) noexcept {
    std::swap(h_, o.h_);
    std::swap(worker_, o.worker_);
    return *this;
  }
  UcpRequest(const UcpRequest&) = delete;
  UcpRequest& operator=(const UcpRequest&) = delete;
  ~UcpRequest();
  void* get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }
  // UCS_INPROGRESS until the operation completed; then its final status.
  ucs_status_t Check() const { return ucp_request_check_status(h_); }

 private:
  void* h_ = nullptr;
  const UcpWorker* worker_ = nullptr;
};

// How long destroying an in-flight UcpRequest, or a still open UcpEndpoint, waits for UCX.
inline constexpr absl::Duration kRequestDrainTimeout = absl::Seconds(5);

// The result of starting a non-blocking operation: done at once (status set, no request), failed
// at once, or in flight (request set).
struct Started {
  ucs_status_t status = UCS_OK;
  UcpRequest request;
  bool in_flight() const { return static_cast<bool>(request); }
};
Started StartFromPtr(ucs_status_ptr_t ptr, const UcpWorker& worker);

// Closes the endpoint as BeginForcedClose does, progressing the worker until the close is done
// (at most kRequestDrainTimeout). Closing completes every request still in flight on the endpoint
// (in error), which is what lets their owners free them (UcpRequest).
//
// REQUIRES (destroying an open endpoint): as for destroying an in-flight UcpRequest.
class UcpEndpoint : public MoveOnlyHandle<ucp_ep_h> {
 public:
  UcpEndpoint() = default;
  UcpEndpoint(ucp_ep_h ep, const UcpWorker& worker, ucp_err_handling_mode_t err_mode)
      : MoveOnlyHandle(ep), worker_(&worker), err_mode_(err_mode) {}
  UcpEndpoint(UcpEndpoint&& o) noexcept
      : MoveOnlyHandle(std::move(o)),
        worker_(std::exchange(o.worker_, nullptr)),
        err_mode_(o.err_mode_) {}
  UcpEndpoint& operator=(UcpEndpoint&& o) noexcept {
    MoveOnlyHandle::operator=(std::move(o));
    std::swap(worker_, o.worker_);
    std::swap(err_mode_, o.err_mode_);
    return *this;
  }
  ~UcpEndpoint();
  // Starts an orderly close: flush, then disconnect. The handle is empty afterwards; the returned
  // request tracks the close.
  Started BeginClose();
  // Starts dropping the connection: UCP_EP_CLOSE_FLAG_FORCE, which completes the endpoint's
  // pending requests at once, needs no answer from the peer, and is what UCX requires after an
  // endpoint error. UCX refuses it (UCS_ERR_INVALID_PARAM) for an endpoint without peer error
  // handling; there the close is orderly, which on a failed endpoint finishes without the peer.
  Started BeginForcedClose();
  // Leaves the endpoint to ucp_worker_destroy, which destroys the endpoints still open without
  // waiting for their peers. Only for an endpoint without peer error handling whose peer may not
  // answer an orderly close: UCX has no other close for it that needs no answer.
  void LeaveToWorker() { release(); }

 private:
  Started BeginClose(uint32_t flags);

  const UcpWorker* worker_ = nullptr;
  ucp_err_handling_mode_t err_mode_ = UCP_ERR_HANDLING_MODE_NONE;
};

// Sets UCX's log level for the whole process ("fatal", "error", "warn", "info", ...). UCX
// logs through its own global configuration, shared by every UCP context in the process, so this
// is a process-wide setting for the daemon's (or a test's) startup, not a per-connection option.
absl::Status SetUcxLogLevel(std::string_view level);

// The UCP error handling mode for `mode`.
ucp_err_handling_mode_t ErrHandlingMode(UcxErrorMode mode);

// Progresses `worker` until `done()` holds or `deadline` passes, sleeping on the worker's event fd
// while there is nothing to do. Returns whether done() held.
bool ProgressUntil(const UcpWorker& worker, absl::FunctionRef<bool()> done, absl::Time deadline);

}  // namespace refit::transport::ucx

#endif  // REFIT_TRANSPORT_UCX_UCX_HANDLES_H_
