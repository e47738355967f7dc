#include "refit/manifest_check.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Manifest WithNames(std::vector<std::string> names) {
  Manifest m;
  m.model = "demo";
  for (std::string& n : names) {
    TensorDesc t;
    t.name = std::move(n);
    t.shape = {4};
    t.nbytes = 8;
    m.tensors.push_back(std::move(t));
  }
  return m;
}

TEST(ManifestCheckTest, AcceptsOrdinaryNames) {
  EXPECT_TRUE(CheckManifest(WithNames({"model.layers.0.mlp.up_proj.weight", "lm_head.weight"}), {}).ok());
}

TEST(ManifestCheckTest, RefusesLongNameNamingTheIndexWithoutEchoingIt) {
  SessionLimits limits;
  const std::string huge(10 << 20, 'a');
  absl::Status s = CheckManifest(WithNames({"ok", huge}), limits);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("manifest tensor 1"));
  EXPECT_THAT(s.message(), HasSubstr("10485760 bytes (limit 512 bytes, limits.max_name_bytes)"));
  EXPECT_LT(s.message().size(), 512u);
}

TEST(ManifestCheckTest, RefusesNulAndControlBytesWithAPrintableText) {
  using namespace std::string_literals;
  absl::Status nul = CheckManifest(WithNames({"a.weight", "evil\0name"s}), {});
  ASSERT_FALSE(nul.ok());
  EXPECT_THAT(nul.message(), HasSubstr("manifest tensor 1: tensor name 'evil\\x00name' holds control byte 0x00 at offset 4"));
  EXPECT_EQ(nul.message().find('\0'), absl::string_view::npos);

  absl::Status nl = CheckManifest(WithNames({"x\n2026-01-01T00:00:00Z level=info event=refit outcome=committed"}), {});
  ASSERT_FALSE(nl.ok());
  EXPECT_THAT(nl.message(), HasSubstr("manifest tensor 0"));
  EXPECT_THAT(nl.message(), HasSubstr("control byte 0x0A at offset 1"));
  EXPECT_EQ(nl.message().find('\n'), absl::string_view::npos);

  EXPECT_FALSE(CheckManifest(WithNames({"del\x7f"}), {}).ok());
  EXPECT_FALSE(CheckManifest(WithNames({""}), {}).ok());
}

TEST(ManifestCheckTest, NonAsciiNamesAreAllowedButShownEscaped) {
  EXPECT_TRUE(CheckManifest(WithNames({"caf\xC3\xA9.weight"}), {}).ok());
  EXPECT_EQ(PrintableName("caf\xC3\xA9\\"), "caf\\xC3\\xA9\\x5C");
  EXPECT_THAT(PrintableName(std::string(1000, 'n')), HasSubstr("...(1000 bytes)"));
}

TEST(ManifestCheckTest, RefusesTooManyTensors) {
  SessionLimits limits;
  limits.max_tensors = 2;
  absl::Status s = CheckManifest(WithNames({"a", "b", "c"}), limits);
  EXPECT_THAT(s.message(), HasSubstr("manifest lists 3 tensors (limit 2, limits.max_tensors)"));
  EXPECT_THAT(s.message(), Not(HasSubstr("tensor 0")));
}

TEST(ManifestCheckTest, BucketNamesGetTheSameCheck) {
  SessionLimits limits;
  limits.max_name_bytes = 8;
  EXPECT_THAT(CheckTensorName("123456789", limits, "bucket 3").message(), HasSubstr("bucket 3: tensor name '123456789'"));
  EXPECT_TRUE(CheckTensorName("12345678", limits, "bucket 3").ok());
}

}  // namespace
}  // namespace refit
