#include "common/bounded_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace refit {
namespace {

// Owns one file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string Bytes(uint64_t n) {
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return absl::StrCat(n >> 20, " MiB");
  if (n >= (1ull << 10) && n % (1ull << 10) == 0) return absl::StrCat(n >> 10, " KiB");
  return absl::StrCat(n, " bytes");
}

}  // namespace

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes, absl::string_view what) {
  const std::string named = absl::StrCat(what, " '", path, "'");
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below anyway.
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) {
    const int err = errno;
    std::string msg = absl::StrCat("cannot read ", named, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return absl::UnavailableError(absl::StrCat("cannot read ", named, ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(named, " is not a regular file (",
                                                   S_ISDIR(st.st_mode)   ? "a directory"
                                                   : S_ISCHR(st.st_mode) ? "a character device"
                                                   : S_ISBLK(st.st_mode) ? "a block device"
                                                   : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                   : S_ISSOCK(st.st_mode) ? "a socket"
                                                                          : "not a file",
                                                   ")"));
  }
  auto too_large = [&](uint64_t size, bool at_least) {
    return absl::InvalidArgumentError(absl::StrCat(named, " is ", at_least ? "over " : "", Bytes(size),
                                                   ", over the limit of ", Bytes(max_bytes)));
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return too_large(static_cast<uint64_t>(st.st_size), false);
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t have = 0;
  // Read to EOF (the file may have grown since fstat), never past max_bytes + 1.
  for (;;) {
    if (have == out.size()) {
      if (have > max_bytes) return too_large(max_bytes, true);
      out.resize(std::min<uint64_t>(max_bytes + 1, std::max<uint64_t>(have * 2, have + 4096)));
    }
    ssize_t n = read(fd.get(), out.data() + have, out.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("cannot read ", named, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (have > max_bytes) return too_large(max_bytes, true);
  out.resize(have);
  return out;
}

}  // namespace refit
