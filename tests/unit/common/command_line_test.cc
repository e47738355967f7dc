// ParseFlags on Abseil flags defined here: both spellings, both value forms, bools, positional
// interleaving, and the usage errors that name the flag.
#include "common/command_line.h"

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, test_address, "unix:/tmp/x.sock", "where to connect");
ABSL_FLAG(bool, test_json, false, "print JSON");
ABSL_FLAG(int, test_count, 1, "how many");
ABSL_FLAG(std::string, test_other, "", "a flag the command does not accept");

namespace refit::cli {
namespace {

constexpr std::array<std::string_view, 3> kAccepted = {"test_address", "test_json", "test_count"};

class CommandLineTest : public ::testing::Test {
 protected:
  absl::FlagSaver saver_;
};

TEST_F(CommandLineTest, ValueFormsAndSpellings) {
  auto p = ParseFlags(std::vector<std::string_view>{"--test-address=unix:/a", "pos1", "--test_count", "7", "pos2"},
                      kAccepted);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_address), "unix:/a");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
  EXPECT_EQ(p->positional, (std::vector<std::string>{"pos1", "pos2"}));
  ASSERT_TRUE(ParseFlags(std::vector<std::string_view>{"--test-address", "host:1"}, kAccepted).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_address), "host:1");
}

TEST_F(CommandLineTest, Bools) {
  ASSERT_TRUE(ParseFlags(std::vector<std::string_view>{"--test-json"}, kAccepted).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_json));
  ASSERT_TRUE(ParseFlags(std::vector<std::string_view>{"--notest-json"}, kAccepted).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_json));
  ASSERT_TRUE(ParseFlags(std::vector<std::string_view>{"--test_json=true"}, kAccepted).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_json));
  // A bool never takes the next argument as its value.
  auto p = ParseFlags(std::vector<std::string_view>{"--test-json", "false"}, kAccepted);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->positional, std::vector<std::string>{"false"});
}

TEST_F(CommandLineTest, HelpVersionAndDoubleDash) {
  auto p = ParseFlags(std::vector<std::string_view>{"-h", "--version", "--", "--test-json", "-x"}, kAccepted);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->help && p->version);
  EXPECT_EQ(p->positional, (std::vector<std::string>{"--test-json", "-x"}));
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_json));
}

TEST_F(CommandLineTest, UsageErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string_view> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--bogus"}, "unknown flag '--bogus'"},
           {{"--bogus=1"}, "unknown flag '--bogus'"},
           {{"--test-other=x"}, "unknown flag '--test-other'"},  // defined, but not this command's
           {{"--test-address"}, "flag --test-address needs a value"},
           {{"--test-count=many"}, "flag --test-count: "},
           {{"--notest-address"}, "unknown flag '--notest-address'"},
       }) {
    auto p = ParseFlags(c.args, kAccepted);
    ASSERT_FALSE(p.ok()) << c.args[0];
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(p.status().message()).find(c.message), std::string::npos) << p.status();
  }
}

TEST_F(CommandLineTest, SynopsisAndHelp) {
  EXPECT_EQ(FlagsSynopsis(kAccepted), "[--test-address TEST-ADDRESS] [--test-json] [--test-count TEST-COUNT]");
  const std::string help = FlagsHelp(kAccepted);
  EXPECT_NE(help.find("--test-address=TEST-ADDRESS\n      where to connect (default: unix:/tmp/x.sock)"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("--test-json\n      print JSON\n"), std::string::npos) << help;
}

}  // namespace
}  // namespace refit::cli
