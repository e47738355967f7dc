#include "transport/ucx/ucx_receiver.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "transport/ucx/ucx_address.h"
#include "transport/ucx/ucx_wire.h"

namespace refit::transport {

using ucx::Started;
using ucx::UcsError;

struct UcxReceiver::Peer {
  UcxReceiver* owner = nullptr;
  std::string address;  // the sender's socket address, known from the connection request
  std::string name;     // announced in its hello; empty before that
  // Acknowledgements still in flight. Declared before `ep`, so that they are freed after the
  // endpoint's close, which completes them.
  std::vector<ucx::UcpRequest> acks;
  ucx::UcpEndpoint ep;
  bool hello_ack_due = false;
  bool goodbye_ack_due = false;
  bool said_goodbye = false;
  bool ep_failed = false;
  Started close;  // set once closing started

  std::string Describe() const {
    return name.empty() ? address : absl::StrCat(name, " at ", address);
  }
};

// One Receive's request state, completed under mu_ by OnReceiveDone. Shared with orphans_ when
// the Receive returns before UCX completed its request.
struct UcxReceiver::PendingReceive {
  absl::Mutex* mu;
  bool done = false;
  bool cancel_consumed = false;
  ucs_status_t status = UCS_INPROGRESS;
  uint64_t length = 0;
};

UcxReceiver::UcxReceiver(const UcxOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<UcxReceiver>> UcxReceiver::Listen(const UcxOptions& options) {
  std::unique_ptr<UcxReceiver> receiver(new UcxReceiver(options));
  if (absl::Status st = receiver->Start(); !st.ok()) return st;
  return receiver;
}

absl::Status UcxReceiver::Start() {
  absl::StatusOr<sockaddr_in> bind_address =
      ucx::ResolveIpv4({options_.listen_host, options_.listen_port});
  if (!bind_address.ok()) return bind_address.status();

  absl::StatusOr<ucx::UcpContext> context = ucx::UcpContext::Create(options_, "refit-receiver");
  if (!context.ok()) return context.status();
  context_ = *std::move(context);
  absl::StatusOr<ucx::UcpWorker> worker =
      ucx::UcpWorker::Create(context_.get(), UCS_THREAD_MODE_MULTI);
  if (!worker.ok()) return worker.status();
  worker_ = *std::move(worker);

  for (auto [id, cb] : {std::pair{ucx::kAmHello, &UcxReceiver::OnHello},
                        std::pair{ucx::kAmGoodbye, &UcxReceiver::OnGoodbye}}) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = id;
    am.cb = cb;
    am.arg = this;
    if (ucs_status_t st = ucp_worker_set_am_recv_handler(worker_.get(), &am); st != UCS_OK) {
      return UcsError(st, "ucp_worker_set_am_recv_handler");
    }
  }

  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*bind_address);
  params.sockaddr.addrlen = sizeof(sockaddr_in);
  params.conn_handler.cb = &UcxReceiver::OnConnRequest;
  params.conn_handler.arg = this;
  ucp_listener_h listener = nullptr;
  if (ucs_status_t st = ucp_listener_create(worker_.get(), &params, &listener); st != UCS_OK) {
    return UcsError(st, absl::StrCat("UCX listen on ", options_.listen_host, ":",
                                     options_.listen_port));
  }
  listener_ = ucx::UcpListener(listener);

  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucs_status_t st = ucp_listener_query(listener, &attr); st != UCS_OK) {
    return UcsError(st, "ucp_listener_query");
  }
  uint16_t port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  endpoint_ = ucx::FormatEndpoint({options_.listen_host, port});

  progress_thread_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxReceiver::~UcxReceiver() { Close(/*for_exit=*/false); }

void UcxReceiver::CloseForExit() { Close(/*for_exit=*/true); }

