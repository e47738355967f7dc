#include "server/config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/builtin_transports.h"

namespace refit::server {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<Config> ParseConfig(const std::string& yaml, const std::string& path) {
  return server::ParseConfig(yaml, path, transport::BuiltinTransports());
}

TEST(ConfigTest, LogSectionIsRead) {
  absl::StatusOr<Config> c = ParseConfig("log:\n  format: json\n  level: warn\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->log_format, "json");
  EXPECT_EQ(c->log_level, "warn");
  c = ParseConfig("log_level: debug\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->log_format, "text");
  EXPECT_EQ(c->log_level, "debug");
  c = ParseConfig("log_level: debug\nlog: {level: error}\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->log_level, "error");  // log.level wins
}

TEST(ConfigTest, BadLogSettingsNameTheKey) {
  EXPECT_THAT(ParseConfig("log:\n  format: xml\n", "c.yaml").status().message(),
              HasSubstr("c.yaml:2: log.format: must be text or json"));
  EXPECT_THAT(ParseConfig("log:\n  level: loud\n", "c.yaml").status().message(), HasSubstr("log.level: must be"));
  EXPECT_THAT(ParseConfig("log:\n  colour: red\n", "c.yaml").status().message(), HasSubstr("unknown key 'colour'"));
}

TEST(ConfigTest, GroupAddressesListEveryMemberInOrder) {
  const std::string group = "hold: 1\ngroup: {name: g, members: 2, member: 1";
  absl::StatusOr<Config> c = ParseConfig(group + ", addresses: [\"unix:/a.sock\", \"b:7070\"]}\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->group_addresses, ::testing::ElementsAre("unix:/a.sock", "b:7070"));
  c = ParseConfig(group + "}\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->group_addresses.empty());  // asks no one
  EXPECT_THAT(ParseConfig(group + ", addresses: [\"unix:/a.sock\"]}\n", "c.yaml").status().message(),
              HasSubstr("group.addresses: lists 1 addresses; it must list every member's (2), in member order"));
  EXPECT_THAT(ParseConfig(group + ", addresses: [\"unix:/a.sock\", \"\"]}\n", "c.yaml").status().message(),
              HasSubstr("group.addresses[1]: must be 1 to 4096 bytes"));
  EXPECT_THAT(ParseConfig(group + ", addresses: unix:/a.sock}\n", "c.yaml").status().message(),
              HasSubstr("group.addresses: has the wrong type"));
}

TEST(ConfigTest, GroupPeersUnreachableHoldsUnlessServe) {
  const std::string group = "hold: 1\ngroup: {name: g, members: 2, member: 1";
  absl::StatusOr<Config> c = ParseConfig(group + "}\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->group_hold_unanswered);  // the default: hold
  c = ParseConfig(group + ", peers_unreachable: serve}\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->group_hold_unanswered);
  EXPECT_THAT(ParseConfig(group + ", peers_unreachable: wait}\n", "c.yaml").status().message(),
              HasSubstr("group.peers_unreachable: 'wait': must be hold or serve"));
}

TEST(ConfigTest, AllowedUidsAreCapped) {
  std::string uids;
  for (size_t i = 0; i <= kMaxAllowedUids; ++i) absl::StrAppend(&uids, i == 0 ? "" : ",", 1000 + i);
  absl::Status s = ParseConfig(absl::StrCat("access:\n  allowed_uids: [", uids, "]\n"), "c.yaml").status();
  EXPECT_THAT(s.message(), HasSubstr("access.allowed_uids: lists 4097 uids; at most 4096"));
}

// staging: direct is read; it keeps no versions (hold must be 0) and takes GPU data planes.
TEST(ConfigTest, StagingDirectIsReadAndRefusesHeldVersions) {
  absl::StatusOr<Config> c = ParseConfig("staging: direct\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->staging, "direct");
  EXPECT_THAT(ParseConfig("staging: direct\nhold: 2\n", "c.yaml").status().message(),
              HasSubstr("c.yaml:2: hold: must be 0 with staging: direct"));
  EXPECT_THAT(ParseConfig("staging: staged\n", "c.yaml").status().message(),
              HasSubstr("staging: must be host, device or direct"));
}

TEST(ConfigTest, BusyPollIsAutoUnlessSetAndRefusesOtherValues) {
  absl::StatusOr<Config> c = ParseConfig("", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->busy_poll, "auto");
  for (const char* v : {"on", "off", "auto"}) {
    c = ParseConfig(std::string("busy_poll: ") + v + "\n", "c.yaml");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->busy_poll, v);
  }
  EXPECT_THAT(ParseConfig("staging: host\nbusy_poll: spin\n", "c.yaml").status().message(),
              HasSubstr("c.yaml:2: busy_poll: must be auto, on or off"));
}

TEST(ConfigTest, VerifyAfterCommitAndHoldAreRead) {
  absl::StatusOr<Config> c = ParseConfig("", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->verify_after_commit);
  EXPECT_EQ(c->hold, 0u);
  c = ParseConfig("hold: 3\nengine:\n  verify_after_commit: true\n  pause_timeout_ms: 500\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->verify_after_commit);
  EXPECT_EQ(c->hold, 3u);
  EXPECT_EQ(c->pause_timeout_ms, 500u);
  EXPECT_THAT(ParseConfig("hold: 65\n", "c.yaml").status().message(), HasSubstr("hold: must be at most 64"));
  EXPECT_THAT(ParseConfig("hold: -1\n", "c.yaml").status().message(), HasSubstr("hold"));
  EXPECT_THAT(ParseConfig("engine:\n  verify_after_commit: maybe\n", "c.yaml").status().message(),
              HasSubstr("engine.verify_after_commit: has the wrong type"));
}

TEST(ConfigTest, AsleepRefitsIsStageOrRefuse) {
  absl::StatusOr<Config> c = ParseConfig("", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->asleep_refits, "stage");
  c = ParseConfig("engine:\n  asleep_refits: refuse\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->asleep_refits, "refuse");
  EXPECT_THAT(ParseConfig("engine:\n  asleep_refits: later\n", "c.yaml").status().message(),
              HasSubstr("engine.asleep_refits: must be stage or refuse"));
}

TEST(ConfigTest, ConfigFileIsBounded) {
  EXPECT_THAT(LoadConfigFile("/dev/zero", transport::BuiltinTransports()).status().message(),
              HasSubstr("config '/dev/zero' is not a regular file (a character device)"));
  EXPECT_EQ(LoadConfigFile("/nonexistent/refitd.yaml", transport::BuiltinTransports()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace refit::server
