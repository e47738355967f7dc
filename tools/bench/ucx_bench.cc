// Loopback throughput of the UCX data plane: a sender thread pushes messages of several sizes to
// a receiver in the same process, once over tcp and once over shared memory, and the receiving
// side reports GB/s (10^9 bytes per second) from the first Send to the last completed Receive.
//   ucx_bench [total_mib_per_size]   (default 1024)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_sender.h"

namespace {

using refit::transport::UcxErrorMode;
using refit::transport::UcxOptions;
using refit::transport::UcxReceiver;
using refit::transport::UcxSender;

struct Config {
  const char* name;
  const char* tls;
  UcxErrorMode mode;
};

int Run(const Config& config, uint64_t total_bytes) {
  UcxOptions options;
  options.tls = config.tls;
  options.error_mode = config.mode;
  auto receiver = UcxReceiver::Listen(options);
  if (!receiver.ok()) {
    std::fprintf(stderr, "%s: %s\n", config.name, receiver.status().ToString().c_str());
    return 1;
  }
  auto sender = UcxSender::Connect((*receiver)->Endpoint(), options);
  if (!sender.ok()) {
    std::fprintf(stderr, "%s: %s\n", config.name, sender.status().ToString().c_str());
    return 1;
  }
  for (uint64_t size : {64ull << 10, 1ull << 20, 16ull << 20, 64ull << 20}) {
    const uint64_t count = std::max<uint64_t>(4, total_bytes / size);
    std::vector<uint8_t> src(size, 0x5A);
    std::vector<uint8_t> dst(size);
    absl::Time start = absl::Now();
    std::thread send([&] {
      for (uint64_t i = 0; i < count; ++i) {
        if (absl::Status st = (*sender)->Send(1, src.data(), size); !st.ok()) {
          std::fprintf(stderr, "send: %s\n", st.ToString().c_str());
          return;
        }
      }
    });
    bool ok = true;
    for (uint64_t i = 0; i < count && ok; ++i) {
      auto got = (*receiver)->Receive(1, dst.data(), size, absl::Now() + absl::Seconds(60));
      ok = got.ok() && *got == size;
      if (!ok) std::fprintf(stderr, "receive: %s\n", got.status().ToString().c_str());
    }
    send.join();
    if (!ok) return 1;
    double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("%-4s %9llu KiB x %5llu  %7.2f GB/s\n", config.name,
                static_cast<unsigned long long>(size >> 10),
                static_cast<unsigned long long>(count),
                static_cast<double>(size * count) / seconds / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t total_mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  (void)refit::transport::ucx::SetUcxLogLevel("error");
  int rc = 0;
  for (const Config& c : {Config{"tcp", "tcp", UcxErrorMode::kPeer},
                          Config{"shm", "sm,self,tcp", UcxErrorMode::kConnectionManager}}) {
    rc |= Run(c, total_mib << 20);
  }
  return rc;
}
