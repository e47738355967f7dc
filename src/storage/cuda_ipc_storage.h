// EngineStorage over the engine's own GPU memory: each parameter is (IPC handle of the engine's
// allocation, offset, device), or (its CUDA virtual-memory allocation's file descriptor, offset).
// refitd opens each distinct allocation once per registration (cudaIpcOpenMemHandle; a VmmImport,
// storage/vmm_import.h, for virtual memory) and writes through the mapped address with
// cudaMemcpyAsync on its own stream; Flush synchronizes that stream, so every byte is in place
// before the engine is resumed. Destroying the storage (unregistration, sleep, the engine's
// death) closes every handle and unmaps every import. Built only with CUDA.
//
// Threading: as EngineStorage (one committer thread at a time).
#ifndef REFIT_STORAGE_CUDA_IPC_STORAGE_H_
#define REFIT_STORAGE_CUDA_IPC_STORAGE_H_

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device_allocation.h"
#include "kernels/batch_copy.h"
#include "storage/cuda_params.h"
#include "storage/engine_storage.h"

namespace refit {
class CudaStream;  // common/cuda_handles.h (kept out of this header: no CUDA include here)
}  // namespace refit

namespace refit::storage {

class VmmImport;  // storage/vmm_import.h

class CudaIpcEngineStorage : public EngineStorage {
 public:
  // Opens every distinct handle (imports every distinct virtual-memory allocation) once and checks each parameter against its allocation's size
  // (cuMemGetAddressRange), overflow-safe; errors name the parameter.
  static absl::StatusOr<std::unique_ptr<CudaIpcEngineStorage>> Open(std::vector<CudaIpcParam> params);
  ~CudaIpcEngineStorage() override;

  const std::vector<ParamInfo>& params() const override { return infos_; }
  absl::Status WriteFromHost(size_t index, const void* src) override;
  absl::Status WriteFromDevice(const DeviceWrite& write) override;
  absl::Status ReadToHost(size_t index, void* dst) const override;
  absl::StatusOr<uint64_t> Checksum(size_t index) const override;  // on the GPU
  absl::Status Flush() override;
  absl::Status PrepareDeviceWrites(const std::vector<DeviceWrite>& writes) override;
  absl::Status WritePreparedDevice() override;
  // Each mapped allocation still spans the range (base, size) it had when opened.
  absl::Status Audit() const override;
  bool on_device() const override { return true; }
  int device() const override { return device_; }
  uint8_t* MappedAddress(size_t index) const override { return index < addrs_.size() ? addrs_[index] : nullptr; }

 private:
  CudaIpcEngineStorage() = default;
  std::vector<ParamInfo> infos_;
  std::vector<uint8_t*> addrs_;
  std::map<std::array<uint8_t, kCudaIpcHandleBytes>, void*> opened_;
  std::map<const VmmSource*, std::unique_ptr<VmmImport>> imported_;
  struct Range {
    uint64_t base = 0;  // cuMemGetAddressRange of the mapping when opened
    uint64_t size = 0;
    // refitd's own mapping of a virtual-memory allocation (imported): it stays until refitd
    // unmaps it, so the audit skips it (the engine's side is the agent's audit).
    bool imported = false;
  };
  std::map<void*, Range> ranges_;  // by mapped address
  std::vector<void*> mapping_of_;  // per parameter
  std::unique_ptr<CudaStream> stream_;
  // Checksum's result word on device_ (DeviceChecksum64), made at Open: no allocation inside a
  // commit's pause. Mutable: Checksum is const, and one committer thread uses the storage at a time.
  mutable DeviceAllocation checksum_word_;
  std::unique_ptr<kernels::BatchCopy> batch_;
  // Prepared writes from another GPU that this one cannot read (no peer access): copied one by
  // one, which the driver routes through the host.
  std::vector<DeviceWrite> unbatched_;
  bool prepared_ = false;
  int device_ = 0;
};

}  // namespace refit::storage

#endif  // REFIT_STORAGE_CUDA_IPC_STORAGE_H_
