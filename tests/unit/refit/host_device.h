// A host-backed stand-in for the engine GPU, so that the session's and the committer's device
// staging path (everything behind Session::device_ops()) runs, and is tested, without a GPU:
// memory that calls itself device memory but is plain host memory, a converter whose DeviceOps
// run the CPU reference code (src/refit/convert.h, src/formats/) on that memory, and engine
// storage that takes device writes into host (shm) parameters. Bytes equal the CPU path's by
// construction, so any difference a test sees comes from the session's or committer's handling
// of the device path itself.
//
// Threading: as the seams they implement (one converter thread; the memory is thread-safe); the
// stats are atomics, read by the test after a refit.
#ifndef REFIT_TESTS_UNIT_REFIT_HOST_DEVICE_H_
#define REFIT_TESTS_UNIT_REFIT_HOST_DEVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "refit/converter.h"
#include "refit/cpu_converter.h"
#include "storage/engine_storage.h"
#include "storage/memory.h"

namespace refit::host_device {

// MemoryKind::kDevice whose buffers are malloc'd host memory.
std::unique_ptr<storage::Memory> NewHostBackedDeviceMemory();

// Calls into the device ops, so that a test can tell which path a group took.
struct HostDeviceStats {
  std::atomic<int> groups_batched{0};   // ConvertAmaxGroup calls that converted their group
  std::atomic<int> groups_declined{0};  // ConvertAmaxGroup calls that returned false
  std::atomic<int> amax_resets{0};
  std::atomic<int> planned{0};  // ConvertPlanned calls
  std::atomic<int> copies{0};   // Copy calls (a held member's bytes leaving its slot among them)
};

struct HostDeviceOptions {
  // ConvertAmaxGroup converts the group (the GPU converter's batched run); false: it declines,
  // and the session takes ResetAmax / AccumulateAmax / ConvertPlanned with the device amax.
  bool batch_groups = true;
};

class HostDeviceOps final : public DeviceOps {
 public:
  HostDeviceOps(const HostDeviceOptions& options, HostDeviceStats& stats) : options_(options), stats_(stats) {}

  absl::Status ConvertPlanned(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                              storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                              const formats::QuantizeOptions& options, const PlannedAmax& amax) override;
  absl::Status ResetAmax(float* amax) override;
  absl::Status AccumulateAmax(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                              const formats::QuantizeOptions& options, float* amax) override;
  absl::Status Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, storage::MemoryKind src_kind) override;
  absl::StatusOr<bool> ConvertAmaxGroup(formats::Format format, std::span<const GroupMember> members,
                                        const formats::QuantizeOptions& options) override;
  absl::Status Copy2D(uint8_t* dst, uint64_t dst_pitch, const uint8_t* src, uint64_t src_pitch, uint64_t width,
                      uint64_t height) override;
  absl::Status Zero(uint8_t* dst, uint64_t bytes) override;
  absl::Status Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                            uint64_t out_bytes) override;
  absl::Status PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int32_t* out, uint64_t out_words,
                         const std::string& name) override;
  absl::Status AddOne(const uint8_t* w, DType dtype, int64_t n, uint8_t* out) override;
  absl::Status Synchronize() override;

  // Encode failures of batched groups, which the GPU finds in its kernels and reports per tensor
  // when the bucket completes (Converter::Sync).
  std::vector<std::pair<std::string, absl::Status>> TakeFailures() { return std::exchange(failed_, {}); }

 private:
  HostDeviceOptions options_;
  HostDeviceStats& stats_;
  std::vector<std::pair<std::string, absl::Status>> failed_;
  absl::Status pack_failure_;  // the first pack_ue8m0 check that failed, for Synchronize
};

// A converter with device staging whose work is the CPU reference's on host-backed device memory.
class HostDeviceConverter final : public Converter {
 public:
  explicit HostDeviceConverter(HostDeviceOptions options = {}) : ops_(options, stats_) {}

  storage::MemoryKind staging_kind() const override { return storage::MemoryKind::kDevice; }
  absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                       std::span<const formats::MutableBytes> outs, const formats::QuantizeOptions& options) override;
  std::vector<std::pair<std::string, absl::Status>> Sync() override { return ops_.TakeFailures(); }
  DeviceOps* device_ops() override { return &ops_; }

  const HostDeviceStats& stats() const { return stats_; }

 private:
  CpuConverter cpu_;
  HostDeviceStats stats_;
  HostDeviceOps ops_;
};

// Engine storage on "the device": `inner`'s parameters (mapped host memory, e.g. shm), written by
// the commit's device writes. REQUIRES: `inner` maps every parameter (MappedAddress).
class HostDeviceEngineStorage final : public storage::EngineStorage {
 public:
  explicit HostDeviceEngineStorage(std::unique_ptr<storage::EngineStorage> inner) : inner_(std::move(inner)) {}

  const std::vector<storage::ParamInfo>& params() const override { return inner_->params(); }
  absl::Status WriteFromHost(size_t index, const void* src) override { return inner_->WriteFromHost(index, src); }
  absl::Status WriteFromDevice(const storage::DeviceWrite& write) override;
  uint8_t* MappedAddress(size_t index) const override { return inner_->MappedAddress(index); }
  bool on_device() const override { return true; }
  int device() const override { return 0; }
  absl::Status ReadToHost(size_t index, void* dst) const override { return inner_->ReadToHost(index, dst); }
  absl::StatusOr<uint64_t> Checksum(size_t index) const override { return inner_->Checksum(index); }
  absl::Status Flush() override { return inner_->Flush(); }
  absl::Status Audit() const override { return inner_->Audit(); }

 private:
  std::unique_ptr<storage::EngineStorage> inner_;
};

}  // namespace refit::host_device

#endif  // REFIT_TESTS_UNIT_REFIT_HOST_DEVICE_H_
