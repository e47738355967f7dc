#include "refitctl/common_flags.h"

#include <cstdlib>
#include <filesystem>

#include "absl/flags/flag.h"
#include "common/control_connect.h"

ABSL_FLAG(std::string, address, "",
          "refitd's control-plane address, unix:PATH or HOST:PORT (default: $REFITD_ADDRESS, else "
          "unix:/run/refitd/refitd.sock)");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
ABSL_FLAG(std::string, model_config, "",
          "the model's config.json, where the spec's expert counts, heads and vocabulary come from (default: the "
          "checkpoint's config.json, when it has one)");

namespace refit::refitctl {

std::string DaemonAddress() {
  std::string address = absl::GetFlag(FLAGS_address);
  if (!address.empty()) return address;
  const char* env = std::getenv("REFITD_ADDRESS");
  return env != nullptr && *env != '\0' ? env : kDefaultControlAddress;
}

std::string ModelConfigPathFor(const std::string& checkpoint) {
  std::string path = absl::GetFlag(FLAGS_model_config);
  if (path.empty() && !checkpoint.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::is_directory(checkpoint, ec) ? fs::path(checkpoint) : fs::path(checkpoint).parent_path();
    const fs::path candidate = (dir.empty() ? fs::path(".") : dir) / "config.json";
    if (fs::exists(candidate, ec)) path = candidate.string();
  }
  return path;
}

absl::StatusOr<std::optional<spec::ModelConfig>> ModelConfigFor(const std::string& checkpoint) {
  const std::string path = ModelConfigPathFor(checkpoint);
  if (path.empty()) return std::nullopt;
  absl::StatusOr<spec::ModelConfig> config = spec::LoadModelConfigFile(path);
  if (!config.ok()) return config.status();
  return std::optional<spec::ModelConfig>(std::move(*config));
}

}  // namespace refit::refitctl
