#include "spec/name_pattern.h"

#include <algorithm>
#include <set>
#include <utility>

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
      std::vector<std::string> choices;
      if (size_t colon = inner.find(':'); colon != std::string::npos) {
        choices = absl::StrSplit(inner.substr(colon + 1), ',');
        inner = inner.substr(0, colon);
        for (const std::string& ch : choices) {
          if (ch.empty() || ch.find('.') != std::string::npos) {
            return absl::InvalidArgumentError(absl::StrCat(
                "pattern '", p.text_, "': capture {", inner, ":...} choices must be non-empty and without '.'"));
          }
        }
      }
      if (choices.empty() && inner.find(',') != std::string::npos) {
        Token t{Kind::kAlternation, "", absl::StrSplit(inner, ',')};
        p.tokens_.push_back(std::move(t));
      } else {
        for (char ch : inner) {
          if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '_')) {
            return absl::InvalidArgumentError(
                absl::StrCat("pattern '", p.text_, "': capture name '", inner, "' must be [A-Za-z0-9_]"));
          }
        }
        if (inner.empty()) return absl::InvalidArgumentError(absl::StrCat("pattern '", p.text_, "': capture without a name"));
        p.tokens_.push_back({Kind::kCapture, inner, std::move(choices)});
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
          if (!t.choices.empty() && std::find(t.choices.begin(), t.choices.end(), value) == t.choices.end()) continue;
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

bool NamePattern::Expandable() const {
  for (const Token& t : tokens_) {
    if (t.kind != Kind::kLiteral && t.kind != Kind::kCapture) return false;
  }
  return true;
}

std::string_view NamePattern::LiteralPrefix() const {
  if (tokens_.empty() || tokens_.front().kind != Kind::kLiteral) return {};
  return tokens_.front().text;
}

std::string_view NamePattern::LiteralSuffix() const {
  if (tokens_.size() < 2 || tokens_.back().kind != Kind::kLiteral) return {};
  return tokens_.back().text;
}

namespace {

// A character-level NFA: label 0 = epsilon, 1 = any character but '.', 2 = any character,
// otherwise 256 + the literal character.
struct Nfa {
  struct Edge {
    int from, label, to;
  };
  std::vector<Edge> edges;
  int states = 1;
  int accept = 0;
  int Add() { return states++; }
};

bool Compatible(int a, int b) {
  if (a == 2 || b == 2) return true;
  if (a == 1 && b == 1) return true;
  if (a == 1) return b != 256 + '.';
  if (b == 1) return a != 256 + '.';
  return a == b;
}

}  // namespace

bool NamePattern::Overlaps(const NamePattern& other) const {
  // One branch per choice from `from`, each spelling its choice, all ending in one state (returned).
  auto add_choices = [](Nfa& n, int from, const std::vector<std::string>& choices) {
    int end = n.Add();
    for (const std::string& choice : choices) {
      int s = from;
      for (char c : choice) {
        int next = n.Add();
        n.edges.push_back({s, 256 + static_cast<unsigned char>(c), next});
        s = next;
      }
      n.edges.push_back({s, 0, end});
    }
    return end;
  };
  auto build = [&add_choices](const NamePattern& p) {
    Nfa n;
    int cur = 0;
    for (const Token& t : p.tokens_) {
      switch (t.kind) {
        case Kind::kLiteral:
          for (char c : t.text) {
            int next = n.Add();
            n.edges.push_back({cur, 256 + static_cast<unsigned char>(c), next});
            cur = next;
          }
          break;
        case Kind::kStar:
        case Kind::kDoubleStar: {
          int next = n.Add();
          int label = t.kind == Kind::kStar ? 1 : 2;
          n.edges.push_back({cur, 0, next});
          n.edges.push_back({next, label, next});
          cur = next;
          break;
        }
        case Kind::kCapture: {
          if (!t.choices.empty()) {
            cur = add_choices(n, cur, t.choices);
            break;
          }
          int next = n.Add();
          n.edges.push_back({cur, 1, next});
          n.edges.push_back({next, 1, next});
          cur = next;
          break;
        }
        case Kind::kAlternation: cur = add_choices(n, cur, t.choices); break;
      }
    }
    n.accept = cur;
    return n;
  };
  const Nfa a = build(*this), b = build(other);
  std::set<std::pair<int, int>> seen;
  std::vector<std::pair<int, int>> todo = {{0, 0}};
  seen.insert({0, 0});
  while (!todo.empty()) {
    auto [sa, sb] = todo.back();
    todo.pop_back();
    if (sa == a.accept && sb == b.accept) return true;
    auto push = [&](int x, int y) {
      if (seen.insert({x, y}).second) todo.push_back({x, y});
    };
    for (const Nfa::Edge& ea : a.edges) {
      if (ea.from != sa) continue;
      if (ea.label == 0) {
        push(ea.to, sb);
        continue;
      }
      for (const Nfa::Edge& eb : b.edges) {
        if (eb.from == sb && eb.label != 0 && Compatible(ea.label, eb.label)) push(ea.to, eb.to);
      }
    }
    for (const Nfa::Edge& eb : b.edges) {
      if (eb.from == sb && eb.label == 0) push(sa, eb.to);
    }
  }
  return false;
}

}  // namespace refit::spec
