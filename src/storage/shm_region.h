// RAII POSIX shared-memory mapping. The engine creates (and unlinks on destruction) the region
// holding its host parameters; refitd opens the same region by name and maps it once per
// registration. Thread-safe: immutable after construction.
#ifndef REFIT_STORAGE_SHM_REGION_H_
#define REFIT_STORAGE_SHM_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace refit::storage {

class ShmRegion {
 public:
  // Creates a new region of `bytes` (zero-filled), failing if `name` exists. The creator unlinks
  // the name when destroyed.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(const std::string& name, uint64_t bytes);
  // Maps an existing region read-write, whole.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Open(const std::string& name);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // OK while `name` still names the object this region mapped, at the size it mapped;
  // FailedPrecondition saying what changed (unlinked, replaced by another object, resized).
  absl::Status CheckCurrent() const;

 private:
  ShmRegion(std::string name, uint8_t* data, uint64_t size, bool owner, uint64_t dev, uint64_t ino)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner), dev_(dev), ino_(ino) {}
  std::string name_;
  uint8_t* data_;
  uint64_t size_;
  bool owner_;
  uint64_t dev_, ino_;  // the object mapped (fstat at open)
};

}  // namespace refit::storage

#endif  // REFIT_STORAGE_SHM_REGION_H_