void UcxReceiver::Close(bool for_exit) {
  if (closed_) return;
  closed_ = true;
  if (progress_thread_.joinable()) {
    stopping_.store(true);
    ucp_worker_signal(worker_.get());
    progress_thread_.join();
  }
  // No connection is accepted any more (OnConnRequest rejects once stopping_ is set). Freeing the
  // listener goes first, before the closes and receives below progress the worker (for up to
  // kRequestDrainTimeout), so that a trainer whose connection is dropped and reconnects at once
  // finds no listener. UCX's own race remains there: a connection it accepted before the listener
  // was freed, whose handshake arrives after, runs ucp_cm_server_conn_request_cb on the freed
  // listener and crashes the process. So an exiting process keeps the listener (CloseForExit).
  if (!for_exit) listener_ = ucx::UcpListener();
  (void)REFIT_FAILPOINT(options_.failpoints, failpoints::kDataPlaneClosing);
  // From here on this thread alone progresses the worker. Drop every connection (peers that are
  // still sending see their endpoint fail); the closes complete every request on the endpoints.
  for (auto& [ep, peer] : peers_) {
    if (!peer->ep) continue;
    if (options_.error_mode == UcxErrorMode::kConnectionManager && !peer->ep_failed) {
      // Without peer error handling the only close is orderly, and it completes once the peer
      // answered, which a sender between two sends (its worker idle) does not: it would hold this
      // destructor for the whole timeout. The receiver sends nothing but acknowledgements, so
      // such an endpoint is left to ucp_worker_destroy, as a process exit would leave it.
      peer->ep.LeaveToWorker();
      continue;
    }
    peer->close = peer->ep.BeginForcedClose();
  }
  ucx::ProgressUntil(
      worker_,
      [this] {
        for (const auto& [ep, peer] : peers_) {
          if (peer->close.in_flight() && peer->close.request.Check() == UCS_INPROGRESS) {
            return false;
          }
        }
        return true;
      },
      absl::Now() + ucx::kRequestDrainTimeout);
  peers_.clear();
  // Receives that returned before UCX gave their buffer back: cancelled and completed now, before
  // the worker and the context go (UcpRequest).
  std::vector<Orphan> orphans;
  {
    absl::MutexLock lock(&mu_);
    orphans.swap(orphans_);
  }
  orphans.clear();
  if (for_exit) {
    listener_.LeaveToExit();
    worker_.LeaveToExit();
    context_.LeaveToExit();
  }
}

std::string UcxReceiver::Endpoint() const { return endpoint_; }

void UcxReceiver::ProgressLoop() {
  while (!stopping_.load()) {
    ucx::ProgressUntil(
        worker_, [this] { return stopping_.load() || cancel_pending_.load() || drop_peers_.load() || HasPeerWork(); },
        absl::InfiniteFuture());
    ServiceCancels();
    ServicePeers();
    ReapOrphans();
  }
}

void UcxReceiver::ReapOrphans() {
  std::vector<Orphan> done;
  {
    absl::MutexLock lock(&mu_);
    if (orphans_.empty()) return;
    for (auto it = orphans_.begin(); it != orphans_.end();) {
      if (it->pending->done) {
        done.push_back(std::move(*it));
        it = orphans_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Freed outside mu_: they completed, so freeing them calls nothing back.
}

void UcxReceiver::ServiceCancels() {
  std::vector<std::pair<void*, PendingReceive*>> cancels;
  {
    absl::MutexLock lock(&mu_);
    cancels.swap(cancels_);
    cancel_pending_.store(false);
  }
  for (auto [request, pending] : cancels) {
    bool done;
    {
      absl::MutexLock lock(&mu_);
      done = pending->done;
    }
    // Completions run only on this thread, so a request not done now cannot complete meanwhile.
    if (!done) ucp_request_cancel(worker_.get(), request);
    absl::MutexLock lock(&mu_);
    pending->cancel_consumed = true;
  }
}

bool UcxReceiver::HasPeerWork() const {
  for (const auto& [ep, peer] : peers_) {
    if (peer->ep && (peer->ep_failed || peer->hello_ack_due || peer->goodbye_ack_due)) {
      return true;
    }
    if (!peer->ep && (!peer->close.in_flight() || peer->close.request.Check() != UCS_INPROGRESS)) {
      return true;
    }
  }
  return false;
}

bool UcxReceiver::ServicePeers() {
  bool worked = false;
  if (drop_peers_.exchange(false)) {
    // Closed below like a failed endpoint; the sender's pending Send fails.
    for (auto& [ep, peer] : peers_) {
      if (peer->ep) peer->ep_failed = true;
    }
  }
  for (auto it = peers_.begin(); it != peers_.end();) {
    Peer& peer = *it->second;
    if (peer.ep && !peer.ep_failed) {
      for (auto [due, id] : {std::pair{&peer.hello_ack_due, ucx::kAmHelloAck},
                             std::pair{&peer.goodbye_ack_due, ucx::kAmGoodbyeAck}}) {
        if (!*due) continue;
        *due = false;
        worked = true;
        ucp_request_param_t param{};
        Started ack =
            ucx::StartFromPtr(ucp_am_send_nbx(peer.ep.get(), id, nullptr, 0, nullptr, 0, &param), worker_);
        if (ack.in_flight()) peer.acks.push_back(std::move(ack.request));
      }
    }
    std::erase_if(peer.acks, [](const ucx::UcpRequest& ack) { return ack.Check() != UCS_INPROGRESS; });
    if (peer.ep && peer.ep_failed) {
      // UCX requires an endpoint that reported an error to be closed (in force mode where the
      // endpoint has peer error handling).
      peer.close = peer.ep.BeginForcedClose();
      worked = true;
    }
    if (!peer.ep && (!peer.close.in_flight() || peer.close.request.Check() != UCS_INPROGRESS)) {
      it = peers_.erase(it);
      worked = true;
      continue;
    }
    ++it;
  }
  return worked;
}

UcxReceiver::Peer* UcxReceiver::FindPeer(ucp_ep_h ep) {
  auto it = peers_.find(ep);
  return it == peers_.end() ? nullptr : it->second.get();
}

void UcxReceiver::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<UcxReceiver*>(arg);
  if (self->stopping_.load()) {
    ucp_listener_reject(self->listener_.get(), request);
    return;
  }
  auto peer = std::make_unique<Peer>();
  peer->owner = self;
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  peer->address = ucp_conn_request_query(request, &attr) == UCS_OK
                      ? ucx::SockaddrToString(reinterpret_cast<sockaddr*>(&attr.client_address))
                      : "unknown address";
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = ucx::ErrHandlingMode(self->options_.error_mode);
  params.err_handler.cb = &UcxReceiver::OnPeerError;
  params.err_handler.arg = peer.get();
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(self->worker_.get(), &params, &ep) != UCS_OK) {
    // UCX rejected the request itself; the sender sees its connection fail.
    return;
  }
  peer->ep = ucx::UcpEndpoint(ep, self->worker_, params.err_mode);
  self->peers_[ep] = std::move(peer);
}

void UcxReceiver::OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->ep_failed = true;
  if (peer->said_goodbye) return;  // an orderly close: the sender is done with us
  UcxReceiver* self = peer->owner;
  absl::MutexLock lock(&self->mu_);
  if (self->failure_.empty()) {
    self->failure_ = absl::StrCat("UCX peer ", peer->Describe(), " of ", self->endpoint_,
                                  " failed: ", ucs_status_string(status));
  }
}

