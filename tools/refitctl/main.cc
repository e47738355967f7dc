// refitctl: command-line tool for refitd. Subcommands are listed in one table below.
#include <array>
#include <iostream>
#include <string_view>
#include <vector>

#include "refitctl/command.h"
#include "refitctl/convert_command.h"
#include "refitctl/ops_commands.h"
#include "refitctl/quantize_command.h"

namespace refit::refitctl {
namespace {

constexpr std::array<Command, 6> kCommands = {
    kStatusCommand, kRefitCommand, kAbortCommand, kVerifyCommand, kQuantizeCommand, kConvertCommand,
};

int PrintUsage(std::ostream& out, int code) {
  out << "usage: refitctl <command> [args]\ncommands:\n";
  for (const Command& c : kCommands) {
    out << "  " << c.name << " " << c.usage << "\n      " << c.help << "\n";
  }
  return code;
}

int Main(int argc, char** argv) {
  if (argc < 2) return PrintUsage(std::cerr, kExitUsage);
  const std::string_view name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") return PrintUsage(std::cout, kExitOk);
  std::vector<std::string_view> args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (c.name == name) return c.run(args);
  }
  std::cerr << "refitctl: unknown command '" << name << "'\n";
  return PrintUsage(std::cerr, kExitUsage);
}

}  // namespace
}  // namespace refit::refitctl

int main(int argc, char** argv) { return refit::refitctl::Main(argc, argv); }
