// CUDA virtual-memory parameters end to end on one GPU, in one process playing both sides: the
// engine allocates with cuMemCreate (POSIX file descriptor handle type) and maps at an address it
// reserved; the engine agent's export (client/cuda_export.h) gives one descriptor for the mapping;
// refitd's storage imports it (storage/vmm_import.h) and writes a refit through its own mapping;
// the engine reads the bytes at its address. Sleep: the engine unmaps and releases its physical
// memory, which cudaMemGetInfo shows freed only once refitd dropped its storage too; wake maps new
// memory at the same address, registers again, and a second refit lands there. A parameter across
// two allocations mapped one after the other is one run of two descriptors. And against a real
// refitd process: a registration's memory is freed at the engine's first sleep once the client
// has finished the registration call. Skips, saying why, without a GPU or virtual memory
// management.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <chrono>
#include <thread>

#include "../cuda_device.h"
#include "../refitd_process.h"
#include "capnp/rpc-twoparty.h"
#include "client/cuda_export.h"
#include "common/control_connect.h"
#include "common/cuda_status.h"
#include "common/cuda_vmm.h"
#include "common/fd_passing.h"
#include "gtest/gtest.h"
#include "kj/async-io.h"
#include "proto/refit.capnp.h"
#include "proto/wire.h"
#include "storage/cuda_ipc_storage.h"

