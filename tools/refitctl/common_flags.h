// Flags that several refitctl commands accept: --address (which refitd) and --json (output).
#ifndef REFIT_TOOLS_REFITCTL_COMMON_FLAGS_H_
#define REFIT_TOOLS_REFITCTL_COMMON_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(bool, json);

namespace refit::refitctl {

// --address, else $REFITD_ADDRESS, else unix:/run/refitd/refitd.sock.
std::string DaemonAddress();

}  // namespace refit::refitctl

#endif  // REFIT_TOOLS_REFITCTL_COMMON_FLAGS_H_
