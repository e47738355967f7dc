#include "transport/ucx/ucx_handles.h"

#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <ucs/config/global_opts.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/hot_wait.h"

namespace refit::transport::ucx {

void KeepUntilExit(const void* handle) {
  static auto* mu = new absl::Mutex;
  static auto* kept = new std::vector<const void*>;
  absl::MutexLock lock(mu);
  kept->push_back(handle);
}

absl::Status UcsError(ucs_status_t status, std::string_view what) {
  std::string message = absl::StrCat(std::string(what), ": ", ucs_status_string(status));
  switch (status) {
    case UCS_OK:
      return absl::OkStatus();
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_OUT_OF_RANGE:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_ELEM:
    case UCS_ERR_ALREADY_EXISTS:
      return absl::FailedPreconditionError(message);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_BUSY:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_NO_PROGRESS:
    case UCS_ERR_SHMEM_SEGMENT:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

UcpConfig::~UcpConfig() {
  if (h_) ucp_config_release(h_);
}

absl::StatusOr<UcpConfig> UcpConfig::FromOptions(const UcxOptions& options) {
  ucp_config_t* raw = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw); st != UCS_OK) {
    return UcsError(st, "ucp_config_read");
  }
  UcpConfig config(raw);
  auto set = [&](const std::string& name, const std::string& value) -> absl::Status {
    if (ucs_status_t st = ucp_config_modify(raw, name.c_str(), value.c_str()); st != UCS_OK) {
      return UcsError(st, absl::StrCat("UCX option ", name, "=", value));
    }
    return absl::OkStatus();
  };
  if (options.tls.empty()) return absl::InvalidArgumentError("UCX option tls is empty");
  if (options.keepalive_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("UCX option keepalive_interval must be positive");
  }
  absl::Status st = set("TLS", options.tls);
  if (st.ok()) st = set("NET_DEVICES", options.net_devices.empty() ? "all" : options.net_devices);
  if (st.ok()) {
    st = set("KEEPALIVE_INTERVAL",
             absl::StrCat(absl::ToInt64Milliseconds(options.keepalive_interval), "ms"));
  }
  // Indirect request IDs let UCP track every request that waits for its peer (a rendezvous send
  // waiting for the receiver to fetch the data) on its endpoint, and complete those in error when
  // the endpoint fails. UCX turns them on only with peer error handling ("auto"); without it
  // (kConnectionManager) such a send to a receiver that died stays in flight for good, keeping its
  // buffer registered until ucp_cleanup, which UCX 1.16+ asserts on.
  if (st.ok()) st = set("PROTO_INDIRECT_ID", "on");
  for (const auto& [name, value] : options.extra_config) {
    if (!st.ok()) break;
    st = set(name, value);
  }
  if (!st.ok()) return st;
  // ucp_config_modify accepts names it does not know; check the extras against the settings
  // the context really has, so a misspelt name fails instead of being ignored.
  if (!options.extra_config.empty()) {
    char* text = nullptr;
    size_t size = 0;
    FILE* stream = open_memstream(&text, &size);
    if (stream == nullptr) return absl::InternalError("open_memstream failed");
    ucp_config_print(raw, stream, nullptr, UCS_CONFIG_PRINT_CONFIG);
    fclose(stream);
    std::string printed = absl::StrCat("\n", std::string(text, size));
    free(text);
    for (const auto& [name, value] : options.extra_config) {
      if (printed.find(absl::StrCat("\nUCX_", name, "=")) == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("UCX option ", name, ": not a UCP context setting"));
      }
    }
  }
  return config;
}

UcpContext::~UcpContext() {
  if (h_) ucp_cleanup(h_);
}

absl::StatusOr<UcpContext> UcpContext::Create(const UcxOptions& options, std::string_view name) {
  absl::StatusOr<UcpConfig> config = UcpConfig::FromOptions(options);
  if (!config.ok()) return config.status();
  std::string name_str(name);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = name_str.c_str();
  ucp_context_h raw = nullptr;
  if (ucs_status_t st = ucp_init(&params, config->get(), &raw); st != UCS_OK) {
    return UcsError(st, absl::StrCat("ucp_init (tls=", options.tls, ")"));
  }
  return UcpContext(raw);
}

UcpWorker::~UcpWorker() {
  if (h_) ucp_worker_destroy(h_);
}

