#include "spec/name_pattern.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace refit::spec {

absl::StatusOr<NamePattern> NamePattern::Parse(std::string_view text) {
  NamePattern p;
  p.text_ = std::string(text);
  if (text.empty()) return absl::InvalidArgumentError("empty name pattern");
  size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c == '*') {
      if (i + 1 < text.size() && text[i + 1] == '*') {
        p.tokens_.push_back({Kind::kDoubleStar, "", {}});
        i += 2;
      } else {
        p.tokens_.push_back({Kind::kStar, "", {}});
        i += 1;
      }
      continue;
    }
    if (c == '{') {
      size_t end = text.find('}', i);
      if (end == std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("pattern '", p.text_, "': unclosed '{'"));
      }
      std::string inner(text.substr(i + 1, end - i - 1));
      if (inner.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("pattern '", p.text_, "': empty '{}'"));
      }
      if (inner.find(',') != std::string::npos) {
        Token t{Kind::kAlternation, "", absl::StrSplit(inner, ',')};
        p.tokens_.push_back(std::move(t));
      } else {
        for (char ch : inner) {
          if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '_')) {
            return absl::InvalidArgumentError(
                absl::StrCat("pattern '", p.text_, "': capture name '", inner, "' must be [A-Za-z0-9_]"));
          }
        }
        p.tokens_.push_back({Kind::kCapture, inner, {}});
      }
      i = end + 1;
      continue;
    }
    if (c == '}') return absl::InvalidArgumentError(absl::StrCat("pattern '", p.text_, "': stray '}'"));
    if (p.tokens_.empty() || p.tokens_.back().kind != Kind::kLiteral) p.tokens_.push_back({Kind::kLiteral, "", {}});
    p.tokens_.back().text.push_back(c);
    ++i;
  }
  return p;
}

bool NamePattern::MatchFrom(size_t token, std::string_view rest, Captures& caps) const {
  if (token == tokens_.size()) return rest.empty();
  const Token& t = tokens_[token];
  switch (t.kind) {
    case Kind::kLiteral:
      if (rest.substr(0, t.text.size()) != t.text) return false;
      return MatchFrom(token + 1, rest.substr(t.text.size()), caps);
    case Kind::kAlternation:
      for (const std::string& choice : t.choices) {
        if (rest.substr(0, choice.size()) == choice && MatchFrom(token + 1, rest.substr(choice.size()), caps)) {
          return true;
        }
      }
      return false;
    case Kind::kStar:
    case Kind::kDoubleStar:
    case Kind::kCapture: {
      const bool dots = t.kind == Kind::kDoubleStar;
      const size_t min_len = t.kind == Kind::kCapture ? 1 : 0;
      size_t max_len = 0;
      while (max_len < rest.size() && (dots || rest[max_len] != '.')) ++max_len;
      for (size_t len = min_len; len <= max_len; ++len) {
        if (t.kind == Kind::kCapture) {
          std::string value(rest.substr(0, len));
          auto it = caps.find(t.text);
          if (it != caps.end()) {
            if (it->second != value) continue;
            if (MatchFrom(token + 1, rest.substr(len), caps)) return true;
            continue;
          }
          caps[t.text] = value;
          if (MatchFrom(token + 1, rest.substr(len), caps)) return true;
          caps.erase(t.text);
        } else if (MatchFrom(token + 1, rest.substr(len), caps)) {
          return true;
        }
      }
      return false;
    }
  }
  return false;
}

std::optional<Captures> NamePattern::Match(std::string_view name) const {
  Captures caps;
  if (!MatchFrom(0, name, caps)) return std::nullopt;
  return caps;
}

absl::StatusOr<std::string> NamePattern::Expand(const Captures& captures) const {
  std::string out;
  for (const Token& t : tokens_) {
    switch (t.kind) {
      case Kind::kLiteral:
        out += t.text;
        break;
      case Kind::kCapture: {
        auto it = captures.find(t.text);
        if (it == captures.end()) {
          return absl::InvalidArgumentError(absl::StrCat("pattern '", text_, "': capture {", t.text, "} is unbound"));
        }
        out += it->second;
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("pattern '", text_, "' has wildcards or alternations and names no single tensor"));
    }
  }
  return out;
}

std::vector<std::string> NamePattern::CaptureNames() const {
  std::vector<std::string> names;
  for (const Token& t : tokens_) {
    if (t.kind == Kind::kCapture) names.push_back(t.text);
  }
  return names;
}

}  // namespace refit::spec
