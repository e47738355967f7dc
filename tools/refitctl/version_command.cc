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
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(address);
  if (c.ok()) {
    absl::StatusOr<client::DaemonStatus> s = (*c)->Status();
    if (s.ok()) {
      model = s->model;
    } else {
      error = std::string(s.status().message());
    }
  } else {
    error = std::string(c.status().message());
  }
  const bool reachable = error.empty();
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json daemon = {{"address", address}, {"reachable", reachable}};
    if (reachable) {
      daemon["model"] = model;
    } else {
      daemon["error"] = error;
    }
    std::cout << nlohmann::json{{"ok", reachable}, {"client", {{"version", kVersion}, {"commit", kGitCommit}}},
                                {"daemon", daemon}}
                     .dump()
              << "\n";
  } else {
    std::cout << "refitctl " << ClientVersion() << "\n"
              << "refitd    " << address << ": "
              << (reachable ? absl::StrCat("reachable, model ", model) : absl::StrCat("unreachable (", error, ")"))
              << "\n";
  }
  return reachable ? kExitOk : kExitFailure;
}

}  // namespace refit::refitctl
