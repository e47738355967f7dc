// The engine's registered parameter storage, as refitd sees it: a fixed list of parameters whose
// bytes refitd overwrites in place during a commit. Addresses never change (captured CUDA graphs
// stay valid). Implementations: host POSIX shared memory (shm_storage.h); CUDA IPC (GPU path).
//
// Threading: not thread-safe; the committer uses it from one thread while the engine is paused.
#ifndef REFIT_STORAGE_ENGINE_STORAGE_H_
#define REFIT_STORAGE_ENGINE_STORAGE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/parallel_checksum.h"

namespace refit::storage {

struct ParamInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes;
};

class EngineStorage {
 public:
  virtual ~EngineStorage() = default;
  virtual const std::vector<ParamInfo>& params() const = 0;
  // Overwrites parameter `index` with params()[index].nbytes bytes from host memory `src`.
  // REQUIRES: the engine is paused.
  virtual absl::Status WriteFromHost(size_t index, const void* src) = 0;
  // Overwrites parameter `index` from device memory (staging on the engine's GPU).
  // REQUIRES: the engine is paused; on_device().
  virtual absl::Status WriteFromDevice(size_t index, const void* src) {
    return absl::UnimplementedError("this engine storage has no device memory");
  }
  // Optional fast path for the commit window: the device→engine writes of one commit, prepared
  // ahead (before the engine pauses) and then issued as one batch. Unimplemented when the storage
  // has no such path; callers then write one parameter at a time.
  virtual absl::Status PrepareDeviceWrites(const std::vector<std::pair<size_t, const void*>>& writes) {
    return absl::UnimplementedError("no batched device writes");
  }
  // Issues the prepared batch. REQUIRES: the engine is paused; PrepareDeviceWrites succeeded.
  virtual absl::Status WritePreparedDevice() { return absl::UnimplementedError("no batched device writes"); }
  // True when the parameters live in GPU memory.
  virtual bool on_device() const { return false; }
  // The CUDA device of the parameters, or -1 for host storage.
  virtual int device() const { return -1; }
  // Copies parameter `index` into host memory `dst` (params()[index].nbytes bytes).
  virtual absl::Status ReadToHost(size_t index, void* dst) const = 0;
  // ParallelChecksum64 (common/parallel_checksum.h) of parameter `index` as the engine holds it:
  // on the GPU for device storage, on the CPU for host storage.
  virtual absl::StatusOr<uint64_t> Checksum(size_t index) const;
  // Returns once every write issued so far is visible to the engine.
  virtual absl::Status Flush() = 0;
};

inline absl::StatusOr<uint64_t> EngineStorage::Checksum(size_t index) const {
  if (index >= params().size()) return absl::OutOfRangeError("parameter index " + std::to_string(index));
  std::vector<uint8_t> bytes(params()[index].nbytes);
  absl::Status read = ReadToHost(index, bytes.data());
  if (!read.ok()) return read;
  return ParallelChecksum64(bytes.data(), bytes.size());
}

}  // namespace refit::storage

#endif  // REFIT_STORAGE_ENGINE_STORAGE_H_
