// refitd: the refit daemon. One per rollout node, next to the inference engine.
//
//   refitd [--config FILE] [--listen ADDR] [--model-spec FILE] [--print-config]
//
// Without --config it runs the embedded default configuration (unix:/run/refitd/refitd.sock, the
// demo model spec). SIGTERM/SIGINT: abort any active session, stop listening, exit 0. SIGHUP: reload
// the TLS certificate files (docs/security.md).
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "kj/async-io.h"
#include "kj/async-unix.h"
#include "metrics/refit_metrics.h"
#include "metrics/registry.h"
#include "server/admin/admin_server.h"
#include "common/failpoint.h"
#include "common/tls_context.h"
#include "server/config.h"
#include "server/connection_limits.h"
#include "server/control_listener.h"
#include "server/daemon_metrics.h"
#include "server/daemon_service.h"
#include "server/log.h"
#include "server/socket_dir.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "transport/ucx/ucx_receiver.h"
#if REFIT_HAVE_NCCL
#include "transport/nccl/nccl_receiver.h"
#endif

namespace {

int Usage() {
  std::fprintf(stderr, "usage: refitd [--config FILE] [--listen ADDR] [--model-spec FILE] [--print-config]\n");
  return 2;
}

int Fail(absl::string_view msg) {
  refit::server::Log(refit::server::LogLevel::kError, absl::StrCat("event=fatal error=\"", msg, "\""));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace refit;
  // Before any thread exists (UCX starts some): every thread inherits the blocked mask, so the
  // signals reach the event loop instead of killing the process.
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  kj::UnixEventPort::captureSignal(SIGHUP);  // reloads the TLS files; ignored (logged) without TLS
  signal(SIGPIPE, SIG_IGN);
  std::string config_path, listen, model_spec;
  bool print_config = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    if (a == "--config") {
      if (!value(config_path)) return Usage();
    } else if (a == "--listen") {
      if (!value(listen)) return Usage();
    } else if (a == "--model-spec") {
      if (!value(model_spec)) return Usage();
    } else if (a == "--print-config") {
      print_config = true;
    } else {
      return Usage();
    }
  }
  absl::StatusOr<server::Config> config =
      config_path.empty() ? absl::StatusOr<server::Config>(server::DefaultConfig()) : server::LoadConfigFile(config_path);
  if (!config.ok()) return Fail(config.status().message());
  if (!listen.empty()) config->listen = listen;
  if (!model_spec.empty()) {
    config->model_spec = model_spec;
    config->model_spec_inline.clear();
  }
  if (!config->model_spec.empty() && !config_path.empty() && std::filesystem::path(config->model_spec).is_relative() &&
      model_spec.empty()) {
    config->model_spec = (std::filesystem::path(config_path).parent_path() / config->model_spec).string();
  }
  server::LogLevel level;
  if (!server::ParseLogLevel(config->log_level, level)) return Fail(absl::StrCat("unknown log_level '", config->log_level, "'"));
  server::SetLogLevel(level);

  absl::StatusOr<spec::ModelSpec> spec = config->model_spec.empty()
                                             ? spec::ParseModelSpec(config->model_spec_inline, "<embedded demo spec>")
                                             : spec::LoadModelSpecFile(config->model_spec);
  if (!spec.ok()) return Fail(spec.status().message());
  if (print_config) {
    std::printf("listen: %s\nmodel: %s\nrules: %zu\n", config->listen.c_str(), spec->model.c_str(), spec->rules.size());
    return 0;
  }

  // Access control: refuse to start with a control plane nobody could use safely.
  server::AccessPolicy access;
  access.allowed_uids.insert(static_cast<uint32_t>(getuid()));
  for (uint32_t uid : config->allowed_uids) access.allowed_uids.insert(uid);
  if (!config->token_file.empty()) {
    std::ifstream in(config->token_file);
    std::getline(in, access.token);
    if (!in && access.token.empty()) return Fail(absl::StrCat("cannot read access.token_file '", config->token_file, "'"));
    if (access.token.size() < 16) return Fail("access.token_file: the token must be at least 16 bytes");
  }
  const bool unix_socket = config->listen.rfind("unix:", 0) == 0;
  if (!unix_socket && access.token.empty() && config->tls_client_ca.empty()) {
    return Fail(absl::StrCat("listen '", config->listen,
                             "' is TCP: set access.token_file (a shared secret) or tls.client_ca (mutual TLS), "
                             "or listen on a unix: socket"));
  }
  // TLS for the TCP control plane (docs/security.md). Relative paths are relative to the config.
  TlsFiles tls_files;
  kj::Own<kj::TlsContext> tls;
  if (!config->tls_cert.empty()) {
    if (unix_socket) {
      return Fail(absl::StrCat("tls: is set, but listen '", config->listen,
                               "' is a unix: socket; TLS applies to a TCP listen address"));
    }
    auto resolve = [&](const std::string& p) {
      if (p.empty() || config_path.empty() || !std::filesystem::path(p).is_relative()) return p;
      return (std::filesystem::path(config_path).parent_path() / p).string();
    };
    tls_files.cert = resolve(config->tls_cert);
    tls_files.key = resolve(config->tls_key);
    tls_files.trust_ca = resolve(config->tls_client_ca);
    tls_files.cert_setting = "tls.cert";
    tls_files.key_setting = "tls.key";
    tls_files.trust_ca_setting = "tls.client_ca";
    absl::StatusOr<TlsContextAndSummary> ctx = NewServerTlsContext(tls_files);
    if (!ctx.ok()) return Fail(ctx.status().message());
    tls = kj::mv(ctx->context);
    server::Log(server::LogLevel::kInfo,
                absl::StrCat("event=tls_loaded subject=\"", ctx->summary.cert_subject, "\" not_after=\"",
                             ctx->summary.cert_not_after, "\" client_cas=", ctx->summary.trusted_cas));
    access.tls_client_certs = !config->tls_client_ca.empty();
  } else if (!config->tls_client_ca.empty()) {
    return Fail("tls.client_ca is set without tls.cert and tls.key");
  }
  gid_t socket_gid = static_cast<gid_t>(-1);
  if (!config->socket_group.empty()) {
    struct group* g = getgrnam(config->socket_group.c_str());
    if (g == nullptr) return Fail(absl::StrCat("socket_group '", config->socket_group, "' does not exist"));
    socket_gid = g->gr_gid;
  }

