#include "storage/cuda_ipc_storage.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_handles.h"
#include "common/cuda_status.h"
#include "common/device_env.h"
#include "common/status_macros.h"
#include "storage/memory.h"
#include "storage/vmm_import.h"

namespace refit::storage {
namespace {

// The storage's stream; the default stream for a registration without parameters (which has none).
cudaStream_t StreamOf(const std::unique_ptr<CudaStream>& stream) { return stream ? stream->get() : nullptr; }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcEngineStorage>> CudaIpcEngineStorage::Open(std::vector<CudaIpcParam> params) {
  auto s = std::unique_ptr<CudaIpcEngineStorage>(new CudaIpcEngineStorage());
  if (params.empty()) return s;
  s->device_ = params[0].device;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return CudaStatus(e, "CUDA IPC storage: no usable CUDA device");
  for (const CudaIpcParam& p : params) {
    if (p.device != s->device_) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.info.name, "' is on device ", p.device,
                                                     "; all parameters of one registration must share a device"));
    }
  }
  if (s->device_ < 0 || s->device_ >= count) {
    return absl::InvalidArgumentError(absl::StrCat("engine device ", s->device_, " does not exist (", count, " devices)"));
  }
  absl::StatusOr<CudaStream> stream = CudaStream::Create(s->device_);
  if (!stream.ok()) return stream.status();
  s->stream_ = std::make_unique<CudaStream>(std::move(*stream));
  // (Failing here, it is made at the first checksum, which then reports a failure.)
  if (absl::StatusOr<DeviceAllocation> word = DeviceAllocation::Allocate(s->device_, sizeof(uint64_t)); word.ok()) {
    s->checksum_word_ = std::move(*word);
  }
  if (absl::Status st = CudaStatus(cudaSetDevice(s->device_), "cudaSetDevice"); !st.ok()) return st;  // handles open here
  DeviceEnv& env = DefaultDeviceEnv();
  for (CudaIpcParam& p : params) {
    absl::StatusOr<uint64_t> dense = DenseBytes(p.info.dtype, p.info.shape);
    if (!dense.ok() || *dense != p.info.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.info.name, "': nbytes ", p.info.nbytes,
                                                     " does not match ", DTypeName(p.info.dtype), ShapeString(p.info.shape)));
    }
    uint8_t* base = nullptr;
    uint64_t vmm_size = 0;  // refitd's mapping of a virtual-memory allocation: all its pieces
    if (p.vmm != nullptr) {
      auto it = s->imported_.find(p.vmm.get());
      if (it == s->imported_.end()) {
        std::vector<VmmImport::Piece> pieces;
        for (const VmmSourcePiece& piece : p.vmm->pieces) pieces.push_back({piece.fd.get(), piece.size});
        absl::StatusOr<std::unique_ptr<VmmImport>> imported = VmmImport::Import(pieces, s->device_);
        if (!imported.ok()) {
          return absl::Status(imported.status().code(), absl::StrCat("parameter '", p.info.name, "': mapping its CUDA ",
                                                                     "virtual-memory allocation: ",
                                                                     imported.status().message()));
        }
        it = s->imported_.emplace(p.vmm.get(), std::move(*imported)).first;
      }
      base = it->second->address();
      vmm_size = it->second->size();
    } else {
      auto it = s->opened_.find(p.handle);
      if (it == s->opened_.end()) {
        cudaIpcMemHandle_t h;
        std::memcpy(&h, p.handle.data(), sizeof(h));
        void* opened = nullptr;
        if ((e = cudaIpcOpenMemHandle(&opened, h, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess) {
          return CudaStatus(e, absl::StrCat("parameter '", p.info.name, "': cudaIpcOpenMemHandle"));
        }
        it = s->opened_.emplace(p.handle, opened).first;
      }
      base = static_cast<uint8_t*>(it->second);
    }
    uint64_t range_base = reinterpret_cast<uint64_t>(base);
    uint64_t range_size = vmm_size;
    // (cuMemGetAddressRange of a mapping made of several pieces gives the first piece only.)
    if (vmm_size == 0) {
      absl::StatusOr<AddressRange> range = env.QueryAddressRange(base);
      if (absl::IsUnavailable(range.status())) return range.status();  // the driver has no such query
      if (!range.ok()) {
        return absl::UnavailableError(absl::StrCat("parameter '", p.info.name, "': cannot query its allocation"));
      }
      range_base = range->base;
      range_size = range->size;
    }
    const uint64_t avail = range_size - (reinterpret_cast<uint64_t>(base) - range_base);
    if (p.offset > avail || p.info.nbytes > avail - p.offset) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.info.name, "': [", p.offset, ", +", p.info.nbytes,
                                                     ") lies outside its CUDA allocation of ", avail, " bytes"));
    }
    s->ranges_[base] = Range{range_base, range_size, vmm_size != 0};
    s->mapping_of_.push_back(base);
    s->addrs_.push_back(base + p.offset);
    s->infos_.push_back(std::move(p.info));
  }
  return s;
}

CudaIpcEngineStorage::~CudaIpcEngineStorage() {
  batch_.reset();
  stream_.reset();  // waits for the copies into the mappings, then destroys the stream
  for (auto& [handle, base] : opened_) cudaIpcCloseMemHandle(base);
  imported_.clear();  // unmaps refitd's view of each virtual-memory allocation and releases it
}

