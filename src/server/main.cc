// refitd: the refit daemon. One per rollout node, next to the inference engine.
//
//   refitd [--config FILE] [--listen ADDR] [--model-spec FILE] [--admin-listen ADDR] [--print-config]
//   refitd --help | --version
//
// Without --config it runs the embedded default configuration (unix:/run/refitd/refitd.sock, the
// demo model spec). SIGTERM/SIGINT: abort any active session, stop listening, exit 0 (during start-up,
// before the data plane exists, they end refitd at once). SIGHUP: re-read the config file's log
// level and reload the TLS certificate files (docs/operations.md, docs/security.md). Under systemd
// (Type=notify, sd_notify.h): READY=1 once the control socket listens, WATCHDOG=1 pings while the
// event loop runs.
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "capnp/rpc-twoparty.h"
#include "common/bounded_file.h"
#include "common/busy_poll.h"
#include "common/cpu_profile.h"
#include "common/failpoint.h"
#include "common/hot_wait.h"
#include "common/tls_context.h"
#include "common/version.h"
#include "kj/async-io.h"
#include "kj/async-unix.h"
#include "metrics/process_metrics.h"
#include "metrics/refit_metrics.h"
#include "metrics/registry.h"
#include "server/admin/admin_server.h"
#include "server/config.h"
#include "server/connection_limits.h"
#include "server/control_listener.h"
#include "server/daemon_metrics.h"
#include "server/daemon_service.h"
#include "server/flags.h"
#include "server/group_join.h"
#include "server/log.h"
#include "server/sd_notify.h"
#include "server/socket_dir.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "transport/builtin_transports.h"
#include "transport/registry.h"