  std::unique_ptr<FailpointSet> failpoints;
#if defined(REFIT_FAILPOINTS) && REFIT_FAILPOINTS
  if (const char* fp = std::getenv("REFIT_FAILPOINTS"); fp != nullptr && *fp != '\0') {
    absl::StatusOr<std::unique_ptr<FailpointSet>> parsed = FailpointSet::Parse(fp);
    if (!parsed.ok()) return Fail(absl::StrCat("REFIT_FAILPOINTS: ", parsed.status().message()));
    failpoints = std::move(*parsed);
    server::Log(server::LogLevel::kWarn, absl::StrCat("event=failpoints_armed spec=\"", fp, "\""));
  }
#endif

  // The data plane: UCX into pinned host slots, or NCCL into slots on the engine's GPU.
  std::unique_ptr<transport::Receiver> receiver;
  std::unique_ptr<storage::Memory> slot_memory;
  if (config->transport == "nccl") {
#if REFIT_HAVE_NCCL
    transport::NcclOptions nccl;
    nccl.device = config->data_device;
    nccl.listen_host = config->data_host;
    absl::StatusOr<std::unique_ptr<transport::NcclReceiver>> r = transport::NcclReceiver::Listen(nccl);
    if (!r.ok()) return Fail(absl::StrCat("data plane: ", r.status().message()));
    receiver = std::move(*r);
    absl::StatusOr<std::unique_ptr<storage::Memory>> device = storage::NewDeviceMemory(config->data_device);
    if (!device.ok()) return Fail(absl::StrCat("bucket ring: ", device.status().message()));
    slot_memory = std::move(*device);
#else
    return Fail("data_plane.transport is nccl, but this refitd was built without NCCL");
#endif
  } else {
    transport::UcxOptions ucx;
    ucx.tls = config->ucx_tls;
    ucx.listen_host = config->data_host;
    absl::StatusOr<std::unique_ptr<transport::UcxReceiver>> r = transport::UcxReceiver::Listen(ucx);
    if (!r.ok()) return Fail(absl::StrCat("data plane: ", r.status().message()));
    receiver = std::move(*r);
    // Bucket slots in pinned host memory (UCX receives into them; device staging copies from them).
    slot_memory = storage::NewPinnedHostMemory();
  }

  auto io = kj::setupAsyncIo();
  metrics::Registry registry;
  metrics::BuildInfo build{REFIT_VERSION, REFIT_GIT_COMMIT, REFIT_BUILD_TYPE, REFIT_WITH_CUDA != 0};
  absl::StatusOr<metrics::RefitMetrics> refit_metrics = metrics::RefitMetrics::Register(registry, build);
  if (!refit_metrics.ok()) return Fail(refit_metrics.status().message());
  absl::StatusOr<server::ListenerMetrics> listener_metrics = server::ListenerMetrics::Register(registry);
  if (!listener_metrics.ok()) return Fail(listener_metrics.status().message());
  absl::StatusOr<std::unique_ptr<BucketRing>> ring =
      BucketRing::Create(config->limits.bucket_slots, config->limits.bucket_bytes, *slot_memory);
  if (!ring.ok()) return Fail(absl::StrCat("bucket ring: ", ring.status().message()));
  server::DaemonState state(*config, std::move(*spec), std::move(receiver), std::move(*ring), *io.lowLevelProvider,
                            io.provider->getTimer(), server::MetricsHooks(*refit_metrics, config->transport));
  state.failpoints = std::move(failpoints);
  refit_metrics->engine_registered->Set(0);

