#include "refitctl/version_command.h"

#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#include "common/version.h"
#include "nlohmann/json.hpp"
#include "refitctl/common_flags.h"

namespace refit::refitctl {
namespace {

std::string ClientVersion() {
  return absl::StrCat(kVersion, " (commit ", kGitCommit, ", ", kBuildType, ")");
}

}  // namespace

int RunVersionLine() {
  std::cout << "refitctl " << ClientVersion() << "\n";
  return kExitOk;
}

int RunVersion(std::span<const std::string> args) {
  const std::string address = DaemonAddress();
  std::string model, error;
  std::string daemon_version, daemon_commit;
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(address);
  if (c.ok()) {
    absl::StatusOr<client::DaemonStatus> s = (*c)->Status();
    if (s.ok()) {
      model = s->model;
      daemon_version = s->daemon_version;
      daemon_commit = s->daemon_commit;
    } else {
      error = std::string(s.status().message());
    }
  } else {
    error = std::string(c.status().message());
  }
  const bool reachable = error.empty();
  // A daemon older than DaemonStatus.daemonVersion answers without one.
  const std::string shown_version = daemon_version.empty() ? "unknown (the daemon does not report it)" : daemon_version;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json daemon = {{"address", address}, {"reachable", reachable}};
    if (reachable) {
      daemon["version"] = daemon_version.empty() ? nlohmann::json(nullptr) : nlohmann::json(daemon_version);
      daemon["commit"] = daemon_commit.empty() ? nlohmann::json(nullptr) : nlohmann::json(daemon_commit);
      daemon["model"] = model;
    } else {
      daemon["error"] = error;
    }
    std::cout << nlohmann::json{{"ok", reachable},
                                {"client", {{"version", kVersion}, {"commit", kGitCommit}, {"build_type", kBuildType}}},
                                {"daemon", daemon}}
                     .dump()
              << "\n";
  } else {
    std::cout << "refitctl " << ClientVersion() << "\n";
    if (reachable) {
      std::cout << "refitd   " << shown_version
                << (daemon_commit.empty() ? "" : absl::StrCat(" (commit ", daemon_commit, ")")) << " at " << address
                << ", model " << model << "\n";
    } else {
      std::cout << "refitd   unreachable at " << address << ": " << error
                << " (only the client version is known; exit status 1)\n";
    }
  }
  return reachable ? kExitOk : kExitFailure;
}

}  // namespace refit::refitctl
