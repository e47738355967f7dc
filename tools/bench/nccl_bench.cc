// Raw NCCL baselines for the refit benchmarks, in one process with plain NCCL calls:
//   sendrecv: `total_bytes` from GPU 0 to GPU 1 in messages of `chunk_bytes` (the refit's bucket
//             size) with ncclSend/ncclRecv;
//   bcast:    the same bytes from GPU 0 to GPUs 1..receivers with ncclBroadcast (what a fan-out
//             refit to `receivers` daemons moves).
// Prints the median time of `iters` runs as JSON:
//   {"mode":M,"receivers":R,"bytes":B,"chunk_bytes":C,"messages":N,"ms":T,"gbps":G,"runs_ms":[...]}
// (gbps: bytes per receiver per second).
//
//   nccl_bench <total_bytes> <chunk_bytes> [iters=5] [receivers=1] [sendrecv|bcast]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    std::fprintf(stderr, "usage: nccl_bench <total_bytes> <chunk_bytes> [iters] [receivers] [sendrecv|bcast]\n");
    return 2;
  }
  const uint64_t total = std::strtoull(argv[1], nullptr, 10);
  const uint64_t chunk = std::max<uint64_t>(1, std::strtoull(argv[2], nullptr, 10));
  const int iters = argc > 3 ? std::atoi(argv[3]) : 5;
  const int receivers = argc > 4 ? std::atoi(argv[4]) : 1;
  const bool bcast = argc > 5 && std::strcmp(argv[5], "bcast") == 0;
  if (receivers < 1 || (!bcast && receivers != 1)) return Die("receivers", "sendrecv has one receiver; bcast >= 1");
  const int n = receivers + 1;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < n) return Die("devices", "not enough CUDA devices");
  std::vector<int> devs(n);
  for (int i = 0; i < n; ++i) devs[i] = i;
  std::vector<ncclComm_t> comms(n);
  if (ncclResult_t r = ncclCommInitAll(comms.data(), n, devs.data()); r != ncclSuccess) {
    return Die("ncclCommInitAll", ncclGetErrorString(r));
  }
  std::vector<void*> buf(n);
  std::vector<cudaStream_t> streams(n);
  const uint64_t buf_bytes = std::min(total, chunk);
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(devs[i]);
    if (cudaMalloc(&buf[i], buf_bytes) != cudaSuccess) return Die("cudaMalloc", "out of memory");
    cudaMemset(buf[i], i, buf_bytes);
    cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
  }
  auto run = [&]() -> double {
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t off = 0; off < total; off += chunk) {
      const uint64_t m = std::min(chunk, total - off);
      ncclGroupStart();
      if (bcast) {
        for (int i = 0; i < n; ++i) ncclBroadcast(buf[i], buf[i], m, ncclUint8, 0, comms[i], streams[i]);
      } else {
        ncclSend(buf[0], m, ncclUint8, 1, comms[0], streams[0]);
        ncclRecv(buf[1], m, ncclUint8, 0, comms[1], streams[1]);
      }
      ncclGroupEnd();
    }
    for (int i = 0; i < n; ++i) {
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
  std::printf("{\"mode\":\"%s\",\"receivers\":%d,\"bytes\":%llu,\"chunk_bytes\":%llu,\"messages\":%llu,\"ms\":%.3f,"
              "\"gbps\":%.2f,\"runs_ms\":[%s]}\n",
              bcast ? "bcast" : "sendrecv", receivers, static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(chunk), static_cast<unsigned long long>((total + chunk - 1) / chunk),
              median, total / median / 1e6, runs.c_str());
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(devs[i]);
    cudaFree(buf[i]);
    ncclCommDestroy(comms[i]);
  }
  return 0;
}
