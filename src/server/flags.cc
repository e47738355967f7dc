#include "server/flags.h"

#include <array>
#include <cstdio>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/failpoint.h"
#include "common/version.h"

ABSL_FLAG(std::string, config, "",
          "configuration file (docs/config.md); without it refitd runs the embedded default: "
          "unix:/run/refitd/refitd.sock and the demo model spec");
ABSL_FLAG(std::string, listen, "", "control-plane address, unix:PATH or HOST:PORT; overrides the config's `listen`");
ABSL_FLAG(std::string, model_spec, "",
          "model spec file (deploy/models/); overrides the config's `model_spec`");
ABSL_FLAG(std::string, model_config, "",
          "the served model's config.json, where the spec's expert counts, heads and vocabulary come from; "
          "overrides the config's `model_config`");
ABSL_FLAG(std::string, admin_listen, "",
          "admin HTTP address (/metrics, /healthz, /readyz, /version); overrides the config's `admin.listen`");
ABSL_FLAG(bool, print_config, false, "load the configuration and model spec, print a summary and exit");

namespace refit::server {
namespace {

constexpr std::array<std::string_view, 6> kFlags = {"config",       "listen",      "model_spec", "model_config",
                                                    "admin_listen", "print_config"};

std::string Usage() {
  return absl::StrCat("usage: refitd ", cli::FlagsSynopsis(kFlags), "\n");
}

std::string Help() {
  return absl::StrCat(
      "refitd: moves fresh weights from RL trainers into a running inference engine.\n\n", Usage(),
      "\nflags:\n", cli::FlagsHelp(kFlags),
      "  --help\n      print this help and exit\n"
      "  --version\n      print the version and exit\n\n"
      "signals: SIGTERM/SIGINT abort an active session and exit 0; SIGHUP reloads what can be reloaded\n"
      "safely (docs/operations.md, \"Reload\"). Under systemd (Type=notify) refitd reports READY=1 once\n"
      "the control socket listens, and pings the watchdog when WatchdogSec= is set.\n");
}

}  // namespace

std::string VersionLine() {
  return absl::StrCat("refitd ", kVersion, " (commit ", kGitCommit, ", ", kBuildType, ", cuda: ", kWithCuda ? "yes" : "no",
                      ", failpoints: ", kFailpointsCompiledIn ? "compiled in" : "compiled out", ")");
}

CommandLine ParseCommandLine(int argc, char** argv) {
  CommandLine out;
  std::vector<std::string_view> args(argv + 1, argv + argc);
  absl::StatusOr<cli::ParsedArgs> parsed = cli::ParseFlags(args, kFlags);
  if (!parsed.ok()) {
    std::fprintf(stderr, "refitd: %s\n%s", std::string(parsed.status().message()).c_str(), Usage().c_str());
    out.exit_code = 2;
    return out;
  }
  if (parsed->help) {
    std::fputs(Help().c_str(), stdout);
    out.exit_code = 0;
    return out;
  }
  if (parsed->version) {
    std::printf("%s\n", VersionLine().c_str());
    out.exit_code = 0;
    return out;
  }
  if (!parsed->positional.empty()) {
    std::fprintf(stderr, "refitd: unexpected argument '%s' (refitd takes flags only)\n%s",
                 parsed->positional[0].c_str(), Usage().c_str());
    out.exit_code = 2;
    return out;
  }
  out.config_path = absl::GetFlag(FLAGS_config);
  out.listen = absl::GetFlag(FLAGS_listen);
  out.model_spec = absl::GetFlag(FLAGS_model_spec);
  out.model_config = absl::GetFlag(FLAGS_model_config);
  out.admin_listen = absl::GetFlag(FLAGS_admin_listen);
  out.print_config = absl::GetFlag(FLAGS_print_config);
  return out;
}

}  // namespace refit::server
