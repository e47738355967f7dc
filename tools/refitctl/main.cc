// refitctl: command-line tool for refitd. Subcommands are listed in one table below.
//
//   refitctl <command> [flags] [args]     refitctl <command> --help     refitctl --help | --version
#include <array>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
#include "refitctl/command.h"
#include "refitctl/convert_command.h"
#include "refitctl/ops_commands.h"
#include "refitctl/quantize_command.h"
#include "refitctl/spec_command.h"
#include "refitctl/version_command.h"

namespace refit::refitctl {
namespace {

constexpr std::array<Command, 9> kCommands = {
    kStatusCommand,   kRefitCommand,    kAbortCommand,    kVerifyCommand,  kQuantizeCommand,
    kConvertCommand, kSpecLintCommand, kVersionCommand, kHelpCommand,
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

// The command `words` begin with (one word, or two for "spec lint"); null if none.
const Command* FindCommand(std::span<const std::string_view> words, size_t& used) {
  for (const Command& c : kCommands) {
    const std::vector<std::string_view> name = absl::StrSplit(c.name, ' ');
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
  if (c == &kCommands.back()) {  // refitctl help [COMMAND...]
    if (words.size() == 1) return PrintUsage(std::cout, kExitOk);
    const Command* about = FindCommand(std::span(words).subspan(1), used);
    if (about == nullptr) return UsageError(*c, absl::StrCat("unknown command '", words[1], "'"));
    return PrintCommandHelp(*about);
  }
  absl::StatusOr<cli::ParsedArgs> parsed = cli::ParseFlags(std::span(words).subspan(used), c->flags);
  if (!parsed.ok()) return UsageError(*c, parsed.status().message());
  if (parsed->help) return PrintCommandHelp(*c);
  if (parsed->version) return UsageError(*c, "--version is a refitctl flag: refitctl --version");
  const std::vector<std::string>& args = parsed->positional;
  if (args.size() < c->min_args) {
    const std::vector<std::string_view> names = absl::StrSplit(c->arguments, ' ', absl::SkipEmpty());
    std::string missing;
    for (size_t i = args.size(); i < c->min_args && i < names.size(); ++i) absl::StrAppend(&missing, " ", names[i]);
    return UsageError(*c, absl::StrCat("missing", missing));
  }
  if (args.size() > c->max_args) return UsageError(*c, absl::StrCat("unexpected argument '", args[c->max_args], "'"));
  return c->run(args);
}

}  // namespace

std::string CommandUsage(const Command& c) {
  const std::string flags = cli::FlagsSynopsis(c.flags);
  return absl::StrCat("usage: refitctl ", c.name, flags.empty() ? "" : " ", flags, c.arguments.empty() ? "" : " ",
                      c.arguments, "\n");
}

int UsageError(const Command& c, std::string_view problem) {
  std::cerr << "refitctl " << c.name << ": " << problem << "\n" << CommandUsage(c)
            << "run 'refitctl " << c.name << " --help' for more\n";
  return kExitUsage;
}

}  // namespace refit::refitctl

int main(int argc, char** argv) { return refit::refitctl::Main(argc, argv); }
