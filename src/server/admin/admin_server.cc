#include "server/admin/admin_server.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kj/compat/url.h"
#include "kj/debug.h"

namespace refit::admin {

class AdminServer::Service final : public kj::HttpService {
 public:
  Service(const AdminContent& content, const kj::HttpHeaderTable& table, kj::HttpHeaderId allow)
      : content_(content), table_(table), allow_(allow) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override {
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
  kj::Promise<void> Send(Response& response, AdminResponse r) {
    kj::HttpHeaders headers(table_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, kj::StringPtr(r.content_type.c_str()));
    if (!r.allow.empty()) headers.set(allow_, kj::StringPtr(r.allow.c_str()));
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
};

kj::Promise<absl::StatusOr<std::unique_ptr<AdminServer>>> AdminServer::Listen(
    kj::Network& network, kj::Timer& timer, const AdminOptions& options, AdminContent content) {
  using Result = absl::StatusOr<std::unique_ptr<AdminServer>>;
  const std::string address = options.listen_address;
  return network.parseAddress(kj::StringPtr(address.c_str()))
      .then(
          [&timer, address, content = std::move(content)](
              kj::Own<kj::NetworkAddress> bound) mutable -> Result {
            kj::Own<kj::ConnectionReceiver> listener;
            KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { listener = bound->listen(); })) {
              return absl::UnavailableError(absl::StrCat("admin listen address '", address,
                                                         "': cannot listen: ",
                                                         e->getDescription().cStr()));
            }
            return std::make_unique<AdminServer>(timer, kj::mv(listener), std::move(content));
          },
          [address](kj::Exception&& e) -> Result {
            return absl::InvalidArgumentError(absl::StrCat(
                "admin listen address '", address, "': ", e.getDescription().cStr()));
          });
}

AdminServer::AdminServer(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> listener,
                         AdminContent content)
    : AdminServer(timer, kj::mv(listener), std::move(content), kj::HttpHeaderTable::Builder()) {}

AdminServer::AdminServer(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> listener,
                         AdminContent content, kj::HttpHeaderTable::Builder&& headers)
    : content_(std::move(content)),
      allow_header_(headers.add("Allow")),
      header_table_(headers.build()),
      listener_(kj::mv(listener)),
      port_(static_cast<uint16_t>(listener_->getPort())),
      service_(kj::heap<Service>(content_, *header_table_, allow_header_)),
      http_(kj::heap<kj::HttpServer>(timer, *header_table_, *service_)),
      listen_task_(http_->listenHttp(*listener_).eagerlyEvaluate([](kj::Exception&& e) {
        KJ_LOG(ERROR, "admin endpoint stopped accepting connections", e);
      })) {}

AdminServer::~AdminServer() = default;

kj::Promise<void> AdminServer::Drain() { return http_->drain(); }

}  // namespace refit::admin