namespace refit::storage {
namespace {

// The engine's side of virtual memory, as PyTorch's expandable segments or vLLM's allocator do it.
CUmemAllocationProp Prop(CUmemAllocationHandleType handle_type) { return DeviceVmmProp(0, handle_type); }

class VmmStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REFIT_SKIP_WITHOUT_GPU();
    cudaSetDevice(0);
    cudaFree(nullptr);
    if (!d_.can_allocate()) GTEST_SKIP() << "the CUDA driver lacks the cuMem* entry points";
    CUmemAllocationProp prop = Prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (d_.granularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      GTEST_SKIP() << "device 0 has no virtual memory management with POSIX file descriptors";
    }
    size_ = ((64u << 20) + granularity_ - 1) / granularity_ * granularity_;  // big enough to see in cudaMemGetInfo
    ASSERT_EQ(d_.reserve(&va_, size_, granularity_, 0, 0), CUDA_SUCCESS);
  }
  void TearDown() override {
    if (mapped_) Unmap();
    if (va_ != 0) d_.address_free(va_, size_);
  }
  // Physical memory of `handle_type`, mapped at the reserved address.
  void Map(CUmemAllocationHandleType handle_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    CUmemAllocationProp prop = Prop(handle_type);
    ASSERT_EQ(d_.create(&handle_, size_, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(d_.map(va_, size_, 0, handle_, 0), CUDA_SUCCESS);
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(d_.set_access(va_, size_, &access, 1), CUDA_SUCCESS);
    mapped_ = true;
  }
  void Unmap() {
    if (second_ != 0) {
      ASSERT_EQ(d_.unmap(va_, half_), CUDA_SUCCESS);
      ASSERT_EQ(d_.unmap(va_ + half_, size_ - half_), CUDA_SUCCESS);
      ASSERT_EQ(d_.release(second_), CUDA_SUCCESS);
      second_ = 0;
    } else {
      ASSERT_EQ(d_.unmap(va_, size_), CUDA_SUCCESS);
    }
    ASSERT_EQ(d_.release(handle_), CUDA_SUCCESS);
    mapped_ = false;
  }
  // Two allocations mapped one after the other over the reserved range, as expandable segments
  // grow a segment.
  void MapTwoPieces() {
    CUmemAllocationProp prop = Prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    half_ = size_ / granularity_ / 2 * granularity_;
    ASSERT_EQ(d_.create(&handle_, half_, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(d_.create(&second_, size_ - half_, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(d_.map(va_, half_, 0, handle_, 0), CUDA_SUCCESS);
    ASSERT_EQ(d_.map(va_ + half_, size_ - half_, 0, second_, 0), CUDA_SUCCESS);
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(d_.set_access(va_, size_, &access, 1), CUDA_SUCCESS);
    mapped_ = true;
  }
  std::vector<client::DevicePtrParam> Params() const {
    auto* base = reinterpret_cast<uint8_t*>(va_);
    return {{"a.weight", DType::kF32, {1024}, base}, {"b.weight", DType::kF32, {2048}, base + 8192}};
  }
  // refitd's storage over what the export gave (the server's ReadEngineParams in one step).
  static absl::StatusOr<std::unique_ptr<CudaIpcEngineStorage>> Open(const client::InPlaceExport& exported) {
    std::vector<CudaIpcParam> params;
    std::shared_ptr<VmmSource> source;
    for (const client::CudaParam& p : exported.params) {
      if (p.vmm == nullptr) return absl::InvalidArgumentError("not exported as virtual memory: " + p.name);
      if (source == nullptr) {
        source = std::make_shared<VmmSource>();
        for (const client::VmmPiece& piece : p.vmm->pieces) source->pieces.push_back({UniqueFd(dup(piece.fd.get())), piece.size});
        source->size = p.vmm->size;
        source->device = p.vmm->device;
      }
      absl::StatusOr<uint64_t> n = DenseBytes(p.dtype, p.shape);
      params.push_back({{p.name, p.dtype, p.shape, *n}, {}, p.offset, p.device, source});
    }
    return CudaIpcEngineStorage::Open(std::move(params));
  }
  // Refits parameter `index` with floats `seed + i` through refitd's mapping and reads them at
  // the engine's address.
  void RefitAndReadBack(CudaIpcEngineStorage& storage, size_t index, float seed) {
    const ParamInfo& info = storage.params()[index];
    std::vector<float> want(info.nbytes / sizeof(float));
    for (size_t i = 0; i < want.size(); ++i) want[i] = seed + static_cast<float>(i);
    ASSERT_TRUE(storage.WriteFromHost(index, want.data()).ok());
    ASSERT_TRUE(storage.Flush().ok());
    std::vector<float> got(want.size());
    const uint64_t offset = index == 0 ? 0 : 8192;
    ASSERT_EQ(cudaMemcpy(got.data(), reinterpret_cast<void*>(va_ + offset), info.nbytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(got, want) << info.name;
  }
  static size_t FreeBytes() {
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return free;
  }

  const CudaVmmDriver& d_ = VmmDriver();
  size_t granularity_ = 0;
  size_t size_ = 0;
  CUdeviceptr va_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  CUmemGenericAllocationHandle second_ = 0;  // MapTwoPieces
  size_t half_ = 0;
  bool mapped_ = false;
};

TEST_F(VmmStorageTest, RefitsSleepsFreesTheMemoryAndWakesAtTheSameAddress) {
  Map();
  absl::StatusOr<client::InPlaceExport> exported = client::ExportInPlace(Params());
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->allocations, 1u);
  ASSERT_EQ(exported->params.size(), 2u);
  EXPECT_EQ(exported->params[0].vmm, exported->params[1].vmm);  // one descriptor for the mapping
  EXPECT_EQ(exported->params[1].offset, 8192u);
  EXPECT_EQ(exported->params[0].vmm->size, size_);
  absl::StatusOr<std::unique_ptr<CudaIpcEngineStorage>> storage = Open(*exported);
  ASSERT_TRUE(storage.ok()) << storage.status();
  RefitAndReadBack(**storage, 0, 1.0f);
  RefitAndReadBack(**storage, 1, 100.0f);
  EXPECT_TRUE((*storage)->Audit().ok());
  EXPECT_TRUE(client::AuditInPlace(exported->records).empty());

  // Sleep: the engine releases its memory; refitd's import alone keeps it until refitd drops it.
  const size_t before = FreeBytes();
  Unmap();
  const size_t engine_released = FreeBytes();
  EXPECT_LT(engine_released, before + size_ / 2) << "freed while refitd still maps it";
  storage->reset();
  exported = absl::UnknownError("dropped");  // the engine's exported descriptor, too
  const size_t all_released = FreeBytes();
  EXPECT_GE(all_released, before + size_ / 2) << "not freed after refitd dropped its mapping";

  // Wake: new physical memory at the same address, registered again; a refit lands there.
  Map();
  absl::StatusOr<client::InPlaceExport> woken = client::ExportInPlace(Params());
  ASSERT_TRUE(woken.ok()) << woken.status();
  absl::StatusOr<std::unique_ptr<CudaIpcEngineStorage>> again = Open(*woken);
  ASSERT_TRUE(again.ok()) << again.status();
  RefitAndReadBack(**again, 0, 7.0f);
  RefitAndReadBack(**again, 1, 700.0f);
}

TEST_F(VmmStorageTest, AParameterAcrossTwoMappedPiecesIsOneRunOfTwoDescriptors) {
  MapTwoPieces();
  auto* base = reinterpret_cast<uint8_t*>(va_);
  const int64_t floats = static_cast<int64_t>(2 * granularity_ / sizeof(float));  // across the boundary
  std::vector<client::DevicePtrParam> params = {{"a.weight", DType::kF32, {1024}, base},
                                                {"b.weight", DType::kF32, {floats}, base + half_ - granularity_}};
  absl::StatusOr<client::InPlaceExport> exported = client::ExportInPlace(params);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->allocations, 1u);
  ASSERT_EQ(exported->params[1].vmm, exported->params[0].vmm);
  ASSERT_EQ(exported->params[1].vmm->pieces.size(), 2u);
  EXPECT_EQ(exported->params[1].offset, half_ - granularity_);
  std::vector<CudaIpcParam> storage_params;
  auto source = std::make_shared<VmmSource>();
  for (const client::VmmPiece& piece : exported->params[0].vmm->pieces) {
    source->pieces.push_back({UniqueFd(dup(piece.fd.get())), piece.size});
  }
  source->size = exported->params[0].vmm->size;
  for (const client::CudaParam& p : exported->params) {
    storage_params.push_back({{p.name, p.dtype, p.shape, *DenseBytes(p.dtype, p.shape)}, {}, p.offset, 0, source});
  }
  absl::StatusOr<std::unique_ptr<CudaIpcEngineStorage>> storage = CudaIpcEngineStorage::Open(std::move(storage_params));
  ASSERT_TRUE(storage.ok()) << storage.status();
  std::vector<float> want(static_cast<size_t>(floats));
  for (size_t i = 0; i < want.size(); ++i) want[i] = 3.0f + static_cast<float>(i);
  ASSERT_TRUE((*storage)->WriteFromHost(1, want.data()).ok());
  ASSERT_TRUE((*storage)->Flush().ok());
  std::vector<float> got(want.size());
  ASSERT_EQ(cudaMemcpy(got.data(), base + half_ - granularity_, want.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, want);
  EXPECT_TRUE((*storage)->Audit().ok());
  EXPECT_TRUE(client::AuditInPlace(exported->records).empty());
}

// Carries one descriptor, as the engine agent's capability does.
class FdCap final : public proto::SharedFd::Server {
 public:
  explicit FdCap(int fd) : fd_(fd) {}
  kj::Maybe<int> getFd() override { return fd_; }

 private:
  int fd_;
};

// refitd answers a registration with a capability, so Cap'n Proto keeps the call, and with it the
// request's capabilities (each holding the descriptor it carried), until the client finishes it
// by dropping the answer (as the engine agent does at once). Then the engine's first sleep frees
// its memory.
TEST_F(VmmStorageTest, ARealRefitdFreesTheRegisteredMemoryAtTheFirstSleep) {
  unsetenv("REFITD_TOKEN");
  refit::testing::RefitdProcess refitd(REFITD_BINARY);
  Map();
  absl::StatusOr<client::InPlaceExport> exported = client::ExportInPlace(Params());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto io = kj::setupAsyncIo();
  absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  absl::StatusOr<kj::Own<kj::AsyncIoStream>> conn =
      ConnectControl(io.provider->getNetwork(), io.waitScope, refitd.address(), *options);
  ASSERT_TRUE(conn.ok()) << conn.status();
  kj::Maybe<kj::AsyncCapabilityStream&> caps = UnixCapabilityStream(**conn);
  ASSERT_TRUE(caps != nullptr);
  capnp::TwoPartyClient rpc(KJ_ASSERT_NONNULL(caps), kMaxFdsPerMessage);
  auto req = rpc.bootstrap().castAs<proto::Daemon>().registerEngineRequest();
  auto list = req.initParams(static_cast<unsigned>(exported->params.size()));
  for (size_t i = 0; i < exported->params.size(); ++i) {
    const client::CudaParam& p = exported->params[i];
    auto b = list[static_cast<unsigned>(i)];
    b.setName(p.name);
    b.setDtype(std::string(DTypeName(p.dtype)));
    auto shape = b.initShape(static_cast<unsigned>(p.shape.size()));
    for (size_t k = 0; k < p.shape.size(); ++k) shape.set(static_cast<unsigned>(k), p.shape[k]);
    b.setNbytes(*DenseBytes(p.dtype, p.shape));
    auto v = b.getStorage().initCudaVmm();
    if (i == 0) v.setFd(kj::heap<FdCap>(p.vmm->pieces[0].fd.get()));
    v.setAllocation(0);
    v.setOffset(p.offset);
    v.setSize(p.vmm->size);
    v.setDevice(p.vmm->device);
  }
  req.setControl(kj::heap<proto::EngineControl::Server>());
  proto::Registration::Client registration = nullptr;
  {
    auto registered = req.send().wait(io.waitScope);
    ASSERT_TRUE(wire::FromWire(registered.getStatus()).ok()) << wire::FromWire(registered.getStatus()) << refitd.Log();
    registration = registered.getRegistration();
  }  // the answer goes: the call is finished
  auto slept = registration.sleepRequest().send().wait(io.waitScope);
  ASSERT_TRUE(wire::FromWire(slept.getStatus()).ok()) << wire::FromWire(slept.getStatus());

  // The engine releases its memory and its descriptor: nothing else may hold the memory now.
  const size_t before = FreeBytes();
  Unmap();
  exported = absl::UnknownError("dropped");
  bool freed = false;
  for (int i = 0; i < 500 && !freed; ++i) {
    freed = FreeBytes() >= before + size_ / 2;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(freed) << "released " << size_ << " bytes at the first sleep, "
                     << static_cast<int64_t>(FreeBytes()) - static_cast<int64_t>(before)
                     << " came back\n" << refitd.Log();
}

TEST_F(VmmStorageTest, AnAllocationWithoutTheDescriptorHandleTypeIsRefusedNamingTheParameter) {
  Map(CU_MEM_HANDLE_TYPE_NONE);
  absl::StatusOr<client::InPlaceExport> exported = client::ExportInPlace(Params());
  ASSERT_FALSE(exported.ok());
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(exported.status().message().find("'a.weight'"), std::string::npos) << exported.status();
  EXPECT_NE(exported.status().message().find("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"), std::string::npos);
}

TEST_F(VmmStorageTest, AParameterPastTheMappedMemoryIsRefusedNamingIt) {
  Map();
  std::vector<client::DevicePtrParam> params = {
      {"too.long", DType::kF32, {static_cast<int64_t>(size_ / 4)}, reinterpret_cast<uint8_t*>(va_) + 4096}};
  absl::StatusOr<client::InPlaceExport> exported = client::ExportInPlace(params);
  ASSERT_FALSE(exported.ok());
  EXPECT_NE(exported.status().message().find("'too.long'"), std::string::npos) << exported.status();
}

}  // namespace
}  // namespace refit::storage
