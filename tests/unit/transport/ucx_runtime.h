// Which UCX a test process really runs against. The UCX matrix (tools/ucx-matrix) runs the UCX
// tests with another UCX's libraries first on LD_LIBRARY_PATH and names the version they must
// find in $REFIT_EXPECT_UCX_VERSION; a test that silently ran against the UCX it was built with
// would prove nothing about the other one.
//
// Threading: any thread.
#ifndef REFIT_TESTS_UNIT_TRANSPORT_UCX_RUNTIME_H_
#define REFIT_TESTS_UNIT_TRANSPORT_UCX_RUNTIME_H_

#include <string>

namespace refit::transport::testing {

// ucp_get_version_string() of the loaded libucp, e.g. "1.16.0".
std::string UcxRuntimeVersion();
// The file the loaded libucp was mapped from.
std::string UcxRuntimeLibrary();

// Empty when $REFIT_EXPECT_UCX_VERSION is unset or equals UcxRuntimeVersion(); otherwise why the
// test must fail.
std::string UcxRuntimeMismatch();

}  // namespace refit::transport::testing

#endif  // REFIT_TESTS_UNIT_TRANSPORT_UCX_RUNTIME_H_