ucs_status_t UcxReceiver::OnHello(void* arg, const void* header, size_t header_length,
                                  void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxReceiver*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  Peer* peer = self->FindPeer(param->reply_ep);
  if (peer == nullptr) return UCS_OK;
  peer->name.assign(static_cast<const char*>(header),
                    std::min<size_t>(header_length, ucx::kMaxPeerNameBytes));
  peer->hello_ack_due = true;
  return UCS_OK;
}

ucs_status_t UcxReceiver::OnGoodbye(void* arg, const void* header, size_t header_length,
                                    void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxReceiver*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  Peer* peer = self->FindPeer(param->reply_ep);
  if (peer == nullptr) return UCS_OK;
  peer->said_goodbye = true;
  peer->goodbye_ack_due = true;
  return UCS_OK;
}

void UcxReceiver::OnReceiveDone(void* request, ucs_status_t status,
                                const ucp_tag_recv_info_t* info, void* arg) {
  auto* pending = static_cast<PendingReceive*>(arg);
  absl::MutexLock lock(pending->mu);
  pending->status = status;
  pending->length = (status == UCS_OK && info != nullptr) ? info->length : 0;
  pending->done = true;
}

absl::StatusOr<uint64_t> UcxReceiver::Receive(uint64_t tag, void* dst, uint64_t capacity,
                                              absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError(absl::StrCat("UCX receive of tag ", tag, " cancelled"));
    if (!failure_.empty()) return absl::UnavailableError(failure_);
  }
  if (stopping_.load()) return absl::UnavailableError(absl::StrCat("UCX receiver ", endpoint_, " is closed"));
  if (dst == nullptr && capacity > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX receive of tag ", tag, ": null buffer with capacity ", capacity));
  }
  char empty_buffer = 0;
  auto shared_pending = std::make_shared<PendingReceive>(PendingReceive{.mu = &mu_});
  PendingReceive& pending = *shared_pending;
  ucp_request_param_t param{};
  // Always a request and a callback, also for a message that already arrived: UCX 1.13 does not
  // report the length of an immediately completed receive through recv_info.
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &UcxReceiver::OnReceiveDone;
  param.user_data = shared_pending.get();
  Started started = ucx::StartFromPtr(
      ucp_tag_recv_nbx(worker_.get(), dst != nullptr ? dst : &empty_buffer, capacity, tag,
                       ~ucp_tag_t{0}, &param),
      worker_);

  enum class Interrupt { kNone, kDeadline, kCancel, kFailure };
  Interrupt interrupt = Interrupt::kNone;
  std::string failure;
  if (started.in_flight()) {
    // Wake the progress thread: a matched rendezvous needs it to fetch the data.
    ucp_worker_signal(worker_.get());
    struct Wait {
      UcxReceiver* self;
      PendingReceive* pending;
      static bool Ready(Wait* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->self->mu_) {
        return w->pending->done || w->self->cancelled_ || !w->self->failure_.empty();
      }
      static bool Done(Wait* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->self->mu_) {
        return w->pending->done && w->pending->cancel_consumed;
      }
    } wait{this, &pending};
    {
      mu_.LockWhenWithDeadline(absl::Condition(&Wait::Ready, &wait), deadline);
      if (!pending.done) {
        if (cancelled_) {
          interrupt = Interrupt::kCancel;
        } else if (!failure_.empty()) {
          interrupt = Interrupt::kFailure;
          failure = failure_;
        } else {
          interrupt = Interrupt::kDeadline;
        }
      }
      mu_.Unlock();
    }
    if (interrupt != Interrupt::kNone) {
      // The caller's buffer may be written until the request completes: cancel it (a no-op if
      // it already matched a message, which then completes normally) and wait for completion.
      {
        absl::MutexLock lock(&mu_);
        cancels_.emplace_back(started.request.get(), &pending);
        cancel_pending_.store(true);
      }
      ucp_worker_signal(worker_.get());
      bool released = mu_.LockWhenWithDeadline(absl::Condition(&Wait::Done, &wait),
                                               absl::Now() + options_.buffer_release_timeout);
      mu_.Unlock();
      if (!released) {
        // Matched to a message whose sender is gone and that UCX never completed. The request is
        // not freed here, which would leave UCX holding it (and dst) past the worker; the
        // progress thread frees it once it completes, the destructor cancels and completes it at
        // the latest (UcpRequest).
        std::string message = absl::StrCat("UCX receive of tag ", tag, " on ", endpoint_,
                                           ": a matched message never completed");
        absl::MutexLock lock(&mu_);
        if (failure_.empty()) failure_ = message;
        std::erase_if(cancels_, [&](const auto& c) { return c.second == &pending; });
        orphans_.push_back(Orphan{std::move(shared_pending), std::move(started.request)});
        return absl::UnavailableError(interrupt == Interrupt::kFailure ? failure : message);
      }
    }
  } else {
    pending.status = started.status;  // an error: with NO_IMM_CMPL success is always a request
  }

  switch (pending.status) {
    case UCS_OK:
      // Delivered, even if an interruption raced with it: the message is not lost.
      return pending.length;
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::InvalidArgumentError(
          absl::StrCat("UCX message with tag ", tag, " is larger than the receive buffer (",
                       capacity, " bytes); the message was dropped"));
    case UCS_ERR_CANCELED:
      switch (interrupt) {
        case Interrupt::kCancel:
          return absl::CancelledError(absl::StrCat("UCX receive of tag ", tag, " cancelled"));
        case Interrupt::kFailure:
          return absl::UnavailableError(failure);
        case Interrupt::kDeadline:
          return absl::DeadlineExceededError(
              absl::StrCat("UCX receive of tag ", tag, " on ", endpoint_, ": deadline passed"));
        case Interrupt::kNone:
          // Cancelled by UCX itself: the receive had matched a message from a peer whose
          // endpoint failed and was closed. That peer's failure is recorded by now.
          break;
      }
      [[fallthrough]];
    default: {
      // A transport error (typically the sending peer died mid-message) fails the receiver like
      // a peer failure does, until Reset().
      std::string message(
          UcsError(pending.status, absl::StrCat("UCX receive of tag ", tag, " on ", endpoint_))
              .message());
      absl::MutexLock lock(&mu_);
      if (failure_.empty()) failure_ = message;
      return absl::UnavailableError(failure_);
    }
  }
}

void UcxReceiver::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

void UcxReceiver::DisconnectPeers() {
  if (stopping_.load()) return;  // closed: no peer left, and no worker to wake after CloseForExit
  drop_peers_.store(true);
  ucp_worker_signal(worker_.get());
}

void UcxReceiver::Reset() {
  absl::MutexLock lock(&mu_);
  cancelled_ = false;
  failure_.clear();
}

}  // namespace refit::transport
