#include "metrics/text_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "metrics/utf8.h"

namespace refit::metrics {
namespace {

// Appends `{a="x",b="y"` (no closing brace) or nothing when there are no labels and no `le`.
void AppendLabels(std::string& out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const std::string* le) {
  if (names.empty() && le == nullptr) return;
  out += '{';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (le != nullptr) {
    if (!names.empty()) out += ',';
    absl::StrAppend(&out, "le=\"", *le, "\"");
  }
  out += '}';
}

void AppendSample(std::string& out, std::string_view name, std::string_view suffix,
                  const FamilySnapshot& family, const ChildSnapshot& child,
                  const std::string* le, std::string_view value) {
  out.append(name).append(suffix);
  AppendLabels(out, family.label_names, child.label_values, le);
  out.append(" ").append(value).append("\n");
}

void AppendFamily(std::string& out, const FamilySnapshot& family) {
  if (family.children.empty()) return;
  if (!family.help.empty()) {
    absl::StrAppend(&out, "# HELP ", family.name, " ", EscapeHelp(family.help), "\n");
  }
  absl::StrAppend(&out, "# TYPE ", family.name, " ");
  out.append(MetricTypeName(family.type)).append("\n");
  for (const ChildSnapshot& child : family.children) {
    if (family.type != MetricType::kHistogram) {
      AppendSample(out, family.name, "", family, child, nullptr, FormatValue(child.value));
      continue;
    }
    const HistogramSnapshot& h = child.histogram;
    for (size_t i = 0; i < h.cumulative_counts.size(); ++i) {
      const std::string le = i < h.upper_bounds.size() ? FormatValue(h.upper_bounds[i]) : "+Inf";
      AppendSample(out, family.name, "_bucket", family, child, &le,
                   absl::StrCat(h.cumulative_counts[i]));
    }
    AppendSample(out, family.name, "_sum", family, child, nullptr, FormatValue(h.sum));
    AppendSample(out, family.name, "_count", family, child, nullptr, absl::StrCat(h.count));
  }
}

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == 0) return "0";  // also -0
  // Fewest digits that read back to the same double. Fixed notation for decimal exponents
  // -4..20 (where JavaScript switches too), so a bound reads "0.0001", not "1e-04", and a
  // byte count never shows an exponent.
  char buf[64];
  const auto sci = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const std::string scientific(buf, sci.ptr);
  const int exponent = std::atoi(scientific.c_str() + scientific.find('e') + 1);
  if (exponent < -4 || exponent > 20) return scientific;
  const auto fixed = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
  return std::string(buf, fixed.ptr);
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t pos = 0; pos < value.size();) {
    const size_t len = Utf8SequenceLength(value, pos);
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++pos;
      continue;
    }
    if (len == 1) {
      switch (value[pos]) {
        case '\\':
          out += "\\\\";
          break;
        case '"':
          out += "\\\"";
          break;
        case '\n':
          out += "\\n";
          break;
        default:
          out += value[pos];
      }
    } else {
      out.append(value, pos, len);
    }
    pos += len;
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatText(absl::Span<const FamilySnapshot> families) {
  std::string out;
  for (const FamilySnapshot& family : families) AppendFamily(out, family);
  return out;
}

std::string FormatText(const Registry& registry) { return FormatText(registry.Collect()); }

}  // namespace refit::metrics
