#include "common/auth_preamble.h"

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace refit {

std::string AuthPreamble(absl::string_view token) {
  std::string out(kAuthMagic, sizeof(kAuthMagic));
  uint32_t n = static_cast<uint32_t>(token.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(token.data(), token.size());
  return out;
}

absl::StatusOr<uint32_t> ParseAuthHead(const uint8_t head[8]) {
  if (std::memcmp(head, kAuthMagic, sizeof(kAuthMagic)) != 0) {
    return absl::PermissionDeniedError("connection did not start with the authentication preamble");
  }
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(head[4 + i]) << (8 * i);
  if (n > kMaxTokenBytes) {
    return absl::PermissionDeniedError(absl::StrCat("authentication token of ", n, " bytes (at most ", kMaxTokenBytes, ")"));
  }
  return n;
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool IsTcpAddress(absl::string_view address) { return address.substr(0, 5) != "unix:"; }

std::string ClientToken() {
  if (const char* t = std::getenv("REFITD_TOKEN"); t != nullptr && *t != '\0') return t;
  if (const char* f = std::getenv("REFITD_TOKEN_FILE"); f != nullptr && *f != '\0') {
    std::ifstream in(f);
    std::string line;
    std::getline(in, line);
    return line;
  }
  return "";
}

}  // namespace refit
