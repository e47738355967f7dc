#include "server/socket_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace refit::server {
namespace {

constexpr char kHint[] =
    "use a directory only refitd's user can write, such as /run/refitd (systemd RuntimeDirectory=refitd)";

}  // namespace

absl::Status PrepareSocketPath(const std::string& socket_path) {
  std::filesystem::path parent = std::filesystem::path(socket_path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT || mkdir(dir.c_str(), 0755) != 0 || chmod(dir.c_str(), 0755) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("the socket directory '", dir, "' does not exist and cannot be created: ",
                                                        std::strerror(errno), " (", kHint, ", or set listen)"));
    }
    if (stat(dir.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("the socket directory '", dir, "': ", std::strerror(errno)));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("the socket directory '", dir, "' is not a directory"));
  }
  const bool world_writable = (st.st_mode & S_IWOTH) != 0;
  const bool sticky = (st.st_mode & S_ISVTX) != 0;
  if (world_writable && !sticky) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::FailedPreconditionError(absl::StrCat("the socket directory '", dir,
                                                      "' is world-writable without the sticky bit (mode ", mode,
                                                      "): any user could replace refitd's socket; ", kHint));
  }
  struct stat existing {};
  if (lstat(socket_path.c_str(), &existing) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("the socket path '", socket_path, "': ", std::strerror(errno)));
  }
  if (!S_ISSOCK(existing.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", socket_path, "' exists and is not a socket; refitd does not remove it"));
  }
  if (existing.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the socket '", socket_path, "' already exists and belongs to uid ", existing.st_uid,
                     ", not refitd's uid ", geteuid(), " (another user's socket, which clients would reach?); ",
                     kHint));
  }
  if (unlink(socket_path.c_str()) != 0) {  // a stale socket from a previous run
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove the stale socket '", socket_path, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace refit::server
