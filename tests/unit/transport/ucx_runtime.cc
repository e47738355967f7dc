#include "ucx_runtime.h"

#include <dlfcn.h>
#include <ucp/api/ucp.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace refit::transport::testing {

std::string UcxRuntimeVersion() { return ucp_get_version_string(); }

std::string UcxRuntimeLibrary() {
  // Looked up at run time: the address of a function taken in this binary may be a stub of the
  // binary itself, not the library's code.
  void* symbol = dlsym(RTLD_DEFAULT, "ucp_get_version_string");
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

std::string UcxRuntimeMismatch() {
  const char* expected = std::getenv("REFIT_EXPECT_UCX_VERSION");
  if (expected == nullptr || *expected == '\0') return "";
  std::string version = UcxRuntimeVersion();
  if (version == expected) return "";
  return absl::StrCat("running against UCX ", version, " (", UcxRuntimeLibrary(),
                      "), but REFIT_EXPECT_UCX_VERSION is ", expected,
                      ": the UCX matrix would test the wrong UCX");
}

}  // namespace refit::transport::testing
