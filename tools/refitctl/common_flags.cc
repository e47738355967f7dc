#include "refitctl/common_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "common/control_connect.h"

ABSL_FLAG(std::string, address, "",
          "refitd's control-plane address, unix:PATH or HOST:PORT (default: $REFITD_ADDRESS, else "
          "unix:/run/refitd/refitd.sock)");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");

namespace refit::refitctl {

std::string DaemonAddress() {
  std::string address = absl::GetFlag(FLAGS_address);
  if (!address.empty()) return address;
  const char* env = std::getenv("REFITD_ADDRESS");
  return env != nullptr && *env != '\0' ? env : kDefaultControlAddress;
}

}  // namespace refit::refitctl
