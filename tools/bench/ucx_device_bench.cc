// The UCX data plane moving a bucket stream between two processes on one node, from a sender's
// buffers to a receiver's two ring slots, in the memory `memory` names:
//   device: cudaMalloc'ed on both sides (the trainer's GPU tensors to refitd's device ring). Needs a
//           UCX built with CUDA (cuda_copy, cuda_ipc: the PyPI libucx-cu13 wheel, not Debian's);
//           the program checks that UCX reports CUDA memory support and refuses otherwise.
//   host:   page-locked host buffers (the host data plane's path, for the same bytes).
// `tls` is UCX_TLS for both ends (e.g. "cuda_copy,cuda_ipc,sm,self,tcp"); errors are noticed
// through the connection manager, as for same-host peers (UcxErrorMode::kConnectionManager).
// Steady state: one warm-up pass, then `iters` passes, each timed from the end of the previous one
// to its last Receive. Prints the median as JSON (gbps: payload bytes per second).
//
//   ucx_device_bench <device|host> <tls> <total_bytes> <bucket_bytes> [iters=5]
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_sender.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using refit::transport::UcxErrorMode;
using refit::transport::UcxOptions;

int Die(const std::string& what) {
  std::fprintf(stderr, "ucx_device_bench: %s\n", what.c_str());
  return 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

UcxOptions Options(const char* tls) {
  UcxOptions options;
  options.tls = tls;
  options.error_mode = UcxErrorMode::kConnectionManager;
  return options;
}

void* Allocate(bool device, uint64_t bytes) {
  void* p = nullptr;
  cudaError_t err = device ? cudaMalloc(&p, bytes) : cudaMallocHost(&p, bytes);
  return err == cudaSuccess ? p : nullptr;
}

// Whether this process's UCX can read and write CUDA memory (a context with the memory type).
bool UcxHasCuda() {
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucp_context_h context = nullptr;
  if (ucp_init(&params, nullptr, &context) != UCS_OK) return false;
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const bool cuda = ucp_context_query(context, &attr) == UCS_OK &&
                    (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  ucp_cleanup(context);
  return cuda;
}

int Send(bool device, const char* tls, const std::string& endpoint, uint64_t total, uint64_t bucket, int passes) {
  void* buf[2] = {Allocate(device, bucket), Allocate(device, bucket)};
  if (buf[0] == nullptr || buf[1] == nullptr) return Die("allocating the sender's buffers");
  for (void* b : buf) cudaMemset(b, 0x5A, bucket);
  cudaDeviceSynchronize();
  auto sender = refit::transport::UcxSender::Connect(endpoint, Options(tls));
  if (!sender.ok()) return Die(std::string(sender.status().message()));
  uint64_t k = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (uint64_t off = 0; off < total; off += bucket, ++k) {
      absl::Status st = (*sender)->Send(k + 1, buf[k % 2], std::min(bucket, total - off));
      if (!st.ok()) return Die(std::string(st.message()));
    }
  }
  if (device) std::fprintf(stderr, "ucx_device_bench: sender lanes:\n%s", (*sender)->DescribeLanes().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 8 && std::strcmp(argv[1], "--send") == 0) {
    return Send(std::strcmp(argv[2], "device") == 0, argv[3], argv[4], std::strtoull(argv[5], nullptr, 10),
                std::strtoull(argv[6], nullptr, 10), std::atoi(argv[7]));
  }
  if (argc < 5 || (std::strcmp(argv[1], "device") != 0 && std::strcmp(argv[1], "host") != 0)) {
    std::fprintf(stderr, "usage: ucx_device_bench <device|host> <tls> <total_bytes> <bucket_bytes> [iters]\n");
    return 2;
  }
  const bool device = std::strcmp(argv[1], "device") == 0;
  const char* tls = argv[2];
  const uint64_t total = std::strtoull(argv[3], nullptr, 10);
  const uint64_t bucket = std::max<uint64_t>(1, std::strtoull(argv[4], nullptr, 10));
  const int iters = argc > 5 ? std::max(1, std::atoi(argv[5])) : 5;
  (void)refit::transport::ucx::SetUcxLogLevel("error");
  if (device && !UcxHasCuda()) {
    return Die(std::string("this UCX (") + ucp_get_version_string() +
               ") has no CUDA memory support: run it against a CUDA build of UCX (docs/transports.md)");
  }
  void* slot[2] = {Allocate(device, bucket), Allocate(device, bucket)};
  if (slot[0] == nullptr || slot[1] == nullptr) return Die("allocating the receiver's ring slots");
  auto receiver = refit::transport::UcxReceiver::Listen(Options(tls));
  if (!receiver.ok()) return Die(std::string(receiver.status().message()));
  std::vector<std::string> args = {"/proc/self/exe", "--send", argv[1], tls, (*receiver)->Endpoint(),
                                   std::to_string(total), std::to_string(bucket), std::to_string(iters + 1)};
  std::vector<char*> child_argv;
  for (std::string& a : args) child_argv.push_back(a.data());
  child_argv.push_back(nullptr);
  pid_t child = 0;
  if (posix_spawn(&child, child_argv[0], nullptr, nullptr, child_argv.data(), environ) != 0) return Die("spawn");
  std::vector<double> ms;
  uint64_t k = 0;
  Clock::time_point last = Clock::now();
  for (int pass = 0; pass <= iters; ++pass) {
    for (uint64_t off = 0; off < total; off += bucket, ++k) {
      auto got = (*receiver)->Receive(k + 1, slot[k % 2], bucket, absl::Now() + absl::Seconds(60));
      if (!got.ok()) return Die(std::string(got.status().message()));
    }
    Clock::time_point now = Clock::now();
    if (pass > 0) ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  }
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) return Die("the sender failed");
  // The last slot received holds the sender's bytes (checked on the host).
  std::vector<uint8_t> check(std::min<uint64_t>(bucket, 4096));
  cudaMemcpy(check.data(), slot[(k - 1) % 2], check.size(), cudaMemcpyDefault);
  const bool bytes_ok = std::all_of(check.begin(), check.end(), [](uint8_t b) { return b == 0x5A; });
  const double median = Median(ms);
  std::printf("{\"ucx\":\"%s\",\"memory\":\"%s\",\"tls\":\"%s\",\"bytes\":%llu,\"bucket_bytes\":%llu,\"ms\":%.3f,"
              "\"gbps\":%.2f,\"bytes_ok\":%s}\n",
              ucp_get_version_string(), argv[1], tls, static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(bucket), median, total / median / 1e6, bytes_ok ? "true" : "false");
  return bytes_ok ? 0 : 1;
}
