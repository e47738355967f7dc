#include "server/log.h"

#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace refit::server {
namespace {

const absl::Time kWhen = absl::FromUnixSeconds(1700000000);

std::string Text(const LogEvent& e) { return e.Render(LogFormat::kText, kWhen); }
nlohmann::json Json(const LogEvent& e) { return nlohmann::json::parse(e.Render(LogFormat::kJson, kWhen)); }

TEST(LogTest, TextPlainTokensStayBareAndOthersAreQuoted) {
  LogEvent e(LogLevel::kInfo, "refit");
  e.Add("session", uint64_t{42}).Add("outcome", "committed").Add("reason", "session deadline passed").Add("empty", "");
  e.Add("ratio", 0.5).Add("ok", true);
  EXPECT_EQ(Text(e),
            "2023-11-14T22:13:20.000Z level=info event=refit session=42 outcome=committed "
            "reason=\"session deadline passed\" empty=\"\" ratio=0.5 ok=true");
  e.Cancel();
}

TEST(LogTest, TextNewlineCannotForgeALine) {
  LogEvent e(LogLevel::kWarn, "refit");
  e.Add("reason", "bad name 'x\n2026-01-01T00:00:00.000Z level=info event=refit outcome=committed'\r\t");
  const std::string line = Text(e);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.find('\r'), std::string::npos);
  EXPECT_NE(line.find("'x\\n2026-01-01T00:00:00.000Z level=info event=refit outcome=committed'\\r\\t\""),
            std::string::npos)
      << line;
  e.Cancel();
}

TEST(LogTest, TextQuotesBackslashesNulAndControlBytes) {
  using namespace std::string_literals;
  EXPECT_EQ(EscapeLogTextValue("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(EscapeLogTextValue("a\0b"s), "\"a\\x00b\"");
  EXPECT_EQ(EscapeLogTextValue("\x1b[31mred\x7f"), "\"\\x1B[31mred\\x7F\"");
  // NEL (U+0085) is a line break for some readers.
  EXPECT_EQ(EscapeLogTextValue("a\xC2\x85z"), "\"a\\xC2\\x85z\"");
}

TEST(LogTest, TextInvalidUtf8IsEscapedAndValidUtf8Kept) {
  EXPECT_EQ(EscapeLogTextValue("caf\xC3\xA9 ok"), "\"caf\xC3\xA9 ok\"");
  EXPECT_EQ(EscapeLogTextValue("x\xFFy"), "\"x\\xFFy\"");
  EXPECT_EQ(EscapeLogTextValue("\xC3"), "\"\\xC3\"");             // truncated sequence
  EXPECT_EQ(EscapeLogTextValue("\xC0\xAF"), "\"\\xC0\\xAF\"");     // overlong '/'
  EXPECT_EQ(EscapeLogTextValue("\xED\xA0\x80"), "\"\\xED\\xA0\\x80\"");  // surrogate
  EXPECT_EQ(EscapeLogTextValue("\xF0\x9F\x98\x80"), "\"\xF0\x9F\x98\x80\"");
}

TEST(LogTest, LongValueIsCappedWithItsLength) {
  const std::string huge(10 << 20, 'a');
  const std::string text = EscapeLogTextValue(huge);
  EXPECT_LT(text.size(), kMaxLogValueBytes + 64);
  EXPECT_NE(text.find("...(10485760 bytes)"), std::string::npos);
  const std::string json = EscapeLogJsonString(huge);
  EXPECT_LT(json.size(), kMaxLogValueBytes + 64);
  EXPECT_EQ(nlohmann::json::parse(json).get<std::string>(),
            std::string(kMaxLogValueBytes, 'a') + "...(10485760 bytes)");
}

TEST(LogTest, JsonIsOneParsableObjectPerLine) {
  using namespace std::string_literals;
  LogEvent e(LogLevel::kWarn, "refit");
  const std::string hostile = "q\"b\\s\nnl\r\tt\0nul\x01\x7f caf\xC3\xA9 bad\xFF\xC3"s;
  e.Add("session", 7).Add("outcome", "aborted").Add("reason", hostile).Add("pause_ms", 1.25).Add("dirty", false);
  const std::string line = e.Render(LogFormat::kJson, kWhen);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["ts"], "2023-11-14T22:13:20.000Z");
  EXPECT_EQ(j["level"], "warn");
  EXPECT_EQ(j["event"], "refit");
  EXPECT_EQ(j["session"], 7);
  EXPECT_EQ(j["outcome"], "aborted");
  EXPECT_EQ(j["pause_ms"], 1.25);
  EXPECT_EQ(j["dirty"], false);
  // Valid bytes come back as they were; invalid UTF-8 bytes as the code point of their value.
  EXPECT_EQ(j["reason"].get<std::string>(), "q\"b\\s\nnl\r\tt\0nul\x01\x7f caf\xC3\xA9 bad\xC3\xBF\xC3\x83"s);
  e.Cancel();
}

TEST(LogTest, JsonNonFiniteNumbersAreStrings) {
  LogEvent e(LogLevel::kInfo, "x");
  e.Add("v", std::nan(""));
  EXPECT_TRUE(Json(e)["v"].is_string());
  e.Cancel();
}

TEST(LogTest, LevelsFilterAndParse) {
  LogLevel level;
  ASSERT_TRUE(ParseLogLevel("warn", level));
  EXPECT_EQ(level, LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("verbose", level));
  LogFormat format;
  ASSERT_TRUE(ParseLogFormat("json", format));
  EXPECT_EQ(format, LogFormat::kJson);
  EXPECT_FALSE(ParseLogFormat("xml", format));
  SetLogLevel(LogLevel::kWarn);
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  SetLogLevel(LogLevel::kInfo);
}

}  // namespace
}  // namespace refit::server
