// Builds error messages from strings (std::string_view included, which this Abseil's StrCat
// does not take), numbers and Abseil string views.
// Thread-safe: pure function.
#ifndef REFIT_FORMATS_MESSAGE_H_
#define REFIT_FORMATS_MESSAGE_H_

#include <iomanip>
#include <sstream>
#include <string>

namespace refit::formats {

template <typename... Args>
std::string Msg(const Args&... args) {
  std::ostringstream os;
  os << std::setprecision(9);
  (os << ... << args);
  return os.str();
}

}  // namespace refit::formats

#endif  // REFIT_FORMATS_MESSAGE_H_
