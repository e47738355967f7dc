#include "server/admin/admin_routes.h"

#include "metrics/text_format.h"
#include "nlohmann/json.hpp"

namespace refit::admin {
namespace {

constexpr std::string_view kPlainText = "text/plain; charset=utf-8";

AdminResponse Text(int status, std::string body) {
  return {status, std::string(kPlainText), std::move(body), ""};
}

AdminResponse Version(const metrics::BuildInfo& build) {
  nlohmann::json j = {
      {"name", "refitd"},
      {"version", build.version},
      {"git_commit", build.git_commit},
      {"build_type", build.build_type},
      {"cuda", build.cuda},
  };
  // Replace rather than throw on invalid UTF-8: build strings come from the build system.
  return {200, "application/json",
          j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", ""};
}

}  // namespace

AdminResponse RouteAdminRequest(std::string_view method, std::string_view path,
                                const AdminContent& content) {
  const bool known = path == "/metrics" || path == "/healthz" || path == "/readyz" ||
                     path == "/version";
  if (!known) return Text(404, "not found\n");
  if (method != "GET") {
    AdminResponse r = Text(405, "method not allowed\n");
    r.allow = "GET";
    return r;
  }
  if (path == "/metrics") {
    std::string body = content.registry != nullptr ? metrics::FormatText(*content.registry) : "";
    return {200, std::string(metrics::kTextFormatContentType), std::move(body), ""};
  }
  if (path == "/healthz") return Text(200, "ok\n");
  if (path == "/readyz") {
    absl::Status ready = content.readiness ? content.readiness() : absl::OkStatus();
    if (ready.ok()) return Text(200, "ready\n");
    return Text(503, "not ready: " + std::string(ready.message()) + "\n");
  }
  return Version(content.build);
}

std::string_view StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 503:
      return "Service Unavailable";
  }
  return "Unknown";
}

}  // namespace refit::admin
