#include "server/admin/admin_server.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kj/compat/url.h"
#include "kj/debug.h"

namespace refit::admin {
namespace {

// Compares in time independent of where the values differ.
bool BearerTokenMatches(std::string_view header, const std::string& token) {
  constexpr std::string_view kScheme = "Bearer ";
  if (header.size() != kScheme.size() + token.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < kScheme.size(); ++i) diff |= static_cast<unsigned char>(header[i] ^ kScheme[i]);
  for (size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(header[kScheme.size() + i] ^ token[i]);
  }
  return diff == 0;
}

}  // namespace

class AdminServer::Service final : public kj::HttpService {
 public:
  Service(const AdminContent& content, const kj::HttpHeaderTable& table, kj::HttpHeaderId allow,
          const std::string& token, kj::HttpHeaderId authorization, kj::HttpHeaderId www_authenticate)
      : content_(content),
        table_(table),
        allow_(allow),
        token_(token),
        authorization_(authorization),
        www_authenticate_(www_authenticate) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override {
    if (!token_.empty()) {
      std::string_view given;
      KJ_IF_MAYBE(value, headers.get(authorization_)) { given = std::string_view(value->cStr(), value->size()); }
      if (!BearerTokenMatches(given, token_)) {
        AdminResponse denied{401, "text/plain; charset=utf-8",
                             "unauthorized: send \"Authorization: Bearer TOKEN\" (admin.token_file)\n", ""};
        return Send(response, std::move(denied), true);
      }
    }
    KJ_IF_MAYBE(parsed, kj::Url::tryParse(url, kj::Url::HTTP_REQUEST)) {
      std::string path = "/";
      for (size_t i = 0; i < parsed->path.size(); ++i) {
        if (i > 0) path += '/';
        path.append(parsed->path[i].cStr(), parsed->path[i].size());
      }
      if (parsed->hasTrailingSlash && !parsed->path.empty()) path += '/';
      const kj::String method_name = kj::str(method);
      return Send(response, RouteAdminRequest(std::string_view(method_name.cStr(),
                                                                method_name.size()),
                                              path, content_));
    }
    return Send(response, {400, "text/plain; charset=utf-8", "bad request target\n", ""});
  }

 private:
  kj::Promise<void> Send(Response& response, AdminResponse r, bool challenge = false) {
    kj::HttpHeaders headers(table_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, kj::StringPtr(r.content_type.c_str()));
    if (!r.allow.empty()) headers.set(allow_, kj::StringPtr(r.allow.c_str()));
    if (challenge) headers.set(www_authenticate_, "Bearer realm=\"refitd\"");
    const std::string_view reason = StatusText(r.status);
    kj::String reason_text = kj::heapString(reason.data(), reason.size());
    kj::String body = kj::heapString(r.body.data(), r.body.size());
    kj::Own<kj::AsyncOutputStream> stream =
        response.send(static_cast<uint>(r.status), reason_text, headers, body.size());
    kj::Promise<void> written = stream->write(body.begin(), body.size());
    return written.attach(kj::mv(stream), kj::mv(body));
  }

  const AdminContent& content_;
  const kj::HttpHeaderTable& table_;
  const kj::HttpHeaderId allow_;
  const std::string& token_;
  const kj::HttpHeaderId authorization_;
  const kj::HttpHeaderId www_authenticate_;
};

kj::Promise<absl::StatusOr<std::unique_ptr<AdminServer>>> AdminServer::Listen(
    kj::Network& network, kj::Timer& timer, const AdminOptions& options, AdminContent content) {
  using Result = absl::StatusOr<std::unique_ptr<AdminServer>>;
  const std::string address = options.listen_address;
  return network.parseAddress(kj::StringPtr(address.c_str()))
      .then(
          [&timer, address, options, content = std::move(content)](
              kj::Own<kj::NetworkAddress> bound) mutable -> Result {
            kj::Own<kj::ConnectionReceiver> listener;
            KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { listener = bound->listen(); })) {
              return absl::UnavailableError(absl::StrCat("admin listen address '", address,
                                                         "': cannot listen: ",
                                                         e->getDescription().cStr()));
            }
            return std::make_unique<AdminServer>(timer, kj::mv(listener), std::move(content), options);
          },
          [address](kj::Exception&& e) -> Result {
            return absl::InvalidArgumentError(absl::StrCat(
                "admin listen address '", address, "': ", e.getDescription().cStr()));
          });
}

