// Temporary files of a unit test process: in a folder of the process's own under the test
// temporary folder, removed when the process exits. ctest runs the tests as parallel processes
// (possibly of several users) that share one temporary folder, so fixed names there collide.
#ifndef REFIT_TESTS_UNIT_TEMP_PATH_H_
#define REFIT_TESTS_UNIT_TEMP_PATH_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace refit::test_util {

inline std::filesystem::path ProcessTempDir() {
  return std::filesystem::path(::testing::TempDir()) / ("refit-test." + std::to_string(getpid()));
}

// `name` in this process's temporary folder (created on first use).
inline std::string TempPath(const std::string& name) {
  static const bool made = [] {
    std::filesystem::create_directories(ProcessTempDir());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ProcessTempDir(), ec);
    });
    return true;
  }();
  (void)made;
  return (ProcessTempDir() / name).string();
}

}  // namespace refit::test_util

#endif  // REFIT_TESTS_UNIT_TEMP_PATH_H_
