// The directory of refitd's Unix control socket, checked (and created) before refitd binds, so
// that no other user can put a socket of their own where clients look for refitd's
// (docs/security.md, "The socket's directory"):
//   - a missing directory is created, mode 0755, owned by refitd's user (only the last path
//     component; its parent must exist);
//   - a world-writable directory without the sticky bit is refused: anyone could replace the
//     socket there;
//   - a world-writable directory with the sticky bit (like /tmp) is accepted, but a file already
//     at the socket path must be refitd's own: one owned by another user is refused (it may be
//     an impostor's socket that clients would reach);
//   - whatever directory, an existing path that is not a socket is refused rather than removed,
//     and a stale socket of refitd's user (from a previous run) is removed.
// Only the socket's own directory is checked, not its ancestors.
// Threading: any thread; it touches the file system only.
#ifndef REFIT_SERVER_SOCKET_DIR_H_
#define REFIT_SERVER_SOCKET_DIR_H_

#include <string>

#include "absl/status/status.h"

namespace refit::server {

// REQUIRES: `socket_path` is the path of a `unix:` listen address (without "unix:").
// Errors (kFailedPrecondition) name the path and what to change.
absl::Status PrepareSocketPath(const std::string& socket_path);

}  // namespace refit::server

#endif  // REFIT_SERVER_SOCKET_DIR_H_
