#include "server/log.h"

#include <unistd.h>

#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace refit::server {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
constexpr absl::string_view kLevelNames[] = {"debug", "info", "warn", "error"};

// Length of the well-formed UTF-8 sequence at s[i] (2..4), or 0 when the bytes there are not
// one (overlong forms, surrogates and code points past U+10FFFF included). s[i] >= 0x80.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

// C1 controls (U+0080..U+009F, encoded C2 80..C2 9F): NEL among them ends a line for some readers.
bool IsC1Control(absl::string_view s, size_t i) {
  return static_cast<unsigned char>(s[i]) == 0xC2 && i + 1 < s.size() &&
         static_cast<unsigned char>(s[i + 1]) <= 0x9F;
}

// The value, cut to the cap with the full length said; the cut may split a UTF-8 sequence,
// whose remaining bytes are then escaped as invalid.
std::string Capped(absl::string_view value) {
  if (value.size() <= kMaxLogValueBytes) return std::string(value);
  return absl::StrCat(value.substr(0, kMaxLogValueBytes), "...(", value.size(), " bytes)");
}

bool IsPlainToken(absl::string_view v) {
  if (v.empty()) return false;
  for (char ch : v) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                    ch == '_' || ch == '.' || ch == ':' || ch == '/' || ch == '@' || ch == '+' || ch == ',';
    if (!ok) return false;
  }
  return true;
}

// Appends `v` with bytes that could break a line or a terminal escaped as \xNN; quotes and
// backslashes are escaped only when `quoting` (inside a quoted value).
void AppendTextEscaped(std::string& out, absl::string_view v, bool quoting) {
  for (size_t i = 0; i < v.size();) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c >= 0x80) {
      const size_t n = IsC1Control(v, i) ? 0 : Utf8SequenceLength(v, i);
      if (n == 0) {
        absl::StrAppendFormat(&out, "\\x%02X", c);
        ++i;
      } else {
        out.append(v.data() + i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += quoting ? "\\\"" : "\""; break;
      case '\\': out += quoting ? "\\\\" : "\\"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          absl::StrAppendFormat(&out, "\\x%02X", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
}

std::string Timestamp(absl::Time when) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", when, absl::UTCTimeZone());
}

void WriteLine(std::string line) {
  line.push_back('\n');
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = write(STDERR_FILENO, p, left);
    if (n <= 0) return;  // nowhere to log to: dropping the line is all that can be done
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }
void SetLogFormat(LogFormat format) { g_format = static_cast<int>(format); }
LogFormat GetLogFormat() { return static_cast<LogFormat>(g_format.load()); }
absl::string_view LogLevelName(LogLevel level) { return kLevelNames[static_cast<int>(level)]; }

bool ParseLogLevel(absl::string_view name, LogLevel& out) {
  for (int i = 0; i < 4; ++i) {
    if (name == kLevelNames[i]) {
      out = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

bool ParseLogFormat(absl::string_view name, LogFormat& out) {
  if (name == "text") {
    out = LogFormat::kText;
  } else if (name == "json") {
    out = LogFormat::kJson;
  } else {
    return false;
  }
  return true;
}

std::string EscapeLogTextValue(absl::string_view value) {
  std::string v = Capped(value);
  if (IsPlainToken(v)) return v;
  std::string out = "\"";
  AppendTextEscaped(out, v, /*quoting=*/true);
  out += '"';
  return out;
}

std::string EscapeLogJsonString(absl::string_view value) {
  const std::string v = Capped(value);
  std::string out = "\"";
  for (size_t i = 0; i < v.size();) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c >= 0x80) {
      if (IsC1Control(v, i)) {
        absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(v[i + 1]));
        i += 2;
        continue;
      }
      const size_t n = Utf8SequenceLength(v, i);
      if (n == 0) {
        // Not UTF-8: the byte as the code point of the same value (Latin-1 reading), so the line
        // stays valid JSON and the byte's value can still be read.
        absl::StrAppendFormat(&out, "\\u%04x", c);
        ++i;
      } else {
        out.append(v, i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out += '"';
  return out;
}

LogEvent::LogEvent(LogLevel level, absl::string_view event)
    : level_(level), enabled_(LogEnabled(level)), event_(enabled_ ? std::string(event) : std::string()) {}

LogEvent::~LogEvent() {
  if (enabled_) WriteLine(Render(GetLogFormat(), absl::Now()));
}

LogEvent& LogEvent::Add(absl::string_view key, absl::string_view value) {
  if (enabled_) fields_.push_back({std::string(key), std::string(value), false});
  return *this;
}

LogEvent& LogEvent::Add(absl::string_view key, bool value) {
  if (enabled_) fields_.push_back({std::string(key), value ? "true" : "false", true});
  return *this;
}

LogEvent& LogEvent::Add(absl::string_view key, double value) {
  if (!enabled_) return *this;
  if (std::isfinite(value)) {
    fields_.push_back({std::string(key), absl::StrCat(value), true});
  } else {
    fields_.push_back({std::string(key), absl::StrCat(value), false});  // "nan"/"inf": a string in JSON
  }
  return *this;
}

std::string LogEvent::Render(LogFormat format, absl::Time when) const {
  std::string out;
  if (format == LogFormat::kJson) {
    absl::StrAppend(&out, "{\"ts\":\"", Timestamp(when), "\",\"level\":\"", LogLevelName(level_),
                    "\",\"event\":", EscapeLogJsonString(event_));
    for (const LogField& f : fields_) {
      absl::StrAppend(&out, ",", EscapeLogJsonString(f.key), ":", f.literal ? f.value : EscapeLogJsonString(f.value));
    }
    out += '}';
    return out;
  }
  absl::StrAppend(&out, Timestamp(when), " level=", LogLevelName(level_), " event=", EscapeLogTextValue(event_));
  for (const LogField& f : fields_) {
    out += ' ';
    AppendTextEscaped(out, f.key, /*quoting=*/false);
    absl::StrAppend(&out, "=", f.literal ? f.value : EscapeLogTextValue(f.value));
  }
  return out;
}

void Log(LogLevel level, absl::string_view line) {
  if (!LogEnabled(level)) return;
  const absl::Time now = absl::Now();
  if (GetLogFormat() == LogFormat::kJson) {
    WriteLine(absl::StrCat("{\"ts\":\"", Timestamp(now), "\",\"level\":\"", LogLevelName(level),
                           "\",\"msg\":", EscapeLogJsonString(line), "}"));
    return;
  }
  // Quotes pass as they are (the line carries its own key="value" fields), but no byte of it
  // can end the line or drive a terminal.
  std::string out = absl::StrCat(Timestamp(now), " level=", LogLevelName(level), " ");
  constexpr size_t kMaxLineBytes = 4 * kMaxLogValueBytes;
  if (line.size() > kMaxLineBytes) {
    AppendTextEscaped(out, line.substr(0, kMaxLineBytes), /*quoting=*/false);
    absl::StrAppend(&out, "...(", line.size(), " bytes)");
  } else {
    AppendTextEscaped(out, line, /*quoting=*/false);
  }
  WriteLine(std::move(out));
}

}  // namespace refit::server
