#include "refit/offline.h"

#include <cmath>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

constexpr char kSpec[] = R"(model: m
rules:
  - match: "e.{E}.{p:w1,w3}.weight"
    target: "w13"
    format: nvfp4
    fuse: {capture: p, order: [w1, w3]}
    stack: {capture: E, count: 1}
)";

std::vector<uint16_t> Values(float scale, int n) {
  std::vector<uint16_t> v;
  for (int i = 0; i < n; ++i) {
    float f = scale * std::sin(static_cast<float>(i));
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v.push_back(static_cast<uint16_t>(b >> 16));  // truncation: any bf16 will do
  }
  return v;
}

float MaxAbs(const std::vector<uint16_t>& v) {
  float m = 0;
  for (uint16_t h : v) {
    uint32_t b = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    m = std::max(m, std::fabs(f));
  }
  return m;
}

TEST(OfflineTest, FusedNvfp4MembersShareTheGroupAmax) {
  auto spec = *spec::ParseModelSpec(kSpec);
  std::vector<uint16_t> w1 = Values(0.5f, 32 * 64), w3 = Values(3.0f, 32 * 64);
  auto out = ConvertCheckpoint(spec, {{"e.0.w1.weight", DType::kBF16, {32, 64}, w1.data()},
                                      {"e.0.w3.weight", DType::kBF16, {32, 64}, w3.data()}});
  ASSERT_TRUE(out.ok()) << out.status();
  const float want = std::max(MaxAbs(w1), MaxAbs(w3)) / 2688.0f;  // ModelOpt: A / (6 * 448)
  int seen = 0;
  for (const ConvertedTensor& t : *out) {
    if (t.name.find("_scale_2") == std::string::npos) continue;
    float s2;
    std::memcpy(&s2, t.bytes.data(), 4);
    EXPECT_EQ(s2, want) << t.name;
    ++seen;
  }
  EXPECT_EQ(seen, 2);
  // Alone, w1 would get its own (smaller) global scale: the group matters.
  auto alone = ConvertTensor(spec, "e.0.w1.weight", DType::kBF16, {32, 64}, w1.data());
  ASSERT_TRUE(alone.ok());
  float s2;
  std::memcpy(&s2, (*alone)[2].bytes.data(), 4);
  EXPECT_LT(s2, want);
}

TEST(OfflineTest, EngineLayoutNamesAMissingSlot) {
  auto spec = *spec::ParseModelSpec(kSpec);
  std::vector<uint16_t> w1 = Values(0.5f, 32 * 64);
  auto conv = ConvertCheckpoint(spec, {{"e.0.w1.weight", DType::kBF16, {32, 64}, w1.data()}});
  ASSERT_TRUE(conv.ok());
  std::map<std::string, const ConvertedTensor*> by;
  for (const auto& t : *conv) by[t.name] = &t;
  auto layout = EngineLayout(spec, {{"e.0.w1.weight", DType::kBF16, {32, 64}, 0}}, by);
  ASSERT_FALSE(layout.ok());
  EXPECT_THAT(layout.status().message(), ::testing::HasSubstr("engine parameter 'w13': slot 1 of 2 has no tensor"));
}

}  // namespace
}  // namespace refit
