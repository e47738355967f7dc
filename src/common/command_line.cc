#include "common/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace refit::cli {
namespace {

// This Abseil's string_view is its own type, not std::string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string Canonical(std::string_view spelled) { return absl::StrReplaceAll(Absl(spelled), {{"-", "_"}}); }

bool Accepted(std::span<const std::string_view> accepted, std::string_view name) {
  return std::find(accepted.begin(), accepted.end(), name) != accepted.end();
}

absl::CommandLineFlag& Find(std::string_view name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(Absl(name));
  // A program naming a flag it never defined is a bug in the program, not a usage error.
  if (flag == nullptr) {
    std::fprintf(stderr, "internal error: flag '%.*s' is not defined\n", static_cast<int>(name.size()), name.data());
    std::abort();
  }
  return *flag;
}

std::string ValueName(std::string_view flag_name) { return absl::AsciiStrToUpper(Spelling(flag_name).substr(2)); }

}  // namespace

std::string Spelling(std::string_view flag_name) {
  return absl::StrCat("--", absl::StrReplaceAll(Absl(flag_name), {{"_", "-"}}));
}

absl::StatusOr<ParsedArgs> ParseFlags(std::span<const std::string_view> args,
                                      std::span<const std::string_view> accepted) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--") {
      for (++i; i < args.size(); ++i) out.positional.emplace_back(args[i]);
      break;
    }
    if (a == "--help" || a == "-h" || a == "-help") {
      out.help = true;
      continue;
    }
    if (a == "--version") {
      out.version = true;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') {
      out.positional.emplace_back(a);
      continue;
    }
    std::string_view body = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string_view spelled = body.substr(0, eq);
    std::string name = Canonical(spelled);
    bool negated = false;
    if (!Accepted(accepted, name) && absl::StartsWith(name, "no") && Accepted(accepted, name.substr(2)) &&
        Find(name.substr(2)).IsOfType<bool>() && eq == std::string_view::npos) {
      name = name.substr(2);
      negated = true;
    }
    if (name.empty() || !Accepted(accepted, name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", Absl(a.substr(0, a.find('='))), "'"));
    }
    absl::CommandLineFlag& flag = Find(name);
    std::string value;
    if (eq != std::string_view::npos) {
      value = std::string(body.substr(eq + 1));
    } else if (flag.IsOfType<bool>()) {
      value = negated ? "false" : "true";
    } else if (i + 1 < args.size()) {
      value = std::string(args[++i]);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag ", Spelling(name), " needs a value"));
    }
    std::string error;
    if (!flag.ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("flag ", Spelling(name), ": ", error));
    }
  }
  return out;
}

std::string FlagsSynopsis(std::span<const std::string_view> accepted) {
  std::string out;
  for (std::string_view name : accepted) {
    absl::StrAppend(&out, out.empty() ? "" : " ", "[", Spelling(name),
                    Find(name).IsOfType<bool>() ? "" : absl::StrCat(" ", ValueName(name)), "]");
  }
  return out;
}

std::string FlagsHelp(std::span<const std::string_view> accepted) {
  std::string out;
  for (std::string_view name : accepted) {
    absl::CommandLineFlag& flag = Find(name);
    const bool is_bool = flag.IsOfType<bool>();
    const std::string dflt = flag.DefaultValue();
    absl::StrAppend(&out, "  ", Spelling(name), is_bool ? "" : absl::StrCat("=", ValueName(name)), "\n      ",
                    flag.Help(), (is_bool && dflt == "false") || dflt.empty() ? "" : absl::StrCat(" (default: ", dflt, ")"),
                    "\n");
  }
  return out;
}

}  // namespace refit::cli