absl::Status CudaIpcEngineStorage::WriteFromHost(size_t index, const void* src) {
  cudaSetDevice(device_);
  if (index >= infos_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  return CudaStatus(cudaMemcpyAsync(addrs_[index], src, infos_[index].nbytes, cudaMemcpyHostToDevice, StreamOf(stream_)),
                    absl::StrCat("writing '", infos_[index].name, "'"));
}

absl::Status CudaIpcEngineStorage::WriteFromDevice(const DeviceWrite& w) {
  cudaSetDevice(device_);
  if (absl::Status st = CheckDeviceWrite(infos_, w); !st.ok()) return st;
  return CudaStatus(cudaMemcpyAsync(addrs_[w.index] + w.offset, w.src, w.bytes,
                                    cudaMemcpyDeviceToDevice, StreamOf(stream_)),
                    absl::StrCat("writing '", infos_[w.index].name, "'"));
}

absl::Status CudaIpcEngineStorage::ReadToHost(size_t index, void* dst) const {
  cudaSetDevice(device_);
  if (index >= infos_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  cudaStream_t stream = StreamOf(stream_);
  cudaError_t e = cudaMemcpyAsync(dst, addrs_[index], infos_[index].nbytes, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  return CudaStatus(e, absl::StrCat("reading '", infos_[index].name, "'"));
}

absl::StatusOr<uint64_t> CudaIpcEngineStorage::Checksum(size_t index) const {
  if (index >= infos_.size()) return absl::OutOfRangeError(absl::StrCat("parameter index ", index));
  return DeviceChecksum64(device_, addrs_[index], infos_[index].nbytes, StreamOf(stream_), checksum_word_);
}

namespace {

// The CUDA device of device memory `p`, or -1.
int DeviceOf(const void* p) {
  absl::StatusOr<PointerInfo> info = DefaultDeviceEnv().QueryPointer(p);
  return info.ok() && info->memory == PointerMemory::kDevice ? info->device : -1;
}

// Whether kernels on the current device `device` can read memory of `other` (peer access, enabled
// here once per process and device pair).
bool CanRead(int device, int other) {
  if (other < 0 || other == device) return true;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, other) != cudaSuccess || can == 0) return false;
  cudaError_t e = cudaDeviceEnablePeerAccess(other, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
  return e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
}

}  // namespace

absl::Status CudaIpcEngineStorage::PrepareDeviceWrites(const std::vector<DeviceWrite>& writes) {
  cudaSetDevice(device_);  // callers run on arbitrary threads; the table and kernel live on our device
  std::vector<kernels::CopyRegion> regions;
  unbatched_.clear();
  batch_.reset();
  prepared_ = false;
  // Staging on another GPU (an engine rank whose parts were staged where the converter runs): the
  // batch kernel reads it over peer access; without peer access each write is its own copy. One
  // commit's writes all come from one staging pool, on one GPU: asked once, not per write (a MoE
  // commit has tens of thousands).
  const bool readable = writes.empty() || CanRead(device_, DeviceOf(writes.front().src));
  for (const DeviceWrite& w : writes) {
    if (absl::Status st = CheckDeviceWrite(infos_, w); !st.ok()) return st;
    if (!readable) {
      unbatched_.push_back(w);
      continue;
    }
    regions.push_back({addrs_[w.index] + w.offset, w.src, w.bytes});
  }
  prepared_ = regions.empty();
  if (regions.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<kernels::BatchCopy>> batch =
      kernels::BatchCopy::Create(regions.data(), regions.size(), StreamOf(stream_));
  if (!batch.ok()) return batch.status();
  batch_ = std::move(*batch);
  prepared_ = true;
  return absl::OkStatus();
}

absl::Status CudaIpcEngineStorage::WritePreparedDevice() {
  if (!prepared_) return absl::FailedPreconditionError("no prepared device writes");
  cudaSetDevice(device_);
  if (batch_ != nullptr) REFIT_RETURN_IF_ERROR(batch_->Launch(StreamOf(stream_)));
  for (const DeviceWrite& w : unbatched_) REFIT_RETURN_IF_ERROR(WriteFromDevice(w));
  return absl::OkStatus();
}

absl::Status CudaIpcEngineStorage::Audit() const {
  if (infos_.empty()) return absl::OkStatus();
  DeviceEnv& env = DefaultDeviceEnv();
  cudaSetDevice(device_);
  std::map<void*, std::string> stale_mappings;
  for (const auto& [mapped, range] : ranges_) {
    if (range.imported) continue;
    absl::StatusOr<AddressRange> now = env.QueryAddressRange(mapped);
    if (absl::IsUnavailable(now.status())) return now.status();  // the driver has no such query
    if (!now.ok()) {
      stale_mappings[mapped] = "its CUDA allocation is no longer mapped";
    } else if (now->base != range.base || now->size != range.size) {
      stale_mappings[mapped] =
          absl::StrCat("its CUDA allocation changed from ", range.size, " bytes at 0x", absl::Hex(range.base), " to ",
                       now->size, " bytes at 0x", absl::Hex(now->base));
    }
  }
  std::vector<std::string> stale;
  std::string why;
  for (size_t i = 0; i < infos_.size(); ++i) {
    auto it = stale_mappings.find(mapping_of_[i]);
    if (it == stale_mappings.end()) continue;
    if (why.empty()) why = it->second;
    stale.push_back(infos_[i].name);
  }
  return StaleError(stale, why);
}

absl::Status CudaIpcEngineStorage::Flush() {
  cudaSetDevice(device_);
  return CudaStatus(cudaStreamSynchronize(StreamOf(stream_)), "commit copy");
}

}  // namespace refit::storage
