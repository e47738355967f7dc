// An index over many name patterns (a model spec's rules), so finding the rules that match one
// tensor name, or the rules that may overlap a new rule, costs time in the number of rules that
// could apply rather than in the number of rules. Patterns are keyed by their literal prefix and
// literal suffix (NamePattern::LiteralPrefix/LiteralSuffix): a name can only match a pattern
// that it starts and ends like, and two patterns can only overlap when one's prefix is a prefix
// of the other's and one's suffix a suffix of the other's. Candidates are a superset of the
// answer; callers still Match/Overlaps each.
//
// Threading: Add is not thread-safe; the const methods are (after the last Add).
#ifndef REFIT_SPEC_PATTERN_INDEX_H_
#define REFIT_SPEC_PATTERN_INDEX_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "spec/name_pattern.h"

namespace refit::spec {

class PatternIndex {
 public:
  // Adds the next pattern; its id is the number of patterns added before it.
  void Add(const NamePattern& pattern);
  size_t size() const { return size_; }

  // Ids, ascending, of the patterns that may match `name`; every pattern that matches is among them.
  std::vector<size_t> MatchCandidates(std::string_view name) const;
  // Ids, ascending, of the patterns that may overlap `pattern`; every one that does is among them.
  std::vector<size_t> OverlapCandidates(const NamePattern& pattern) const;

  // Candidates handed out so far (for tests that bound the work done).
  uint64_t candidates_returned() const { return returned_.n.load(std::memory_order_relaxed); }

 private:
  // Patterns of one literal prefix, by their literal suffix reversed (so that "suffix of" is a
  // prefix relation and a range of this ordered map).
  struct Bucket {
    std::map<std::string, std::vector<size_t>, std::less<>> by_reversed_suffix;
    std::set<size_t> suffix_lengths;
  };
  struct Counter {
    std::atomic<uint64_t> n{0};
    Counter() = default;
    Counter(const Counter& o) : n(o.n.load()) {}
    Counter& operator=(const Counter& o) {
      n = o.n.load();
      return *this;
    }
  };
  // Appends the ids in `b` whose reversed suffix is a prefix of `rsuffix`; with `extending`,
  // also those of which `rsuffix` is a prefix.
  void Collect(const Bucket& b, std::string_view rsuffix, bool extending, std::vector<size_t>& out) const;

  std::map<std::string, Bucket, std::less<>> by_prefix_;
  std::set<size_t> prefix_lengths_;
  size_t size_ = 0;
  mutable Counter returned_;
};

}  // namespace refit::spec

#endif  // REFIT_SPEC_PATTERN_INDEX_H_
