#include "refitctl/formats_command.h"

#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
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
    std::string line = absl::StrCat(row.name, std::string(row.name.size() < 20 ? 20 - row.name.size() : 1, ' '));
    if (row.quantized) {
      absl::StrAppend(&line, "quantized  block ", row.block.rows, "x", row.block.cols,
                      row.global_amax != formats::GlobalAmax::kNone ? ", global amax" : "", "  ");
    } else {
      absl::StrAppend(&line, "cast  ");
    }
    for (size_t i = 0; i < row.Outputs().size(); ++i) {
      const formats::OutputRole& o = row.Outputs()[i];
      absl::StrAppend(&line, i ? ", " : "", SuffixShown(o.suffix), " ", DTypeName(o.dtype));
    }
    std::cout << line << "\n";
  }
  return kExitOk;
}

}  // namespace refit::refitctl
