// A real refitd child process for unit tests that talk to the daemon itself: serving model "toy"
// (every tensor `format: auto`) on a Unix socket in a fresh temporary directory, its log there,
// stopped with SIGTERM (and the directory removed) when the object goes. `binary` is the refitd
// the test was built with (a REFITD_BINARY compile definition).
#ifndef REFIT_TESTS_UNIT_REFITD_PROCESS_H_
#define REFIT_TESTS_UNIT_REFITD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

extern char** environ;

namespace refit::testing {

class RefitdProcess {
 public:
  explicit RefitdProcess(const char* binary, const std::string& extra_config = "") {
    char tmpl[] = "/tmp/refit-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/spec.yaml") << "model: toy\ndefaults:\n  format: auto\n";
    address_ = "unix:" + dir_ + "/refitd.sock";
    std::ofstream(dir_ + "/refitd.yaml") << "listen: " << address_ << "\nmodel_spec: " << dir_ << "/spec.yaml\n"
                                         << extra_config;
    std::string cfg = dir_ + "/refitd.yaml";
    log_ = dir_ + "/refitd.log";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> argv = {const_cast<char*>(binary), const_cast<char*>("--config"), cfg.data(), nullptr};
    EXPECT_EQ(posix_spawn(&pid_, binary, &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    // The socket file appears at bind(), before listen(): wait for refitd to say it listens.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (Log().find("event=listening") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_NE(Log().find("event=listening"), std::string::npos) << "refitd did not start:\n" << Log();
  }
  ~RefitdProcess() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    std::filesystem::remove_all(dir_);
  }
  RefitdProcess(const RefitdProcess&) = delete;
  RefitdProcess& operator=(const RefitdProcess&) = delete;

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

 private:
  std::string dir_, address_, log_;
  pid_t pid_ = 0;
};

}  // namespace refit::testing

#endif  // REFIT_TESTS_UNIT_REFITD_PROCESS_H_
