#include "transport_test_support.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "transport/builtin_transports.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_sender.h"
#include "ucx_leak_watch.h"
#if REFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "../cuda_device.h"
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

// A further UCX configuration beyond the registered transport's defaults (the shared-memory
// lanes, which need the connection-manager error mode).
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

// Two CUDA devices, for transports whose payloads live on the GPU: the receiver on device 1, the
// sender on device 0 (NCCL refuses two ranks of one communicator on one device).
std::string TwoDevicesMissing() {
#if REFIT_HAVE_CUDA
  return ::refit::testing::MissingCudaDevices(2);
#else
  return "needs CUDA";
#endif
}

// One CUDA device, for device-payload transports whose two ends may share it (CUDA IPC).
std::string OneDeviceMissing() {
#if REFIT_HAVE_CUDA
  return ::refit::testing::MissingCudaDevices(1);
#else
  return "needs CUDA";
#endif
}

// A registered transport as its descriptor makes it: refitd's listen defaults, the client's
// connect. Device payloads: both ends on device 0 when the descriptor says they may share a GPU,
// otherwise the receiver on device 1 and the sender on device 0.
TransportConfig RegisteredConfig(const TransportDescriptor& d) {
  ListenConfig listen;
  for (const ConfigKey& k : d.config_keys) listen.keys[k.name] = k.default_value;
  ConnectConfig connect;
  const bool on_device = d.payload_memory != storage::MemoryKind::kHost;
  if (on_device && !d.shares_device) {
    listen.device = 1;
    connect.device = 0;
  }
  std::function<std::string()> unavailable;
  if (on_device) unavailable = d.shares_device ? OneDeviceMissing : TwoDevicesMissing;
  return TransportConfig{
      d.name,
      [listen, f = d.listen]() { return f(listen); },
      [connect, f = d.connect](const std::string& endpoint) { return f(endpoint, connect); },
      unavailable,
      d.checks_integrity};
}

}  // namespace

void QuietTransportLogs() { WatchUcxLeaks(); }

std::vector<TransportConfig> AllTransportConfigs() {
  std::vector<TransportConfig> out;
  const TransportRegistry transports = BuiltinTransports();
  for (const TransportDescriptor& d : transports.descriptors()) out.push_back(RegisteredConfig(d));
  out.push_back(UcxConfig("ucx_tcp", "tcp", UcxErrorMode::kPeer));
  out.push_back(UcxConfig("ucx_shm", "sm,self,tcp", UcxErrorMode::kConnectionManager));
  return out;
}

std::optional<TransportConfig> FindTransportConfig(std::string_view name) {
  for (TransportConfig& c : AllTransportConfigs()) {
    if (c.name == name) return std::move(c);
  }
  return std::nullopt;
}

std::string TestSenderPath() {
  if (const char* path = std::getenv("REFIT_TRANSPORT_TEST_SENDER"); path != nullptr && *path != '\0') {
    return path;
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (const std::filesystem::path& dir : {self.parent_path(), self.parent_path().parent_path()}) {
    std::filesystem::path candidate = dir / "transport_test_sender";
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
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
