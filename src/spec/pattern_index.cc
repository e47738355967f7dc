#include "spec/pattern_index.h"

#include <algorithm>

namespace refit::spec {
namespace {

std::string Reversed(std::string_view s) { return std::string(s.rbegin(), s.rend()); }

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

}  // namespace

void PatternIndex::Add(const NamePattern& pattern) {
  const std::string_view prefix = pattern.LiteralPrefix();
  Bucket& b = by_prefix_[std::string(prefix)];
  const std::string_view suffix = pattern.LiteralSuffix();
  b.by_reversed_suffix[Reversed(suffix)].push_back(size_++);
  b.suffix_lengths.insert(suffix.size());
  prefix_lengths_.insert(prefix.size());
}

void PatternIndex::Collect(const Bucket& b, std::string_view rsuffix, bool extending, std::vector<size_t>& out) const {
  const size_t before = out.size();
  for (size_t len : b.suffix_lengths) {
    if (len > rsuffix.size()) break;
    auto it = b.by_reversed_suffix.find(rsuffix.substr(0, len));
    if (it != b.by_reversed_suffix.end()) out.insert(out.end(), it->second.begin(), it->second.end());
  }
  if (extending) {
    for (auto it = b.by_reversed_suffix.upper_bound(rsuffix);
         it != b.by_reversed_suffix.end() && StartsWith(it->first, rsuffix); ++it) {
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }
  returned_.n.fetch_add(out.size() - before, std::memory_order_relaxed);
}

std::vector<size_t> PatternIndex::MatchCandidates(std::string_view name) const {
  std::vector<size_t> out;
  const std::string rname = Reversed(name);
  for (size_t len : prefix_lengths_) {
    if (len > name.size()) break;
    auto it = by_prefix_.find(name.substr(0, len));
    if (it != by_prefix_.end()) Collect(it->second, rname, /*extending=*/false, out);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<size_t> PatternIndex::OverlapCandidates(const NamePattern& pattern) const {
  std::vector<size_t> out;
  const std::string_view prefix = pattern.LiteralPrefix();
  const std::string rsuffix = Reversed(pattern.LiteralSuffix());
  // Prefixes of this prefix (itself included)...
  for (size_t len : prefix_lengths_) {
    if (len > prefix.size()) break;
    auto it = by_prefix_.find(prefix.substr(0, len));
    if (it != by_prefix_.end()) Collect(it->second, rsuffix, /*extending=*/true, out);
  }
  // ...and prefixes that extend it.
  for (auto it = by_prefix_.upper_bound(prefix); it != by_prefix_.end() && StartsWith(it->first, prefix); ++it) {
    Collect(it->second, rsuffix, /*extending=*/true, out);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace refit::spec
