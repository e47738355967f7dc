// Baseline for the commit-pause benchmark: a plain device-to-device copy of N bytes (the bytes
// a commit writes), and the same from pinned host memory, timed with CUDA events.
//   copy_bench BYTES  ->  one JSON line {"bytes":N,"d2d_ms":..,"h2d_ms":..}
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

float TimeMs(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(a);
    cudaMemcpyAsync(dst, src, n, kind);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (i >= 2) ms.push_back(t);  // two warm-ups
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: copy_bench BYTES\n");
    return 2;
  }
  size_t n = std::strtoull(argv[1], nullptr, 10);
  void *a = nullptr, *b = nullptr, *h = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess || cudaHostAlloc(&h, n, 0) != cudaSuccess) {
    std::fprintf(stderr, "copy_bench: cannot allocate %zu bytes\n", n);
    return 1;
  }
  cudaMemset(a, 1, n);
  float d2d = TimeMs(b, a, n, cudaMemcpyDeviceToDevice);
  float h2d = TimeMs(b, h, n, cudaMemcpyHostToDevice);
  std::printf("{\"bytes\":%zu,\"d2d_ms\":%.3f,\"h2d_ms\":%.3f}\n", n, d2d, h2d);
  return 0;
}
