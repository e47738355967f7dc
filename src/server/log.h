// refitd's log: one line per event on stderr, as logfmt text or as one JSON object per line.
//
//   LogEvent(LogLevel::kWarn, "refit").Add("session", id).Add("outcome", "aborted").Add("reason", why);
//
// writes (text)  2026-01-01T00:00:00.000Z level=warn event=refit session=7 outcome=aborted reason="..."
// or (json)      {"ts":"2026-01-01T00:00:00.000Z","level":"warn","event":"refit","session":7,...}
//
// Values come from the network and from files, so every value is escaped: in text, a value that
// is not a plain token is quoted with \" \\ \n \r \t escaped, other control bytes, DEL and bytes
// that are not valid UTF-8 written as \xNN; in JSON, the same bytes as \uXXXX (invalid UTF-8 as
// \u00NN of the byte). No value can start a second line. A value longer than kMaxLogValueBytes is
// cut there and ends with "...(N bytes)", N its full length.
//
// Threading: thread-safe; each line is one write(2). The level and the format are process-wide
// atomics (SetLogLevel at start-up and on SIGHUP, SetLogFormat at start-up).
#ifndef REFIT_SERVER_LOG_H_
#define REFIT_SERVER_LOG_H_

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace refit::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
enum class LogFormat { kText = 0, kJson = 1 };

inline constexpr size_t kMaxLogValueBytes = 4096;

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
bool LogEnabled(LogLevel level);
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
bool ParseLogLevel(absl::string_view name, LogLevel& out);
bool ParseLogFormat(absl::string_view name, LogFormat& out);
absl::string_view LogLevelName(LogLevel level);

// One field of an event. `literal` values (numbers, booleans) are written bare in both formats.
struct LogField {
  std::string key;
  std::string value;
  bool literal = false;
};

// One event, written when it is destroyed (at the end of the full expression for a temporary).
// Keys are identifiers chosen by the code ([a-z0-9_]); values are anything.
class LogEvent {
 public:
  LogEvent(LogLevel level, absl::string_view event);
  ~LogEvent();
  LogEvent(const LogEvent&) = delete;
  LogEvent& operator=(const LogEvent&) = delete;

  LogEvent& Add(absl::string_view key, absl::string_view value);
  LogEvent& Add(absl::string_view key, std::string_view value) { return Add(key, absl::string_view(value.data(), value.size())); }
  LogEvent& Add(absl::string_view key, const char* value) { return Add(key, absl::string_view(value)); }
  LogEvent& Add(absl::string_view key, const std::string& value) { return Add(key, absl::string_view(value)); }
  LogEvent& Add(absl::string_view key, bool value);
  LogEvent& Add(absl::string_view key, double value);
  template <std::integral T>
  LogEvent& Add(absl::string_view key, T value) {
    if (enabled_) fields_.push_back({std::string(key), std::to_string(value), true});
    return *this;
  }
  // Drops the event: nothing is written.
  void Cancel() { enabled_ = false; }

  // The line this event writes (without the trailing newline); for tests and tools.
  std::string Render(LogFormat format, absl::Time when) const;

 private:
  LogLevel level_;
  bool enabled_;
  std::string event_;
  std::vector<LogField> fields_;
};

// Escaping, exposed for tests. Both apply the kMaxLogValueBytes cap first.
std::string EscapeLogTextValue(absl::string_view value);  // quoted when not a plain token
std::string EscapeLogJsonString(absl::string_view value);  // with the surrounding quotes

// The line as given, after the timestamp and level (text), or as {"msg": line} (json). For
// callers not yet converted to LogEvent; `line` must come from code, never from input.
void Log(LogLevel level, absl::string_view line);

}  // namespace refit::server

#endif  // REFIT_SERVER_LOG_H_
