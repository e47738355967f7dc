#include "storage/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace refit::storage {
namespace {

absl::Status Errno(std::string_view what, const std::string& name) {
  return absl::UnavailableError(absl::StrCat(std::string(what), " '", name, "': ", strerror(errno)));
}


}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(const std::string& name, uint64_t bytes) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("shm name '", name, "' must be '/name' with no other '/'"));
  }
  if (bytes == 0) return absl::InvalidArgumentError("shm region of 0 bytes");
  UniqueFd fd{shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)};
  if (fd.get() < 0) return Errno("shm_open(create)", name);
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    shm_unlink(name.c_str());
    return Errno("ftruncate", name);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    shm_unlink(name.c_str());
    return Errno("fstat", name);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Errno("mmap", name);
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(name, static_cast<uint8_t*>(p), bytes, true, st.st_dev, st.st_ino));
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Open(const std::string& name) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("shm name '", name, "' must be '/name' with no other '/'"));
  }
  UniqueFd fd{shm_open(name.c_str(), O_RDWR, 0)};
  if (fd.get() < 0) return Errno("shm_open", name);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("fstat", name);
  if (st.st_size <= 0) return absl::InvalidArgumentError(absl::StrCat("shm '", name, "' is empty"));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap", name);
  return std::unique_ptr<ShmRegion>(new ShmRegion(name, static_cast<uint8_t*>(p), size, false, st.st_dev, st.st_ino));
}

absl::Status ShmRegion::CheckCurrent() const {
  UniqueFd fd{shm_open(name_.c_str(), O_RDONLY, 0)};
  if (fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm region '", name_, "' is gone since registration (", strerror(errno), ")"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("fstat", name_);
  if (static_cast<uint64_t>(st.st_dev) != dev_ || static_cast<uint64_t>(st.st_ino) != ino_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm region '", name_, "' was replaced by another object since registration"));
  }
  if (static_cast<uint64_t>(st.st_size) != size_) {
    return absl::FailedPreconditionError(absl::StrCat("shm region '", name_, "' was resized from ", size_, " to ",
                                                      st.st_size, " bytes since registration"));
  }
  return absl::OkStatus();
}

ShmRegion::~ShmRegion() {
  munmap(data_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

}  // namespace refit::storage
