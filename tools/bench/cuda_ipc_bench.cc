// A bucket stream over the CUDA IPC data plane on one GPU, against the device copy rate:
//   ipc:       a child process (the trainer) sends `total_bytes` in buckets of `bucket_bytes` from
//              two cudaMalloc'ed bucket buffers (exported once each) with CudaIpcSender; this
//              process (refitd) receives them with CudaIpcReceiver into two device ring slots.
//              Steady state: after one warm-up pass (connection, exports, mappings), each pass
//              is timed from the end of the previous one to its last Receive.
//   copy:      the same bytes as cudaMemcpyAsync device-to-device copies of one bucket each, one
//              synchronize at the end (the device's copy rate);
//   copy_sync: the same, synchronizing after every bucket (what the receiver does per bucket).
// Prints the medians of `iters` passes as JSON (gbps: payload bytes per second, not read+write).
//
//   cuda_ipc_bench <total_bytes> <bucket_bytes> [iters=5] [device=0]
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "transport/cuda_ipc/cuda_ipc_receiver.h"
#include "transport/cuda_ipc/cuda_ipc_sender.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

int Die(const std::string& what) {
  std::fprintf(stderr, "cuda_ipc_bench: %s\n", what.c_str());
  return 1;
}

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Send(const std::string& endpoint, uint64_t total, uint64_t bucket, int passes, int device) {
  refit::transport::CudaIpcOptions options;
  options.device = device;
  auto sender = refit::transport::CudaIpcSender::Connect(endpoint, options);
  if (!sender.ok()) return Die(std::string(sender.status().message()));
  cudaSetDevice(device);
  void* buf[2] = {};
  for (void*& b : buf) {
    if (cudaMalloc(&b, bucket) != cudaSuccess) return Die("cudaMalloc");
    cudaMemset(b, 0x5A, bucket);
  }
  cudaDeviceSynchronize();
  uint64_t k = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (uint64_t off = 0; off < total; off += bucket, ++k) {
      absl::Status st = (*sender)->Send(k + 1, buf[k % 2], std::min(bucket, total - off));
      if (!st.ok()) return Die(std::string(st.message()));
    }
  }
  std::fprintf(stderr, "cuda_ipc_bench: sender exported %llu buffers for %llu buckets\n",
               static_cast<unsigned long long>((*sender)->exports()), static_cast<unsigned long long>(k));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--send") == 0 && argc == 7) {
    return Send(argv[2], std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10), std::atoi(argv[5]),
                std::atoi(argv[6]));
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: cuda_ipc_bench <total_bytes> <bucket_bytes> [iters] [device]\n");
    return 2;
  }
  const uint64_t total = std::strtoull(argv[1], nullptr, 10);
  const uint64_t bucket = std::max<uint64_t>(1, std::strtoull(argv[2], nullptr, 10));
  const int iters = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  const int device = argc > 4 ? std::atoi(argv[4]) : 0;
  const uint64_t messages = (total + bucket - 1) / bucket;

  refit::transport::CudaIpcOptions options;
  options.device = device;
  auto receiver = refit::transport::CudaIpcReceiver::Listen(options);
  if (!receiver.ok()) return Die(std::string(receiver.status().message()));
  cudaSetDevice(device);
  void* slot[2] = {};
  for (void*& s : slot) {
    if (cudaMalloc(&s, bucket) != cudaSuccess) return Die("cudaMalloc");
  }
  std::vector<std::string> args = {"/proc/self/exe", "--send", (*receiver)->Endpoint(), std::to_string(total),
                                   std::to_string(bucket), std::to_string(iters + 1), std::to_string(device)};
  std::vector<char*> child_argv;
  for (std::string& a : args) child_argv.push_back(a.data());
  child_argv.push_back(nullptr);
  pid_t child = 0;
  if (posix_spawn(&child, child_argv[0], nullptr, nullptr, child_argv.data(), environ) != 0) return Die("spawn");

  std::vector<double> ipc_ms;
  uint64_t k = 0;
  Clock::time_point last = Clock::now();
  for (int pass = 0; pass <= iters; ++pass) {
    for (uint64_t off = 0; off < total; off += bucket, ++k) {
      auto got = (*receiver)->Receive(k + 1, slot[k % 2], bucket, absl::Now() + absl::Seconds(60));
      if (!got.ok()) return Die(std::string(got.status().message()));
    }
    Clock::time_point now = Clock::now();
    if (pass > 0) ipc_ms.push_back(Ms(last, now));
    last = now;
  }
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) return Die("the sender failed");
  const int mapped = (*receiver)->mapped();

  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  void* src = nullptr;
  if (cudaMalloc(&src, bucket) != cudaSuccess) return Die("cudaMalloc");
  auto copies = [&](bool sync_each) {
    Clock::time_point t0 = Clock::now();
    uint64_t j = 0;
    for (uint64_t off = 0; off < total; off += bucket, ++j) {
      cudaMemcpyAsync(slot[j % 2], src, std::min(bucket, total - off), cudaMemcpyDeviceToDevice, stream);
      if (sync_each) cudaStreamSynchronize(stream);
    }
    cudaStreamSynchronize(stream);
    return Ms(t0, Clock::now());
  };
  copies(false);  // warm-up
  std::vector<double> copy_ms, copy_sync_ms;
  for (int i = 0; i < iters; ++i) copy_ms.push_back(copies(false));
  for (int i = 0; i < iters; ++i) copy_sync_ms.push_back(copies(true));
  const double ipc = Median(ipc_ms), copy = Median(copy_ms), copy_sync = Median(copy_sync_ms);
  std::printf("{\"bytes\":%llu,\"bucket_bytes\":%llu,\"messages\":%llu,\"mapped_at_end\":%d,\"ipc_ms\":%.3f,"
              "\"ipc_gbps\":%.1f,\"copy_ms\":%.3f,\"copy_gbps\":%.1f,\"copy_sync_ms\":%.3f,\"copy_sync_gbps\":%.1f,"
              "\"ipc_vs_copy\":%.3f}\n",
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(bucket),
              static_cast<unsigned long long>(messages), mapped, ipc, total / ipc / 1e6, copy, total / copy / 1e6,
              copy_sync, total / copy_sync / 1e6, copy / ipc);
  return 0;
}
