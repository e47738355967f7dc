// Test helper: the formats a value-parameterized suite runs over, taken from the format table
// (formats/format_info.h), so that a row added there joins every CPU and GPU suite of its kind
// without a list to edit. Suites instantiate with
//   INSTANTIATE_TEST_SUITE_P(Table, Suite, ::testing::ValuesIn(FormatsWhere(IsQuantized)), FormatParamName);
// and a test that must name formats (a per-format case list) checks itself against AllFormats().
#ifndef REFIT_TESTS_UNIT_FORMATS_EVERY_FORMAT_H_
#define REFIT_TESTS_UNIT_FORMATS_EVERY_FORMAT_H_

#include <ostream>
#include <string>
#include <vector>

#include "formats/format.h"
#include "formats/format_info.h"
#include "gtest/gtest.h"

namespace refit::formats {

// gtest prints a Format parameter by its name ("GetParam() = nvfp4_te").
inline void PrintTo(Format f, std::ostream* os) { *os << Info(f).name; }

namespace testing {

inline bool AnyFormat(const FormatInfo&) { return true; }
inline bool IsQuantized(const FormatInfo& row) { return row.quantized; }
inline bool IsCast(const FormatInfo& row) { return !row.quantized; }
inline bool HasGlobalAmax(const FormatInfo& row) { return row.global_amax != GlobalAmax::kNone; }

// The table's formats whose row satisfies `keep`, in enum order.
inline std::vector<Format> FormatsWhere(bool (*keep)(const FormatInfo&)) {
  std::vector<Format> out;
  for (const FormatInfo& row : AllFormats()) {
    if (keep(row)) out.push_back(row.format);
  }
  return out;
}

// Test names carry the format's name: "Table/Suite.Test/nvfp4_te".
inline std::string FormatParamName(const ::testing::TestParamInfo<Format>& info) {
  return std::string(Info(info.param).name);
}

}  // namespace testing
}  // namespace refit::formats

#endif  // REFIT_TESTS_UNIT_FORMATS_EVERY_FORMAT_H_
