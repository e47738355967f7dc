#include "transport/ucx/ucx_sender.h"

#include <stdio.h>
#include <unistd.h>

#include <cstdlib>

#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/ucx/ucx_address.h"
#include "transport/ucx/ucx_wire.h"

namespace refit::transport {

using ucx::Started;
using ucx::UcsError;

namespace {

std::string DefaultPeerName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] != '\0' ? host : "unknown-host", ":", getpid());
}

}  // namespace

UcxSender::UcxSender(std::string_view endpoint, const UcxOptions& options)
    : endpoint_(endpoint), options_(options) {
  name_ = options.peer_name.empty() ? DefaultPeerName() : options.peer_name;
  if (name_.size() > ucx::kMaxPeerNameBytes) name_.resize(ucx::kMaxPeerNameBytes);
}

absl::StatusOr<std::unique_ptr<UcxSender>> UcxSender::Connect(std::string_view endpoint,
                                                              const UcxOptions& options) {
  std::unique_ptr<UcxSender> sender(new UcxSender(endpoint, options));
  if (absl::Status st = sender->Start(); !st.ok()) return st;
  return sender;
}

absl::Status UcxSender::Start() {
  absl::StatusOr<ucx::HostPort> host_port = ucx::ParseEndpoint(endpoint_);
  if (!host_port.ok()) return host_port.status();
  absl::StatusOr<sockaddr_in> address = ucx::ResolveIpv4(*host_port);
  if (!address.ok()) return address.status();

  absl::StatusOr<ucx::UcpContext> context = ucx::UcpContext::Create(options_, "refit-sender");
  if (!context.ok()) return context.status();
  context_ = *std::move(context);
  absl::StatusOr<ucx::UcpWorker> worker =
      ucx::UcpWorker::Create(context_.get(), UCS_THREAD_MODE_SERIALIZED);
  if (!worker.ok()) return worker.status();
  worker_ = *std::move(worker);

  for (auto [id, flag] : {std::pair{ucx::kAmHelloAck, &hello_acked_},
                          std::pair{ucx::kAmGoodbyeAck, &goodbye_acked_}}) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = id;
    am.cb = &UcxSender::OnAck;
    am.arg = flag;
    if (ucs_status_t st = ucp_worker_set_am_recv_handler(worker_.get(), &am); st != UCS_OK) {
      return UcsError(st, "ucp_worker_set_am_recv_handler");
    }
  }

  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*address);
  params.sockaddr.addrlen = sizeof(sockaddr_in);
  params.err_mode = ucx::ErrHandlingMode(options_.error_mode);
  params.err_handler.cb = &UcxSender::OnError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  if (ucs_status_t st = ucp_ep_create(worker_.get(), &params, &ep); st != UCS_OK) {
    return UcsError(st, absl::StrCat("UCX connect to ", endpoint_));
  }
  ep_ = ucx::UcpEndpoint(ep, worker_, params.err_mode);

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  hello_ = ucx::StartFromPtr(
      ucp_am_send_nbx(ep_.get(), ucx::kAmHello, name_.data(), name_.size(), nullptr, 0, &param),
      worker_);
  if (hello_.status != UCS_OK && !hello_.in_flight()) {
    return UcsError(hello_.status, absl::StrCat("UCX connect to ", endpoint_));
  }
  bool accepted = ucx::ProgressUntil(
      worker_, [this] { return hello_acked_ || Failed(); },
      absl::Now() + options_.connect_timeout);
  if (Failed()) return PeerGone("connect");
  if (!accepted) {
    return absl::UnavailableError(absl::StrCat("UCX connect to ", endpoint_, ": not accepted within ",
                                               absl::FormatDuration(options_.connect_timeout)));
  }
  return absl::OkStatus();
}

UcxSender::~UcxSender() {
  // A receiver that never acknowledged the hello does not know this sender; nothing to tell it.
  if (ep_ && hello_acked_ && !Failed()) CloseInOrder();
  // Whatever is still open is dropped. Closing completes the endpoint's requests, so the hello's
  // is done before the worker and context go.
  CloseEndpoint();
  hello_ = {};
}

