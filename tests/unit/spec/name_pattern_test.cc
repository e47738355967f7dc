#include "spec/name_pattern.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::spec {
namespace {

NamePattern P(const char* text) { return *NamePattern::Parse(text); }

TEST(NamePatternTest, CapturesBindNonDotRuns) {
  auto caps = P("model.layers.{L}.mlp.experts.{E}.{p}_proj.weight").Match("model.layers.3.mlp.experts.17.gate_proj.weight");
  ASSERT_TRUE(caps.has_value());
  EXPECT_EQ((*caps)["L"], "3");
  EXPECT_EQ((*caps)["E"], "17");
  EXPECT_EQ((*caps)["p"], "gate");
  EXPECT_FALSE(P("model.layers.{L}.weight").Match("model.layers.1.2.weight").has_value());
}

TEST(NamePatternTest, CaptureChoicesRestrictTheValue) {
  NamePattern p = P("a.{p:q,k,v}_proj.weight");
  EXPECT_TRUE(p.Match("a.k_proj.weight").has_value());
  EXPECT_FALSE(p.Match("a.o_proj.weight").has_value());
  EXPECT_EQ(*p.Expand({{"p", "v"}}), "a.v_proj.weight");
  EXPECT_TRUE(p.Expandable());
}

TEST(NamePatternTest, StarsAndAlternations) {
  EXPECT_TRUE(P("**.input_scale").Match("model.layers.0.mlp.experts.1.up_proj.input_scale").has_value());
  EXPECT_FALSE(P("*.input_scale").Match("a.b.input_scale").has_value());
  EXPECT_TRUE(P("x.{gate,up}_proj").Match("x.up_proj").has_value());
  EXPECT_FALSE(P("x.{gate,up}_proj").Expandable());
  EXPECT_FALSE(P("x.{gate,up}_proj").Expand({}).ok());
}

TEST(NamePatternTest, RepeatedCaptureMustBindTheSameText) {
  EXPECT_TRUE(P("{a}.{a}").Match("x.x").has_value());
  EXPECT_FALSE(P("{a}.{a}").Match("x.y").has_value());
}

TEST(NamePatternTest, OverlapIsDecidedOnTheLanguages) {
  EXPECT_TRUE(P("model.layers.{L}.**").Overlaps(P("model.layers.{L}.self_attn.{p}_proj.weight")));
  EXPECT_FALSE(P("m.{L}.self_attn.{p:q,k,v}_proj.weight").Overlaps(P("m.{L}.self_attn.o_proj.weight")));
  EXPECT_TRUE(P("m.{L}.self_attn.{p:q,k,v}_proj.weight").Overlaps(P("m.*.self_attn.k_proj.weight")));
  EXPECT_FALSE(P("a.*.b").Overlaps(P("a.x.y.b")));  // '*' never crosses a dot
  EXPECT_TRUE(P("a.**.b").Overlaps(P("a.x.y.b")));
  EXPECT_FALSE(P("x.gate_up_proj").Overlaps(P("x.gate_up_proj_bias")));
}

TEST(NamePatternTest, MalformedPatternsAreErrors) {
  EXPECT_FALSE(NamePattern::Parse("a.{L").ok());
  EXPECT_FALSE(NamePattern::Parse("a.{}").ok());
  EXPECT_FALSE(NamePattern::Parse("a.}").ok());
  EXPECT_FALSE(NamePattern::Parse("a.{p:}").ok());
  EXPECT_FALSE(NamePattern::Parse("a.{b-c}").ok());
}

}  // namespace
}  // namespace refit::spec
