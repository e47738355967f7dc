// Rule matching stays linear in tensors x matching rules: counts the candidates the index hands
// out (a bound on the Match/Overlaps calls), not the time taken.
#include "spec/pattern_index.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/model_spec.h"

namespace refit::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

NamePattern P(std::string_view text) { return *NamePattern::Parse(text); }

TEST(PatternIndexTest, LiteralPrefixAndSuffix) {
  EXPECT_EQ(P("model.layers.{L}.mlp.weight").LiteralPrefix(), "model.layers.");
  EXPECT_EQ(P("model.layers.{L}.mlp.weight").LiteralSuffix(), ".mlp.weight");
  EXPECT_EQ(P("**.bias").LiteralPrefix(), "");
  EXPECT_EQ(P("**.bias").LiteralSuffix(), ".bias");
  EXPECT_EQ(P("lm_head.weight").LiteralPrefix(), "lm_head.weight");
  EXPECT_EQ(P("lm_head.weight").LiteralSuffix(), "");
}

TEST(PatternIndexTest, CandidatesIncludeEveryMatchInOrder) {
  PatternIndex index;
  const std::vector<std::string> patterns = {"**",          "model.**",   "model.layers.{L}.w", "**.w",
                                             "lm_head.weight", "x.*",     "model.layers.1.w",  "{a,b}.w"};
  for (const std::string& p : patterns) index.Add(P(p));
  const std::vector<std::string> names = {"model.layers.1.w", "lm_head.weight", "x.y", "a.w", "zzz", "model.w"};
  for (const std::string& name : names) {
    std::vector<size_t> want;
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (P(patterns[i]).Match(name)) want.push_back(i);
    }
    std::vector<size_t> got = index.MatchCandidates(name);
    for (size_t w : want) EXPECT_NE(std::find(got.begin(), got.end(), w), got.end()) << name << " " << patterns[w];
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  }
  EXPECT_THAT(index.MatchCandidates("lm_head.weight"), ElementsAre(0, 4));
}

TEST(PatternIndexTest, OverlapCandidatesIncludeEveryOverlap) {
  PatternIndex index;
  const std::vector<std::string> patterns = {"a.*.w", "a.b.{x}", "c.**", "**.w", "a.b.c.w", "d"};
  for (const std::string& p : patterns) index.Add(P(p));
  for (const char* q : {"a.b.w", "c.d", "**", "x.w", "d", "a.**"}) {
    std::vector<size_t> got = index.OverlapCandidates(P(q));
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (P(patterns[i]).Overlaps(P(q))) {
        EXPECT_NE(std::find(got.begin(), got.end(), i), got.end()) << q << " overlaps " << patterns[i];
      }
    }
  }
}

std::string ManyRules(int n) {
  std::string yaml = "model: m\nrules:\n";
  for (int i = 0; i < n; ++i) {
    // Half literal names, half wildcard rules, as large per-expert specs are.
    if (i % 2 == 0) {
      absl::StrAppend(&yaml, "  - {match: \"model.layers.", i, ".mlp.weight\", format: bf16}\n");
    } else {
      absl::StrAppend(&yaml, "  - {match: \"model.layers.", i, ".experts.{x}.w\", target: \"e.", i,
                      ".{x}\", format: bf16}\n");
    }
  }
  return yaml;
}

TEST(PatternIndexTest, TwentyThousandRulesParseAndMatchLinearly) {
  constexpr int kRules = 20000;
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(ManyRules(kRules), "many.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->rules.size(), static_cast<size_t>(kRules));
  // Overlap checks while parsing: a few candidates per rule, not one per earlier rule (2e8).
  EXPECT_LT(spec->match_index.candidates_returned() + spec->target_index.candidates_returned(), 4u * kRules);

  const uint64_t before = spec->match_index.candidates_returned();
  for (int i = 0; i < kRules; ++i) {
    const std::string name = i % 2 == 0 ? absl::StrCat("model.layers.", i, ".mlp.weight")
                                        : absl::StrCat("model.layers.", i, ".experts.3.w");
    absl::StatusOr<const Rule*> rule = spec->RuleFor(name);
    ASSERT_TRUE(rule.ok()) << rule.status();
    ASSERT_EQ((*rule)->line, i + 3) << name;
    ASSERT_EQ(spec->NeverRuleFor(name), nullptr);
  }
  // Each name is tested against the rule it matches (twice: RuleFor and NeverRuleFor), plus at
  // most a few that share its prefix and suffix.
  EXPECT_LE(spec->match_index.candidates_returned() - before, 4u * kRules);
  EXPECT_EQ(*spec->RuleFor("unrelated.weight"), &spec->defaults);
  EXPECT_EQ(spec->TargetCandidates("e.7.q").size(), 1u);
}

TEST(PatternIndexTest, OverlappingRulesAreStillFound) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(
      "model: m\nrules:\n  - {match: \"a.{L}.w\"}\n  - {match: \"b.**\"}\n  - {match: \"**.w\"}\n", "o.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("'**.w' overlaps rule 'a.{L}.w'"));
}

TEST(PatternIndexTest, TooManyRulesAreRefused) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(ManyRules(static_cast<int>(kMaxRules) + 1), "huge.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("lists 20001 rules; at most 20000"));
}

TEST(PatternIndexTest, HandBuiltSpecsWithoutAnIndexStillMatch) {
  ModelSpec spec;
  spec.rules.push_back(Rule{});
  spec.rules.back().match = P("a.*");
  spec.rules.back().never = true;
  EXPECT_EQ(spec.NeverRuleFor("a.b"), &spec.rules[0]);
  EXPECT_EQ(spec.NeverRuleFor("b.b"), nullptr);
}

}  // namespace
}  // namespace refit::spec
