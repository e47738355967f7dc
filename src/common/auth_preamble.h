// The shared-secret preamble a client sends on a TCP control connection before any Cap'n Proto
// message: "RFT1", the token's length (4 bytes, little endian), the token; inside TLS when the
// listener has TLS. refitd closes the connection unless the token equals its configured one
// (docs/security.md). Unix-socket
// connections send nothing: refitd checks their uid instead.
//
// Threading: free functions, no shared state.
#ifndef REFIT_COMMON_AUTH_PREAMBLE_H_
#define REFIT_COMMON_AUTH_PREAMBLE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace refit {

inline constexpr char kAuthMagic[4] = {'R', 'F', 'T', '1'};
inline constexpr uint32_t kMaxTokenBytes = 4096;

// The preamble bytes for `token`.
std::string AuthPreamble(absl::string_view token);
// Parses the 8-byte head of a preamble: the token length that follows, or an error (bad magic,
// token longer than kMaxTokenBytes). An empty token is well-formed: a client without a token
// sends one, and refitd admits it only where no token is required (mutual TLS).
absl::StatusOr<uint32_t> ParseAuthHead(const uint8_t head[8]);
// Constant-time comparison (does not reveal how many leading bytes matched).
bool TokensEqual(absl::string_view a, absl::string_view b);
// True for "HOST:PORT" addresses (anything but "unix:...").
bool IsTcpAddress(absl::string_view address);
// The token clients present: $REFITD_TOKEN, or the first line of the file $REFITD_TOKEN_FILE.
std::string ClientToken();

}  // namespace refit

#endif  // REFIT_COMMON_AUTH_PREAMBLE_H_
