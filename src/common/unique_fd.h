// RAII owner of a POSIX file descriptor: one close, move-only. Sockets, shm objects and files
// held beyond one function are owned by one of these, never by a bare int that is closed by hand.
//
// Threading: an owner is used by one thread at a time; get() may be read from others while the
// owner lives (e.g. shutdown(fd.get()) to wake a thread blocked on it).
#ifndef REFIT_COMMON_UNIQUE_FD_H_
#define REFIT_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace refit {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (negative: owns nothing).
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor held (if any) and owns `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

}  // namespace refit

#endif  // REFIT_COMMON_UNIQUE_FD_H_
