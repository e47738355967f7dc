// Raw NCCL point-to-point baseline for the refit benchmark: sends `total_bytes` from GPU 0 to
// GPU 1 in messages of `chunk_bytes` (the refit's bucket size) with plain ncclSend/ncclRecv in
// one process, and prints the median time of `iters` runs as JSON:
//   {"bytes":B,"chunk_bytes":C,"messages":M,"ms":T,"gbps":G,"runs_ms":[...]}
//
//   nccl_bench <total_bytes> <chunk_bytes> [iters=5] [src_gpu=0] [dst_gpu=1]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int Die(const char* what, const char* why) {
  std::fprintf(stderr, "nccl_bench: %s: %s\n", what, why);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: nccl_bench <total_bytes> <chunk_bytes> [iters] [src_gpu] [dst_gpu]\n");
    return 2;
  }
  const uint64_t total = std::strtoull(argv[1], nullptr, 10);
  const uint64_t chunk = std::max<uint64_t>(1, std::strtoull(argv[2], nullptr, 10));
  const int iters = argc > 3 ? std::atoi(argv[3]) : 5;
  int devs[2] = {argc > 4 ? std::atoi(argv[4]) : 0, argc > 5 ? std::atoi(argv[5]) : 1};
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) return Die("devices", "needs 2 CUDA devices");
  ncclComm_t comms[2];
  if (ncclResult_t r = ncclCommInitAll(comms, 2, devs); r != ncclSuccess) return Die("ncclCommInitAll", ncclGetErrorString(r));
  void* buf[2];
  cudaStream_t streams[2];
  const uint64_t buf_bytes = std::min(total, chunk);
  for (int i = 0; i < 2; ++i) {
    cudaSetDevice(devs[i]);
    if (cudaMalloc(&buf[i], buf_bytes) != cudaSuccess) return Die("cudaMalloc", "out of memory");
    cudaMemset(buf[i], i, buf_bytes);
    cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
  }
  auto run = [&]() -> double {
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t off = 0; off < total; off += chunk) {
      const uint64_t n = std::min(chunk, total - off);
      ncclGroupStart();
      ncclSend(buf[0], n, ncclUint8, 1, comms[0], streams[0]);
      ncclRecv(buf[1], n, ncclUint8, 0, comms[1], streams[1]);
      ncclGroupEnd();
    }
    for (int i = 0; i < 2; ++i) {
      cudaSetDevice(devs[i]);
      cudaStreamSynchronize(streams[i]);
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  run();  // warm-up: connections are set up on first use
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) ms.push_back(run());
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::string runs;
  for (double m : ms) runs += (runs.empty() ? "" : ",") + std::to_string(m);
  std::printf("{\"bytes\":%llu,\"chunk_bytes\":%llu,\"messages\":%llu,\"ms\":%.3f,\"gbps\":%.2f,\"runs_ms\":[%s]}\n",
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(chunk),
              static_cast<unsigned long long>((total + chunk - 1) / chunk), median, total / median / 1e6, runs.c_str());
  for (int i = 0; i < 2; ++i) {
    cudaSetDevice(devs[i]);
    cudaFree(buf[i]);
    ncclCommDestroy(comms[i]);
  }
  return 0;
}
