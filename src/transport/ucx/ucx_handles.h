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

// ucp_request_free. Holds a request returned by a *_nbx call (never NULL or an error pointer).
class UcpRequest : public MoveOnlyHandle<void*> {
 public:
  using MoveOnlyHandle::MoveOnlyHandle;
  UcpRequest(UcpRequest&&) = default;
  UcpRequest& operator=(UcpRequest&&) = default;
  ~UcpRequest();
  // UCS_INPROGRESS until the operation completed; then its final status.
  ucs_status_t Check() const { return ucp_request_check_status(h_); }
};

// The result of starting a non-blocking operation: done at once (status set, no request), failed
// at once, or in flight (request set).
struct Started {
  ucs_status_t status = UCS_OK;
  UcpRequest request;
  bool in_flight() const { return static_cast<bool>(request); }
};
Started StartFromPtr(ucs_status_ptr_t ptr);

// Closes the endpoint: ucp_ep_close_nbx in force mode, progressing the worker until it is done.
// An orderly (flushing) close is started explicitly with BeginClose.
class UcpEndpoint : public MoveOnlyHandle<ucp_ep_h> {
 public:
  UcpEndpoint() = default;
  UcpEndpoint(ucp_ep_h ep, ucp_worker_h worker) : MoveOnlyHandle(ep), worker_(worker) {}
  UcpEndpoint(UcpEndpoint&& o) noexcept
      : MoveOnlyHandle(std::move(o)), worker_(std::exchange(o.worker_, nullptr)) {}
  UcpEndpoint& operator=(UcpEndpoint&& o) noexcept {
    MoveOnlyHandle::operator=(std::move(o));
    std::swap(worker_, o.worker_);
    return *this;
  }
  ~UcpEndpoint();
  // Starts closing (flags: 0 = flush first, UCP_EP_CLOSE_FLAG_FORCE = drop). The handle is empty
  // afterwards; the returned request tracks the close.
  Started BeginClose(uint32_t flags);

 private:
  ucp_worker_h worker_ = nullptr;
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
