// Name patterns used by model specs to match HF tensor names and engine parameter names.
//
// Syntax (whole-name match):
//   *        any run of characters except '.'
//   **       any run of characters, dots included
//   {L}      a capture named L: a non-empty run of characters except '.'; the same name used
//            twice in one pattern must bind the same text
//   {p:a,b}  a capture named p that binds one of the listed texts
//   {a,b,c}  alternation of literal texts
// Everything else matches literally. Thread-safe after construction (immutable).
#ifndef REFIT_SPEC_NAME_PATTERN_H_
#define REFIT_SPEC_NAME_PATTERN_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace refit::spec {

using Captures = std::map<std::string, std::string>;

class NamePattern {
 public:
  static absl::StatusOr<NamePattern> Parse(std::string_view text);

  // The captures on a match; nullopt when `name` does not match.
  std::optional<Captures> Match(std::string_view name) const;
  // The pattern with captures substituted; error when a capture is unbound or the pattern
  // contains wildcards or alternations (which cannot be expanded to one name).
  absl::StatusOr<std::string> Expand(const Captures& captures) const;
  const std::string& text() const { return text_; }
  std::vector<std::string> CaptureNames() const;
  // True when the pattern is literals and captures only (Expand can name one tensor).
  bool Expandable() const;
  // True when some name matches both patterns (conservative: a capture used twice is treated
  // as two independent captures).
  bool Overlaps(const NamePattern& other) const;
  // The literal text every matching name starts with (ends with): the pattern's first (last)
  // token when it is a literal, else "". A pattern that is one literal has itself as prefix and
  // "" as suffix.
  std::string_view LiteralPrefix() const;
  std::string_view LiteralSuffix() const;

 private:
  enum class Kind { kLiteral, kStar, kDoubleStar, kCapture, kAlternation };
  struct Token {
    Kind kind;
    std::string text;                  // literal text or capture name
    std::vector<std::string> choices;  // alternation; allowed values of a capture (empty: any)
  };
  bool MatchFrom(size_t token, std::string_view rest, Captures& caps) const;

  std::string text_;
  std::vector<Token> tokens_;
};

}  // namespace refit::spec

#endif  // REFIT_SPEC_NAME_PATTERN_H_
