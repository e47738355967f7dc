#include "transport_test_support.h"

#include <cstring>

#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_sender.h"
#if REFIT_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "transport/nccl/nccl_receiver.h"
#include "transport/nccl/nccl_sender.h"
#endif

namespace refit::transport::testing {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint8_t PatternByte(uint64_t seed, uint64_t offset) {
  return static_cast<uint8_t>(SplitMix64(seed * 0x100000001b3ull + offset / 8) >> (8 * (offset % 8)));
}

TransportConfig UcxConfig(std::string name, std::string tls, UcxErrorMode error_mode) {
  UcxOptions options;
  options.tls = std::move(tls);
  options.error_mode = error_mode;
  return TransportConfig{
      std::move(name),
      [options] () -> absl::StatusOr<std::unique_ptr<Receiver>> {
        absl::StatusOr<std::unique_ptr<UcxReceiver>> r = UcxReceiver::Listen(options);
        if (!r.ok()) return r.status();
        return std::unique_ptr<Receiver>(*std::move(r));
      },
      [options](const std::string& endpoint) -> absl::StatusOr<std::unique_ptr<Sender>> {
        absl::StatusOr<std::unique_ptr<UcxSender>> s = UcxSender::Connect(endpoint, options);
        if (!s.ok()) return s.status();
        return std::unique_ptr<Sender>(*std::move(s));
      },
      nullptr};
}

#if REFIT_HAVE_NCCL
// Receiver on GPU 1, sender on GPU 0 (two ranks of one communicator need two devices).
TransportConfig NcclConfig() {
  return TransportConfig{
      "nccl",
      []() -> absl::StatusOr<std::unique_ptr<Receiver>> {
        NcclOptions options;
        options.device = 1;
        absl::StatusOr<std::unique_ptr<NcclReceiver>> r = NcclReceiver::Listen(options);
        if (!r.ok()) return r.status();
        return std::unique_ptr<Receiver>(*std::move(r));
      },
      [](const std::string& endpoint) -> absl::StatusOr<std::unique_ptr<Sender>> {
        NcclOptions options;
        options.device = 0;
        options.connect_timeout = absl::Seconds(20);
        absl::StatusOr<std::unique_ptr<NcclSender>> s = NcclSender::Connect(endpoint, options);
        if (!s.ok()) return s.status();
        return std::unique_ptr<Sender>(*std::move(s));
      },
      []() -> std::string {
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess) return std::string("needs 2 CUDA devices: ") + cudaGetErrorString(e);
        if (count < 2) return "needs 2 CUDA devices, " + std::to_string(count) + " present";
        return "";
      }};
}
#endif

}  // namespace

void QuietTransportLogs() { (void)ucx::SetUcxLogLevel("error"); }

std::vector<TransportConfig> AllTransportConfigs() {
  return {
      UcxConfig("ucx_tcp", "tcp", UcxErrorMode::kPeer),
      UcxConfig("ucx_shm", "sm,self,tcp", UcxErrorMode::kConnectionManager),
#if REFIT_HAVE_NCCL
      NcclConfig(),
#endif
  };
}

std::optional<TransportConfig> FindTransportConfig(std::string_view name) {
  for (TransportConfig& c : AllTransportConfigs()) {
    if (c.name == name) return std::move(c);
  }
  return std::nullopt;
}

void FillPattern(uint64_t seed, uint8_t* dst, uint64_t bytes) {
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word = SplitMix64(seed * 0x100000001b3ull + i / 8);
    std::memcpy(dst + i, &word, 8);  // little-endian, as PatternByte reads it
  }
  for (; i < bytes; ++i) dst[i] = PatternByte(seed, i);
}

std::vector<uint8_t> Pattern(uint64_t seed, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  FillPattern(seed, out.data(), bytes);
  return out;
}

int64_t FirstPatternMismatch(uint64_t seed, const uint8_t* data, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (data[i] != PatternByte(seed, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace refit::transport::testing
