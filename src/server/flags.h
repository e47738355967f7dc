// refitd's command line: the flags, --help and --version (src/common/command_line.h parses).
//
//   refitd [--config FILE] [--listen ADDR] [--model-spec FILE] [--admin-listen ADDR] [--print-config]
//
// Threading: ParseCommandLine runs once, in main(), before any other thread exists.
#ifndef REFIT_SERVER_FLAGS_H_
#define REFIT_SERVER_FLAGS_H_

#include <optional>
#include <string>

namespace refit::server {

struct CommandLine {
  std::string config_path;   // --config; empty: the embedded default configuration
  std::string listen;        // --listen; empty: the config's `listen`
  std::string model_spec;    // --model-spec; empty: the config's `model_spec`
  std::string model_config;  // --model-config; empty: the config's `model_config`
  std::string admin_listen;  // --admin-listen; empty: the config's `admin.listen`
  bool print_config = false;
  // Set when main() should return it at once: 0 after --help or --version (printed to stdout),
  // 2 after a usage error (printed to stderr with the usage, naming the offending argument).
  std::optional<int> exit_code;
};

CommandLine ParseCommandLine(int argc, char** argv);

// "refitd 0.1.0 (commit abc1234, RelWithDebInfo, cuda: no, failpoints: compiled out)"
std::string VersionLine();

}  // namespace refit::server

#endif  // REFIT_SERVER_FLAGS_H_
