// A small process that serves a populated metric registry through the admin endpoint, for the
// Python exposition test and the Prometheus scrape test. It prints "port=<N>" on the first line
// of stdout once listening, then serves until SIGTERM/SIGINT (or, with --exit-on-stdin-eof,
// until its stdin closes, so it cannot outlive the test that started it).
//
//   metrics_fixture [--listen=127.0.0.1:0] [--ready-file=PATH] [--exit-on-stdin-eof]
//
// /readyz answers 200 once PATH exists (always, without --ready-file).
// The values set here are asserted by tests/unit/metrics/metrics_fixture_test.py and
// tests/integration/prometheus/prometheus_scrape_test.py.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kj/async-io.h"
#include "kj/async-unix.h"
#include "metrics/refit_metrics.h"
#include "metrics/registry.h"
#include "server/admin/admin_server.h"

namespace {

using refit::metrics::RefitMetrics;
using refit::metrics::RefitPhase;
using refit::metrics::Registry;
using refit::metrics::SessionFailureReason;
using refit::metrics::SessionOutcome;

void Populate(Registry& registry, const RefitMetrics& m) {
  m.RecordSession(SessionOutcome::kCommitted, SessionFailureReason::kNone);
  m.RecordSession(SessionOutcome::kCommitted, SessionFailureReason::kNone);
  m.RecordSession(SessionOutcome::kCommitted, SessionFailureReason::kNone);
  m.RecordSession(SessionOutcome::kFailed, SessionFailureReason::kIncomplete);
  m.received_bytes_total->Labels({"ucx"}).Inc(1048576);
  m.converted_bytes_total->Labels({"nvfp4"}).Inc(262144);
  m.converted_in_place_bytes_total->Inc(131072);
  m.ObservePhase(RefitPhase::kConvert, absl::Milliseconds(20));
  m.ObservePhase(RefitPhase::kConvert, absl::Milliseconds(300));
  m.RecordCommit(7, absl::FromUnixMillis(1700000000500), absl::Microseconds(800));
  m.SetCommittedTag("step-7");
  m.staging_bytes->Set(4096);
  m.active_sessions->Set(1);
  m.engine_registered->Set(1);

  (*registry.AddCounter("fixture_escapes_total", "Help with a backslash \\ and\na newline.",
                        {"value"}))
      ->Labels({"quote\" backslash\\ newline\n end"})
      .Inc();
  (*registry.AddGauge("fixture_temperature_celsius", "A negative fraction."))
      ->Labels({})
      .Set(-12.5);
  (*registry.AddGauge("fixture_big_bytes", "A large integer."))->Labels({}).Set(123456789012345);
  refit::metrics::GaugeFamily* special =
      *registry.AddGauge("fixture_special", "Non-finite values.", {"kind"});
  special->Labels({"inf"}).Set(std::numeric_limits<double>::infinity());
  special->Labels({"minus_inf"}).Set(-std::numeric_limits<double>::infinity());
  special->Labels({"nan"}).Set(std::numeric_limits<double>::quiet_NaN());
}

}  // namespace

int main(int argc, char** argv) {
  refit::admin::AdminOptions options;
  std::string ready_file;
  bool exit_on_stdin_eof = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.starts_with("--listen=")) {
      options.listen_address = std::string(arg.substr(9));
    } else if (arg.starts_with("--ready-file=")) {
      ready_file = std::string(arg.substr(13));
    } else if (arg == "--exit-on-stdin-eof") {
      exit_on_stdin_eof = true;
    } else {
      std::fprintf(stderr, "metrics_fixture: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }

  Registry registry;
  absl::StatusOr<RefitMetrics> metrics = RefitMetrics::Register(
      registry, {"0.1.0", "fixture", "RelWithDebInfo", /*cuda=*/false});
  if (!metrics.ok()) {
    std::fprintf(stderr, "metrics_fixture: %s\n", metrics.status().ToString().c_str());
    return 1;
  }
  Populate(registry, *metrics);

  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  kj::AsyncIoContext io = kj::setupAsyncIo();

  refit::admin::AdminContent content;
  content.registry = &registry;
  content.build = {"0.1.0", "fixture", "RelWithDebInfo", false};
  if (!ready_file.empty()) {
    content.readiness = [ready_file]() -> absl::Status {
      struct stat st;
      if (::stat(ready_file.c_str(), &st) == 0) return absl::OkStatus();
      return absl::UnavailableError("ready file " + ready_file + " does not exist");
    };
  }
  absl::StatusOr<std::unique_ptr<refit::admin::AdminServer>> server =
      refit::admin::AdminServer::Listen(io.provider->getNetwork(), io.provider->getTimer(),
                                        options, std::move(content))
          .wait(io.waitScope);
  if (!server.ok()) {
    std::fprintf(stderr, "metrics_fixture: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("port=%u\n", static_cast<unsigned>((*server)->port()));
  std::fflush(stdout);

  kj::Promise<void> stop = io.unixEventPort.onSignal(SIGTERM)
                               .exclusiveJoin(io.unixEventPort.onSignal(SIGINT))
                               .ignoreResult();
  kj::Own<kj::AsyncInputStream> stdin_stream;
  if (exit_on_stdin_eof) {
    stdin_stream = io.lowLevelProvider->wrapInputFd(STDIN_FILENO);
    stop = stop.exclusiveJoin(stdin_stream->readAllBytes().ignoreResult());
  }
  stop.wait(io.waitScope);
  return 0;
}
