// refitctl: command-line tool for refitd. Subcommands are listed in one table below.
//
//   refitctl <command> [flags] [args]     refitctl <command> --help     refitctl --help | --version
#include <array>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/command_line.h"
#include "refitctl/command.h"
#include "refitctl/convert_command.h"
#include "refitctl/formats_command.h"
#include "refitctl/ops_commands.h"
#include "refitctl/quantize_command.h"
#include "refitctl/spec_command.h"
#include "refitctl/version_command.h"

namespace refit::refitctl {
namespace {

constexpr std::array<Command, 14> kCommands = {
    kStatusCommand,   kRefitCommand,    kCommitCommand,  kRollbackCommand, kVersionsCommand,
    kAbortCommand,    kVerifyCommand,   kQuantizeCommand, kFormatsCommand, kConvertCommand,
    kSpecLintCommand, kSpecInitCommand, kVersionCommand,  kHelpCommand,
};

int PrintUsage(std::ostream& out, int code) {
  out << "usage: refitctl <command> [flags] [args]\n"
         "       refitctl <command> --help      the command's flags\n"
         "       refitctl --version\ncommands:\n";
  for (const Command& c : kCommands) out << "  " << c.name << "\n      " << c.help << "\n";
  return code;
}

int PrintCommandHelp(const Command& c) {
  std::cout << CommandUsage(c) << c.help << "\n";
  if (!c.flags.empty()) std::cout << "\nflags:\n" << cli::FlagsHelp(c.flags);
  return kExitOk;
}

// Abseil's string functions here take absl::string_view, a type of its own: split by hand.
std::vector<std::string_view> Words(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const size_t space = text.find(' ');
    if (space != 0) out.push_back(text.substr(0, space));
    if (space == std::string_view::npos) break;
    text.remove_prefix(space + 1);
  }
  return out;
}

// The command `words` begin with (one word, or two for "spec lint"); null if none.
const Command* FindCommand(std::span<const std::string_view> words, size_t& used) {
  for (const Command& c : kCommands) {
    const std::vector<std::string_view> name = Words(c.name);
    if (name.size() <= words.size() && std::equal(name.begin(), name.end(), words.begin())) {
      used = name.size();
      return &c;
    }
  }
  return nullptr;
}

int Main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.empty()) return PrintUsage(std::cerr, kExitUsage);
  if (words[0] == "--help" || words[0] == "-h") return PrintUsage(std::cout, kExitOk);
  if (words[0] == "--version") return RunVersionLine();
  size_t used = 0;
  const Command* c = FindCommand(words, used);
  if (c == nullptr) {
    std::cerr << "refitctl: unknown command '" << words[0] << "'\n";
    return PrintUsage(std::cerr, kExitUsage);
  }
  if (c->name == kHelpCommand.name) {  // refitctl help [COMMAND...]
    if (words.size() == 1) return PrintUsage(std::cout, kExitOk);
    const Command* about = FindCommand(std::span(words).subspan(1), used);
    if (about == nullptr) return UsageError(*c, "unknown command '" + std::string(words[1]) + "'");
    return PrintCommandHelp(*about);
  }
  absl::StatusOr<cli::ParsedArgs> parsed = cli::ParseFlags(std::span(words).subspan(used), c->flags);
  if (!parsed.ok()) return UsageError(*c, std::string(parsed.status().message()));
  if (parsed->help) return PrintCommandHelp(*c);
  if (parsed->version) return UsageError(*c, "--version is a refitctl flag: refitctl --version");
  const std::vector<std::string>& args = parsed->positional;
  if (args.size() < c->min_args) {
    const std::vector<std::string_view> names = Words(c->arguments);
    std::string missing = "missing";
    for (size_t i = args.size(); i < c->min_args && i < names.size(); ++i) (missing += " ") += names[i];
    return UsageError(*c, missing);
  }
  if (args.size() > c->max_args) return UsageError(*c, "unexpected argument '" + args[c->max_args] + "'");
  return c->run(args);
}

}  // namespace

std::string CommandUsage(const Command& c) {
  const std::string flags = cli::FlagsSynopsis(c.flags);
  std::string usage = "usage: refitctl " + std::string(c.name);
  if (!flags.empty()) usage += " " + flags;
  if (!c.arguments.empty()) (usage += " ") += c.arguments;
  return usage + "\n";
}

int UsageError(const Command& c, std::string_view problem) {
  std::cerr << "refitctl " << c.name << ": " << problem << "\n" << CommandUsage(c)
            << "run 'refitctl " << c.name << " --help' for more\n";
  return kExitUsage;
}

}  // namespace refit::refitctl

int main(int argc, char** argv) { return refit::refitctl::Main(argc, argv); }
