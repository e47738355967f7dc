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

// A device→engine write: bytes [offset, offset + bytes) of parameter `index`, from device memory
// `src` (a whole parameter, or one piece of a fused or stacked one written where it belongs).
struct DeviceWrite {
  size_t index;
  uint64_t offset;
  const void* src;
  uint64_t bytes;
};

// OutOfRange naming the parameter when `w` does not lie inside a parameter of `params`.
absl::Status CheckDeviceWrite(const std::vector<ParamInfo>& params, const DeviceWrite& w);

class EngineStorage {
 public:
  virtual ~EngineStorage() = default;
  virtual const std::vector<ParamInfo>& params() const = 0;
  // Overwrites parameter `index` with params()[index].nbytes bytes from host memory `src`.
  // REQUIRES: the engine is paused.
  virtual absl::Status WriteFromHost(size_t index, const void* src) = 0;
  // Overwrites part of a parameter from device memory (staging on the engine's GPU).
  // REQUIRES: the engine is paused; on_device().
  virtual absl::Status WriteFromDevice(const DeviceWrite& write) {
    return absl::UnimplementedError("this engine storage has no device memory");
  }
  // Optional fast path for the commit window: the device→engine writes of one commit, prepared
  // ahead (before the engine pauses) and then issued as one batch. Unimplemented when the storage
  // has no such path; callers then issue one write at a time.
  virtual absl::Status PrepareDeviceWrites(const std::vector<DeviceWrite>& writes) {
    return absl::UnimplementedError("no batched device writes");
  }
  // Issues the prepared batch. REQUIRES: the engine is paused; PrepareDeviceWrites succeeded.
  virtual absl::Status WritePreparedDevice() { return absl::UnimplementedError("no batched device writes"); }
  // Where parameter `index`'s bytes are mapped in this process (host memory for host storage,
  // device memory of device() for device storage), for writers that fill the parameter in place
  // while the engine is paused (staging: direct); null when the storage has no such mapping.
  virtual uint8_t* MappedAddress(size_t index) const { return nullptr; }
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
  // Before every commit: re-queries what each parameter was mapped from (the shm object behind
  // its name, the CUDA allocation behind its mapping) and compares it with what was mapped at
  // registration. FailedPrecondition naming the stale parameters when something changed.
  virtual absl::Status Audit() const { return absl::OkStatus(); }
};

// The refusal of a commit into a stale registration: OK when `names` is empty, else
// FailedPrecondition naming the stale parameters (the first 16) and why (`why`).
inline absl::Status StaleError(const std::vector<std::string>& names, const std::string& why) {
  if (names.empty()) return absl::OkStatus();
  std::string msg = "stale registration: parameter";
  msg += names.size() == 1 ? " " : "s ";
  for (size_t i = 0; i < names.size() && i < 16; ++i) msg += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 16) msg += ", ... (" + std::to_string(names.size()) + " in all)";
  if (!why.empty()) msg += ": " + why;
  msg += "; refitd does not write into it (the engine must register again)";
  return absl::FailedPreconditionError(msg);
}

// What an engine that sleeps leaves registered: its parameter list, and no mappings. Every read
// and write is refused (FailedPrecondition naming the parameter); the engine registers storage
// again when it wakes.
class ReleasedEngineStorage final : public EngineStorage {
 public:
  ReleasedEngineStorage(std::vector<ParamInfo> params, bool on_device, int device)
      : params_(std::move(params)), on_device_(on_device), device_(device) {}
  const std::vector<ParamInfo>& params() const override { return params_; }
  absl::Status WriteFromHost(size_t index, const void*) override { return Asleep(index); }
  absl::Status WriteFromDevice(const DeviceWrite& w) override { return Asleep(w.index); }
  absl::Status ReadToHost(size_t index, void*) const override { return Asleep(index); }
  absl::Status PrepareDeviceWrites(const std::vector<DeviceWrite>& writes) override {
    return Asleep(writes.empty() ? params_.size() : writes[0].index);
  }
  absl::Status Flush() override { return absl::OkStatus(); }
  absl::Status Audit() const override {
    return absl::FailedPreconditionError("the engine is asleep: its parameters are not mapped");
  }
  bool on_device() const override { return on_device_; }
  int device() const override { return device_; }

 private:
  absl::Status Asleep(size_t index) const {
    return absl::FailedPreconditionError(
        index < params_.size() ? "parameter '" + params_[index].name + "': the engine is asleep (not mapped)"
                               : std::string("the engine is asleep (not mapped)"));
  }
  std::vector<ParamInfo> params_;
  bool on_device_;
  int device_;
};

inline absl::Status CheckDeviceWrite(const std::vector<ParamInfo>& params, const DeviceWrite& w) {
  if (w.index >= params.size()) return absl::OutOfRangeError("parameter index " + std::to_string(w.index));
  const uint64_t n = params[w.index].nbytes;
  if (w.offset > n || w.bytes > n - w.offset) {
    return absl::OutOfRangeError("parameter '" + params[w.index].name + "': a write of " + std::to_string(w.bytes) +
                                 " bytes at offset " + std::to_string(w.offset) + " runs past its " +
                                 std::to_string(n) + " bytes");
  }
  return absl::OkStatus();
}

inline absl::StatusOr<uint64_t> EngineStorage::Checksum(size_t index) const {
  if (index >= params().size()) return absl::OutOfRangeError("parameter index " + std::to_string(index));
  std::vector<uint8_t> bytes(params()[index].nbytes);
  absl::Status read = ReadToHost(index, bytes.data());
  if (!read.ok()) return read;
  return ParallelChecksum64(bytes.data(), bytes.size());
}

}  // namespace refit::storage

#endif  // REFIT_STORAGE_ENGINE_STORAGE_H_