AdminServer::AdminServer(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> listener,
                         AdminContent content, AdminOptions options)
    : AdminServer(timer, kj::mv(listener), std::move(content), std::move(options),
                  kj::HttpHeaderTable::Builder()) {}

AdminServer::AdminServer(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> listener,
                         AdminContent content, AdminOptions options, kj::HttpHeaderTable::Builder&& headers)
    : timer_(timer),
      content_(std::move(content)),
      options_(std::move(options)),
      allow_header_(headers.add("Allow")),
      authorization_header_(headers.add("Authorization")),
      www_authenticate_header_(headers.add("WWW-Authenticate")),
      header_table_(headers.build()),
      listener_(kj::mv(listener)),
      port_(static_cast<uint16_t>(listener_->getPort())),
      service_(kj::heap<Service>(content_, *header_table_, allow_header_, options_.token, authorization_header_,
                                 www_authenticate_header_)),
      http_(kj::heap<kj::HttpServer>(timer, *header_table_, *service_)),
      connections_(ignore_errors_),
      listen_task_(AcceptLoop().eagerlyEvaluate([](kj::Exception&& e) {
        KJ_LOG(ERROR, "admin endpoint stopped accepting connections", e);
      })) {}

AdminServer::~AdminServer() = default;

void AdminServer::Warn(const std::string& line) {
  if (options_.warn) {
    options_.warn(line);
  } else {
    KJ_LOG(WARNING, line.c_str());
  }
}

kj::Promise<void> AdminServer::AcceptLoop() {
  // accept() may throw EMFILE synchronously; that goes to AcceptFailed like a rejected promise.
  kj::Maybe<kj::Promise<kj::Own<kj::AsyncIoStream>>> accepted;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { accepted = listener_->accept(); })) {
    return AcceptFailed(kj::mv(*e));
  }
  return KJ_ASSERT_NONNULL(accepted)
      .then(
          [this](kj::Own<kj::AsyncIoStream>&& connection) {
            if (open_ >= options_.max_connections) {
              // Closed at once (dropping it): idle connections must not hold every descriptor.
              if (options_.refused_connections != nullptr) options_.refused_connections->Inc();
              if (refused_logged_++ % 100 == 0) {
                Warn(absl::StrCat("event=connection_refused listener=admin reason=\"admin.max_connections (",
                                  options_.max_connections, ") reached\" refused=", refused_logged_));
              }
            } else {
              ++open_;
              if (options_.open_connections != nullptr) options_.open_connections->Set(open_);
              connections_.add(http_->listenHttp(kj::mv(connection)).attach(kj::defer([this]() {
                --open_;
                if (options_.open_connections != nullptr) options_.open_connections->Set(open_);
              })));
            }
            return AcceptLoop();
          },
          [this](kj::Exception&& e) { return AcceptFailed(kj::mv(e)); });
}

kj::Promise<void> AdminServer::AcceptFailed(kj::Exception&& e) {
  if (options_.accept_errors != nullptr) options_.accept_errors->Inc();
  if (accept_errors_logged_++ % 100 == 0) {
    Warn(absl::StrCat("event=accept_failed listener=admin open_connections=", open_, " backoff_ms=100 errors=",
                      accept_errors_logged_, " error=\"", e.getDescription().cStr(), "\""));
  }
  return timer_.afterDelay(100 * kj::MILLISECONDS).then([this]() { return AcceptLoop(); });
}

kj::Promise<void> AdminServer::Drain() {
  listen_task_ = kj::Promise<void>(kj::READY_NOW);  // stop accepting
  return http_->drain();
}

}  // namespace refit::admin