absl::StatusOr<UcpWorker> UcpWorker::Create(ucp_context_h context, ucs_thread_mode_t mode) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = mode;
  ucp_worker_h raw = nullptr;
  if (ucs_status_t st = ucp_worker_create(context, &params, &raw); st != UCS_OK) {
    return UcsError(st, "ucp_worker_create");
  }
  UcpWorker worker(raw);
  // A UCX configured without --enable-mt grants a lower mode than asked for and only says so at
  // diagnostic log level; the receiver's worker, used by two threads, would then race inside UCX
  // (an assertion-enabled UCX aborts in its tcp transport).
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  if (ucs_status_t st = ucp_worker_query(raw, &attr); st != UCS_OK) {
    return UcsError(st, "ucp_worker_query");
  }
  if (attr.thread_mode < mode) {
    return absl::FailedPreconditionError(absl::StrCat(
        "UCX ", ucp_get_version_string(),
        " grants no multi-threaded worker: it was built without thread support (configure "
        "--enable-mt)"));
  }
  if (ucs_status_t st = ucp_worker_get_efd(raw, &worker.efd_); st != UCS_OK) {
    return UcsError(st, "ucp_worker_get_efd");
  }
  return worker;
}

UcpListener::~UcpListener() {
  if (h_) ucp_listener_destroy(h_);
}

UcpRequest::~UcpRequest() {
  if (h_ == nullptr) return;
  if (Check() == UCS_INPROGRESS) {
    ucp_request_cancel(worker_->get(), h_);
    ProgressUntil(
        *worker_, [this] { return Check() != UCS_INPROGRESS; },
        absl::Now() + kRequestDrainTimeout);
  }
  // Past the timeout UCX frees the request itself if it ever completes; until then it keeps what
  // the request uses, and reports it when the worker and context are destroyed.
  ucp_request_free(h_);
}

Started StartFromPtr(ucs_status_ptr_t ptr, const UcpWorker& worker) {
  Started started;
  if (ptr == nullptr) return started;
  if (UCS_PTR_IS_ERR(ptr)) {
    started.status = UCS_PTR_STATUS(ptr);
    return started;
  }
  started.status = UCS_INPROGRESS;
  started.request = UcpRequest(ptr, worker);
  return started;
}

Started UcpEndpoint::BeginClose(uint32_t flags) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = flags;
  return StartFromPtr(ucp_ep_close_nbx(release(), &param), *worker_);
}

Started UcpEndpoint::BeginClose() { return BeginClose(0); }

Started UcpEndpoint::BeginForcedClose() {
  return BeginClose(err_mode_ == UCP_ERR_HANDLING_MODE_PEER ? UCP_EP_CLOSE_FLAG_FORCE : 0);
}

UcpEndpoint::~UcpEndpoint() {
  if (!h_) return;
  // Destroying the close request progresses the worker until the close is done (UcpRequest).
  Started close = BeginForcedClose();
}

absl::Status SetUcxLogLevel(std::string_view level) {
  std::string value(level);
  if (ucs_status_t st = ucs_global_opts_set_value("LOG_LEVEL", value.c_str()); st != UCS_OK) {
    return UcsError(st, absl::StrCat("UCX log level \"", value, "\""));
  }
  return absl::OkStatus();
}

ucp_err_handling_mode_t ErrHandlingMode(UcxErrorMode mode) {
  return mode == UcxErrorMode::kPeer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
}

bool ProgressUntil(const UcpWorker& worker, absl::FunctionRef<bool()> done, absl::Time deadline) {
  // Bounds a single sleep so that a missed wakeup costs at most this much latency.
  constexpr int kMaxSleepMs = 100;
  for (;;) {
    if (done()) return true;
    if (ucp_worker_progress(worker.get()) != 0) continue;
    if (done()) return true;
    absl::Time now = absl::Now();
    if (now >= deadline) return false;
    if (RefitHot()) {
      sched_yield();  // progress again rather than sleep (common/hot_wait.h)
      continue;
    }
    ucs_status_t armed = ucp_worker_arm(worker.get());
    if (armed == UCS_ERR_BUSY) continue;
    int64_t left_ms = deadline == absl::InfiniteFuture()
                          ? kMaxSleepMs
                          : absl::ToInt64Milliseconds(absl::Ceil(deadline - now, absl::Milliseconds(1)));
    int timeout_ms = static_cast<int>(std::clamp<int64_t>(left_ms, 0, kMaxSleepMs));
    if (armed != UCS_OK) timeout_ms = std::min(timeout_ms, 1);
    pollfd fd{worker.event_fd(), POLLIN, 0};
    poll(&fd, 1, timeout_ms);
  }
}

}  // namespace refit::transport::ucx