void UcxSender::CloseInOrder() {
  absl::Time deadline = absl::Now() + options_.close_timeout;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  Started goodbye = ucx::StartFromPtr(
      ucp_am_send_nbx(ep_.get(), ucx::kAmGoodbye, nullptr, 0, nullptr, 0, &param), worker_);
  if (goodbye.status != UCS_OK && !goodbye.in_flight()) return;
  if (!ucx::ProgressUntil(worker_, [this] { return goodbye_acked_ || Failed(); }, deadline) ||
      Failed()) {
    // Not acknowledged: drop the connection before the goodbye request is freed, which completes
    // it.
    CloseEndpoint();
    return;
  }
  // The receiver knows we are leaving; close in order (flush, then disconnect). A close still
  // running at the deadline is waited for a little longer when its request is destroyed.
  Started close = ep_.BeginClose();
  if (close.in_flight()) {
    ucx::ProgressUntil(
        worker_, [&] { return close.request.Check() != UCS_INPROGRESS; }, deadline);
  }
}

void UcxSender::CloseEndpoint() {
  if (!ep_) return;
  Started close = ep_.BeginForcedClose();
  if (close.in_flight()) {
    ucx::ProgressUntil(
        worker_, [&] { return close.request.Check() != UCS_INPROGRESS; },
        absl::Now() + options_.close_timeout);
  }
}

absl::Status UcxSender::PeerGone(std::string_view during) const {
  return absl::UnavailableError(absl::StrCat("UCX ", std::string(during), " to receiver ", endpoint_,
                                             " failed: ", ucs_status_string(ep_status_)));
}

void UcxSender::OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxSender*>(arg);
  if (self->ep_status_ == UCS_OK) self->ep_status_ = status;
}

ucs_status_t UcxSender::OnAck(void* flag, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
  *static_cast<bool*>(flag) = true;
  return UCS_OK;
}

absl::Status UcxSender::Send(uint64_t tag, const void* src, uint64_t bytes) {
  if (Failed()) return PeerGone("send");
  if (src == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX send of tag ", tag, ": null buffer with ", bytes, " bytes"));
  }
  static const char kEmpty = 0;
  ucp_request_param_t param{};
  Started send = ucx::StartFromPtr(
      ucp_tag_send_nbx(ep_.get(), src != nullptr ? src : &kEmpty, bytes, tag, &param), worker_);
  ucs_status_t status = send.status;
  if (send.in_flight()) {
    ucx::ProgressUntil(
        worker_, [&] { return send.request.Check() != UCS_INPROGRESS || Failed(); },
        absl::InfiniteFuture());
    status = send.request.Check();
  }
  if (Failed()) {
    // UCX requires closing an endpoint that failed, and closing completes a send still in flight
    // on it (in kPeer mode the forced close purges it; in kConnectionManager mode UCX completed
    // it when it reported the failure, see PROTO_INDIRECT_ID in ucx_handles.cc). Only then may
    // the request be freed without UCX keeping `src` registered past the context.
    CloseEndpoint();
    if (send.in_flight() && status == UCS_INPROGRESS) {
      ucx::ProgressUntil(
          worker_, [&] { return send.request.Check() != UCS_INPROGRESS; },
          absl::Now() + options_.close_timeout);
      status = send.request.Check();
    }
  }
  if (status == UCS_OK) return absl::OkStatus();
  if (Failed()) return PeerGone("send");
  return absl::UnavailableError(
      UcsError(status, absl::StrCat("UCX send of tag ", tag, " to ", endpoint_)).message());
}

std::string UcxSender::DescribeLanes() const {
  if (!ep_) return "";
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "";
  ucp_ep_print_info(ep_.get(), stream);
  fclose(stream);
  std::string out(text, size);
  free(text);
  return out;
}

}  // namespace refit::transport
