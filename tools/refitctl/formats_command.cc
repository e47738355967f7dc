#include "refitctl/formats_command.h"

#include <algorithm>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "formats/format_info.h"
#include "nlohmann/json.hpp"
#include "refitctl/common_flags.h"

namespace refit::refitctl {
namespace {

std::string SuffixShown(std::string_view suffix) { return suffix.empty() ? "(data)" : std::string(suffix); }

}  // namespace

int RunFormats(std::span<const std::string> args) {
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json out = nlohmann::json::array();
    for (const formats::FormatInfo& row : formats::AllFormats()) {
      nlohmann::json outputs = nlohmann::json::array();
      for (const formats::OutputRole& o : row.Outputs()) {
        outputs.push_back({{"suffix", o.suffix}, {"dtype", DTypeName(o.dtype)}});
      }
      out.push_back({{"name", row.name},
                     {"quantized", row.quantized},
                     {"block", {row.block.rows, row.block.cols}},
                     {"global_amax", row.global_amax != formats::GlobalAmax::kNone},
                     {"outputs", outputs}});
    }
    std::cout << out.dump() << "\n";
    return kExitOk;
  }
  for (const formats::FormatInfo& row : formats::AllFormats()) {
    std::string line(row.name);
    line.resize(std::max<size_t>(line.size() + 1, 20), ' ');
    std::string kind = "cast";
    if (row.quantized) {
      kind = "quantized, block " + std::to_string(row.block.rows) + "x" + std::to_string(row.block.cols);
      if (row.global_amax != formats::GlobalAmax::kNone) kind += ", global amax";
    }
    kind.resize(std::max<size_t>(kind.size() + 1, 42), ' ');
    line += kind;
    for (size_t i = 0; i < row.Outputs().size(); ++i) {
      const formats::OutputRole& o = row.Outputs()[i];
      line += (i ? ", " : "") + SuffixShown(o.suffix) + " " + DTypeName(o.dtype);
    }
    std::cout << line << "\n";
  }
  return kExitOk;
}

}  // namespace refit::refitctl
