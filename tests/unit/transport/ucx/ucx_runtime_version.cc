// Prints "<version> <path of libucp>" for the UCX this process loads. tools/ucx-matrix runs it in
// a matrix test's environment before the test, to check that the test will load the intended UCX.
#include <cstdio>

#include "../ucx_runtime.h"

int main() {
  using namespace refit::transport::testing;
  std::printf("%s %s\n", UcxRuntimeVersion().c_str(), UcxRuntimeLibrary().c_str());
  return 0;
}
