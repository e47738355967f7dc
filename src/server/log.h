// Minimal leveled logging to stderr, one line per event, key=value fields.
// Thread-safe (each line is one write).
#ifndef REFIT_SERVER_LOG_H_
#define REFIT_SERVER_LOG_H_

#include <string>
#include <string_view>

namespace refit::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void SetLogLevel(LogLevel level);
bool ParseLogLevel(std::string_view name, LogLevel& out);
void Log(LogLevel level, std::string_view line);

}  // namespace refit::server

#endif  // REFIT_SERVER_LOG_H_