  std::unique_ptr<admin::AdminServer> admin_server;
  if (!config->admin_listen.empty()) {
    admin::AdminContent content;
    content.registry = &registry;
    content.build = build;
    content.readiness = [&state]() -> absl::Status {
      if (!state.engine) return absl::UnavailableError("no engine registered");
      if (state.engine->dirty) return absl::UnavailableError("engine weights dirty after a failed commit");
      return absl::OkStatus();
    };
    absl::StatusOr<admin::AdminOptions> options = server::AdminOptionsFromConfig(*config, *listener_metrics);
    if (!options.ok()) return Fail(options.status().message());
    absl::StatusOr<std::unique_ptr<admin::AdminServer>> a =
        admin::AdminServer::Listen(io.provider->getNetwork(), io.provider->getTimer(), *options, content)
            .wait(io.waitScope);
    if (!a.ok()) return Fail(absl::StrCat("admin endpoint: ", a.status().message()));
    admin_server = std::move(*a);
  }

  capnp::ReaderOptions reader;
  reader.traversalLimitInWords = config->max_message_words;
  const bool with_tls = tls.get() != nullptr;
  server::ControlListener rpc(server::MakeDaemon(state), reader, std::move(access), io.provider->getTimer(),
                              kj::mv(tls), server::ConnectionLimitsFromConfig(*config), *listener_metrics);
  // Certificate rotation: on SIGHUP, new connections use the files' current contents; a file that
  // fails to load keeps the previous certificate (and is logged).
  std::function<kj::Promise<void>()> reload_on_hup = [&]() -> kj::Promise<void> {
    return io.unixEventPort.onSignal(SIGHUP).then([&](siginfo_t) {
      if (!with_tls) {
        server::Log(server::LogLevel::kInfo, "event=sighup_ignored reason=\"no tls: configured, nothing to reload\"");
        return reload_on_hup();
      }
      absl::StatusOr<TlsContextAndSummary> next = NewServerTlsContext(tls_files);
      if (!next.ok()) {
        server::Log(server::LogLevel::kError, absl::StrCat("event=tls_reload_failed error=\"", next.status().message(),
                                                           "\" (keeping the previous certificate)"));
      } else {
        rpc.ReplaceTls(kj::mv(next->context));
        server::Log(server::LogLevel::kInfo,
                    absl::StrCat("event=tls_reloaded subject=\"", next->summary.cert_subject, "\" not_after=\"",
                                 next->summary.cert_not_after, "\" client_cas=", next->summary.trusted_cas));
      }
      return reload_on_hup();
    });
  };
  kj::Promise<void> reloading = reload_on_hup().eagerlyEvaluate(nullptr);
  std::string address = config->listen;
  std::string unix_path;
  if (address.rfind("unix:", 0) == 0) {
    unix_path = address.substr(5);
    if (absl::Status ok = server::PrepareSocketPath(unix_path); !ok.ok()) return Fail(ok.message());
  }
  kj::Own<kj::ConnectionReceiver> listener;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    auto addr = io.provider->getNetwork().parseAddress(address).wait(io.waitScope);
    listener = addr->listen();
  })) {
    return Fail(absl::StrCat("cannot listen on '", address, "': ", e->getDescription().cStr()));
  }
  if (!unix_path.empty()) {
    if (socket_gid != static_cast<gid_t>(-1) && chown(unix_path.c_str(), static_cast<uid_t>(-1), socket_gid) != 0) {
      return Fail(absl::StrCat("cannot give ", unix_path, " to group '", config->socket_group, "': ", std::strerror(errno)));
    }
    if (chmod(unix_path.c_str(), config->socket_mode) != 0) {
      return Fail(absl::StrCat("cannot chmod ", unix_path, ": ", std::strerror(errno)));
    }
  }
  server::Log(server::LogLevel::kInfo,
              absl::StrCat("event=listening control=", address, with_tls ? " tls=on" : "", " data=", state.receiver->Endpoint(),
                           " model=", state.spec.model, " pid=", getpid(),
                           admin_server ? absl::StrCat(" admin_port=", admin_server->port()) : ""));
  std::fflush(stdout);

  auto serving = rpc.Listen(*listener, unix_socket);
  auto stop = io.unixEventPort.onSignal(SIGTERM).exclusiveJoin(io.unixEventPort.onSignal(SIGINT));
  siginfo_t info = stop.exclusiveJoin(serving.then([]() -> siginfo_t { return {}; })).wait(io.waitScope);
  server::Log(server::LogLevel::kInfo, absl::StrCat("event=shutdown signal=", info.si_signo));
  // Aborting ends a session that is still receiving (a commit waiting for buckets ends too). A
  // commit past that point, in its window, runs to the engine's resume (or its failure) before
  // refitd exits, so a shutdown never leaves the engine paused with half-copied weights.
  // Bounded: a stuck engine cannot hold the shutdown forever.
  if (state.active) {
    state.active->session->Abort("daemon shutting down");
    if (!state.active->committing) {
      RefitReport r = state.active->session->Report();
      r.outcome = "aborted";
      r.reason = "daemon shutting down";
      state.EndSession(r);
    }
  }
  for (int i = 0; i < 3000 && state.active && state.active->committing; ++i) {
    io.provider->getTimer().afterDelay(10 * kj::MILLISECONDS).wait(io.waitScope);
  }
  if (!unix_path.empty()) unlink(unix_path.c_str());
  return 0;
}