namespace {

int Fail(absl::string_view msg) {
  refit::server::LogEvent(refit::server::LogLevel::kError, "fatal").Add("error", msg);
  return 1;
}

// SIGHUP: the config file's log level applies from now on; an unreadable or invalid file keeps
// the current level (and is logged). Nothing else of the config is re-read.
void ReloadLogLevel(const std::string& config_path, const refit::transport::TransportRegistry& transports) {
  using refit::server::LogEvent;
  using refit::server::LogLevel;
  if (config_path.empty()) return;
  absl::StatusOr<refit::server::Config> next = refit::server::LoadConfigFile(config_path, transports);
  LogLevel level = refit::server::GetLogLevel();
  if (!next.ok() || !refit::server::ParseLogLevel(next->log_level, level)) {
    LogEvent(LogLevel::kError, "log_reload_failed")
        .Add("error", next.ok() ? "invalid log.level" : next.status().message())
        .Add("keeping", refit::server::LogLevelName(refit::server::GetLogLevel()));
    return;
  }
  refit::server::SetLogLevel(level);
  LogEvent(LogLevel::kInfo, "log_reloaded").Add("level", refit::server::LogLevelName(level));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace refit;
#ifndef __SANITIZE_ADDRESS__
  // A crash (SIGSEGV, SIGABRT, ...) writes the signal and a symbolized stack trace to stderr,
  // the log, then ends refitd by the same signal. Sanitizer builds keep the sanitizer's report.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions{});
#endif
  // Before any thread exists (UCX starts some): every thread inherits the blocked mask, so the
  // signals reach the event loop instead of killing the process.
  // SIGTERM/SIGINT are captured further down, just before the data plane starts: until then
  // (parsing the config and the model spec) their default action ends refitd at once.
  kj::UnixEventPort::captureSignal(SIGHUP);  // re-reads the log level, reloads the TLS files
  signal(SIGPIPE, SIG_IGN);
  // The system's Abseil is built without NDEBUG, so each absl::Mutex lock and unlock would also
  // update the deadlock detector's graph of lock orders, a process-wide structure under a lock of
  // its own; staging one tensor takes several locks, a MoE refit tens of thousands of tensors.
  // The test suite keeps the check (REFIT_LOCK_ORDER_CHECK=1, tests/harness); refitd skips it.
  if (const char* check = std::getenv("REFIT_LOCK_ORDER_CHECK"); check == nullptr || std::string_view(check) != "1") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  StartCpuProfileFromEnv();  // REFIT_CPU_PROFILE: written at exit (common/cpu_profile.h)
  const server::CommandLine command_line = server::ParseCommandLine(argc, argv);
  if (command_line.exit_code) return *command_line.exit_code;
  const std::string& config_path = command_line.config_path;
  const std::string& listen = command_line.listen;
  const std::string& model_spec = command_line.model_spec;
  const bool print_config = command_line.print_config;
  const transport::TransportRegistry transports = transport::BuiltinTransports();
  absl::StatusOr<server::Config> config = config_path.empty()
                                              ? absl::StatusOr<server::Config>(server::DefaultConfig(transports))
                                              : server::LoadConfigFile(config_path, transports);
  if (!config.ok()) return Fail(config.status().message());
  if (!listen.empty()) config->listen = listen;
  if (!command_line.admin_listen.empty()) config->admin_listen = command_line.admin_listen;
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
  server::LogFormat log_format;
  if (!server::ParseLogFormat(config->log_format, log_format)) {
    return Fail(absl::StrCat("unknown log.format '", config->log_format, "'"));
  }
  server::SetLogFormat(log_format);

  // The model's config.json: the sizes the spec leaves to the model (docs/config.md).
  if (!command_line.model_config.empty()) {
    config->model_config = command_line.model_config;
  } else if (!config->model_config.empty() && !config_path.empty() &&
             std::filesystem::path(config->model_config).is_relative()) {
    config->model_config = (std::filesystem::path(config_path).parent_path() / config->model_config).string();
  }
  std::optional<spec::ModelConfig> model_config;
  if (!config->model_config.empty()) {
    absl::StatusOr<spec::ModelConfig> c = spec::LoadModelConfigFile(config->model_config);
    if (!c.ok()) return Fail(absl::StrCat("model_config: ", c.status().message()));
    model_config = std::move(*c);
  }
  const spec::LoadOptions spec_options{.model_config = model_config ? &*model_config : nullptr};
  absl::StatusOr<spec::ModelSpec> spec =
      config->model_spec.empty()
          ? spec::ParseModelSpec(config->model_spec_inline, "<embedded demo spec>", "", spec_options)
          : spec::LoadModelSpecFile(config->model_spec, spec_options);
  if (!spec.ok()) return Fail(spec.status().message());
  if (!spec->unresolved.empty() && !print_config) {
    // Sizes only Megatron-core pushes need: refitd serves checkpoint names without them.
    server::LogEvent(server::LogLevel::kWarn, "model_sizes_unresolved")
        .Add("sizes", absl::StrJoin(spec->unresolved, ", "))
        .Add("reason", "the spec leaves them to the model's config.json and no model_config was given; "
                       "Megatron-core pushes that need them are refused");
  }
  if (print_config) {
    std::printf("listen: %s\nmodel: %s\nrules: %zu\ntensor_parallel: %s\n", config->listen.c_str(), spec->model.c_str(),
                spec->rules.size(), spec::TensorParallelText(*spec).c_str());
    if (!spec->model_config.empty()) std::printf("model_config: %s\n", spec->model_config.c_str());
    return 0;
  }

  // Access control: refuse to start with a control plane nobody could use safely.
  server::AccessPolicy access;
  access.allowed_uids.insert(static_cast<uint32_t>(getuid()));
  for (uint32_t uid : config->allowed_uids) access.allowed_uids.insert(uid);
  if (!config->token_file.empty()) {
    absl::StatusOr<std::string> token = ReadBoundedFile(config->token_file, 64 << 10, "access.token_file");
    if (!token.ok()) return Fail(token.status().message());
    access.token = token->substr(0, token->find('\n'));
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
    server::LogEvent(server::LogLevel::kInfo, "tls_loaded")
        .Add("subject", ctx->summary.cert_subject)
        .Add("not_after", ctx->summary.cert_not_after)
        .Add("client_cas", ctx->summary.trusted_cas);
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

  // Test builds only (REFIT_TESTING): a release build ignores REFIT_FAILPOINTS.
  absl::StatusOr<std::unique_ptr<FailpointSet>> armed = ArmFailpointsFromEnvironment();
  if (!armed.ok()) return Fail(absl::StrCat("REFIT_FAILPOINTS: ", armed.status().message()));
  std::unique_ptr<FailpointSet> failpoints = std::move(*armed);
  if (failpoints) {
    server::LogEvent(server::LogLevel::kWarn, "failpoints_armed").Add("spec", std::getenv("REFIT_FAILPOINTS"));
  }

  // systemd's notify socket, when refitd runs as a Type=notify unit (null otherwise).
  absl::StatusOr<std::unique_ptr<server::ServiceNotifier>> notifier = server::ServiceNotifier::FromEnvironment();
  if (!notifier.ok()) return Fail(notifier.status().message());

  // From here on the event loop handles them (before any thread exists: UCX starts some, and
  // every thread inherits the blocked mask, so the signals reach the event loop).
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);

  // The data plane: the configured transport's receiver, and bucket slots in the memory its
  // payloads live in (the config parser checked that the transport exists).
  const transport::TransportDescriptor* data_plane = transports.Find(config->transport);
  if (data_plane == nullptr) return Fail(absl::StrCat("data_plane.transport '", config->transport, "' is not built in"));
  transport::ListenConfig listen_config;
  listen_config.host = config->data_host;
  listen_config.device = config->data_device;
  listen_config.keys = config->transport_keys;
  listen_config.failpoints = failpoints.get();
  absl::StatusOr<std::unique_ptr<transport::Receiver>> receiver = data_plane->listen(listen_config);
  if (!receiver.ok()) return Fail(absl::StrCat("data plane: ", receiver.status().message()));
  absl::StatusOr<std::unique_ptr<storage::Memory>> slot_memory = data_plane->bucket_memory(config->data_device);
  if (!slot_memory.ok()) return Fail(absl::StrCat("bucket ring: ", slot_memory.status().message()));

  auto io = kj::setupAsyncIo();
  metrics::Registry registry;
  metrics::BuildInfo build{kVersion, kGitCommit, kBuildType, kWithCuda};
  absl::StatusOr<metrics::RefitMetrics> refit_metrics = metrics::RefitMetrics::Register(registry, build);
  if (!refit_metrics.ok()) return Fail(refit_metrics.status().message());
  absl::StatusOr<server::ListenerMetrics> listener_metrics = server::ListenerMetrics::Register(registry);
  if (!listener_metrics.ok()) return Fail(listener_metrics.status().message());
  if (absl::Status st = metrics::RegisterProcessMetrics(registry); !st.ok()) return Fail(st.message());
  absl::StatusOr<std::unique_ptr<BucketRing>> ring =
      BucketRing::Create(config->limits.bucket_slots, config->limits.bucket_bytes, **slot_memory);
  if (!ring.ok()) return Fail(absl::StrCat("bucket ring: ", ring.status().message()));
  server::DaemonState state(*config, std::move(*spec), std::move(*receiver), std::move(*ring), *io.lowLevelProvider,
                            io.provider->getTimer(), server::MetricsHooks(*refit_metrics, config->transport),
                            std::move(failpoints));
  refit_metrics->engine_registered->Set(0);

  std::unique_ptr<admin::AdminServer> admin_server;
  if (!config->admin_listen.empty()) {
    admin::AdminContent content;
    content.registry = &registry;
    content.build = build;
    content.readiness = [&state]() -> absl::Status { return state.node.Ready(); };
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
      ReloadLogLevel(config_path, transports);
      if (!with_tls) return reload_on_hup();
      absl::StatusOr<TlsContextAndSummary> next = NewServerTlsContext(tls_files);
      if (!next.ok()) {
        server::LogEvent(server::LogLevel::kError, "tls_reload_failed")
            .Add("error", next.status().message())
            .Add("keeping", "the previous certificate");
      } else {
        rpc.ReplaceTls(kj::mv(next->context));
        server::LogEvent(server::LogLevel::kInfo, "tls_reloaded")
            .Add("subject", next->summary.cert_subject)
            .Add("not_after", next->summary.cert_not_after)
            .Add("client_cas", next->summary.trusted_cas);
      }
      return reload_on_hup();
    });
  };
  kj::Promise<void> reloading = reload_on_hup().eagerlyEvaluate(nullptr);
  const bool busy_poll = BusyPollWanted(config->busy_poll);
  std::string address = config->listen;
  std::string unix_path;
  if (address.rfind("unix:", 0) == 0) {
    unix_path = address.substr(5);
    if (absl::Status ok = server::PrepareSocketPath(unix_path); !ok.ok()) return Fail(ok.message());
  }
  kj::Own<kj::ConnectionReceiver> listener;
  // A unix socket exists from the listen on: until the chown and chmod below it is its owner's
  // alone, whatever the process's umask, so that nobody else connects in between.
  const mode_t umask_before = unix_path.empty() ? 0 : umask(0177);
  auto listened = kj::runCatchingExceptions([&]() {
    auto addr = io.provider->getNetwork().parseAddress(address).wait(io.waitScope);
    listener = addr->listen();
  });
  if (!unix_path.empty()) umask(umask_before);
  KJ_IF_MAYBE(e, listened) {
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
  {
    server::LogEvent listening(server::LogLevel::kInfo, "listening");
    listening.Add("control", address);
    if (with_tls) listening.Add("tls", "on");
    listening.Add("data", state.receiver->Endpoint()).Add("model", state.spec.model).Add("pid", getpid());
    listening.Add("busy_poll", busy_poll);
    if (admin_server) listening.Add("admin_port", admin_server->port());
  }
  std::fflush(stdout);
  // systemd (Type=notify): ready now that connections are accepted; watchdog pings from here on.
  kj::Promise<void> watchdog = kj::READY_NOW;
  if (*notifier) {
    if (absl::Status st = (*notifier)->Notify("READY=1"); !st.ok()) return Fail(st.message());
    if ((*notifier)->watchdog_usec()) {
      watchdog = server::PingWatchdog(**notifier, io.provider->getTimer()).eagerlyEvaluate(nullptr);
    }
  }

  // An engine group's member asks its peers which version the group serves (late join), again
  // while none answers.
  state.tasks.add(server::JoinGroupAtStart(&state));
  auto serving = rpc.Listen(*listener, unix_socket);
  auto stop = io.unixEventPort.onSignal(SIGTERM).exclusiveJoin(io.unixEventPort.onSignal(SIGINT));
  auto finished = stop.exclusiveJoin(serving.then([]() -> siginfo_t { return {}; })).fork();
  if (busy_poll) {
    // While a refit is in flight the loop spins, and so do the threads its bytes cross
    // (common/hot_wait.h); otherwise it blocks until a begin heats it.
    auto ended = finished.addBranch().ignoreResult().fork();
    WaitBusyPolling(
        ended, io.waitScope,
        [&state] {
          const bool hot = state.Hot();
          SetRefitHot(hot);
          return hot;
        },
        [&state] { return state.OnHeat(); });
    SetRefitHot(false);
  }
  siginfo_t info = finished.addBranch().wait(io.waitScope);
  server::LogEvent(server::LogLevel::kInfo, "shutdown").Add("signal", info.si_signo);
  if (*notifier) (void)(*notifier)->Notify("STOPPING=1");
  // Aborting ends a session that is still receiving (a commit waiting for buckets ends too). A
  // commit past that point, in its window, runs to the engine's resume (or its failure, bounded
  // by the engine timeouts) before refitd exits, and its outcome is logged.
  if (!state.Drain(io.waitScope)) {
    server::LogEvent(server::LogLevel::kError, "shutdown_with_commit_running").Add("reason", "the engine timeouts passed");
    if (!unix_path.empty()) unlink(unix_path.c_str());
    std::fflush(stdout);
    std::_Exit(1);  // the commit's thread cannot be joined; the engine agent knows its state
  }
  // Every session ended: the data plane stops accepting and drops its senders, leaving to the
  // exit what cannot be freed while a trainer may still be connecting (transport.h).
  server::LogEvent(server::LogLevel::kInfo, "data_plane_closing").Add("transport", config->transport);
  state.receiver->CloseForExit();
  if (!unix_path.empty()) unlink(unix_path.c_str());
  return 0;
}
