// Baseline for the commit-pause benchmark: a plain device-to-device copy of N bytes (the bytes
// a commit writes), the same from pinned host memory, and the commit's own batched copy
// (kernels::BatchCopy) of the same bytes split into Llama-8B FP8-shaped parameter regions
// (weights of 4-59 MB and their small scale tensors), checked byte for byte; CUDA events.
//   copy_bench BYTES  ->  one JSON line {"bytes":N,"d2d_ms":..,"h2d_ms":..,"batch_ms":..,
//                                        "regions":R,"batch_vs_d2d":..,"batch_equal":true,
//                                        "per_region_memcpy_ms":..,"scattered_batch_ms":..}
// per_region_memcpy_ms: the same regions by one cudaMemcpyAsync each; scattered_batch_ms: the
// batch with every source region in an allocation of its own, as refitd's staging pool holds them;
// ipc_scattered_batch_ms: the same into another process's memory opened by its CUDA IPC handle,
// as refitd writes an engine's; ipc_read_batch_ms: the same regions read out of that memory (as
// refitd's converter reads a colocated trainer's buffers); vmm_scattered_batch_ms: into CUDA virtual memory imported from its
// POSIX descriptor, as refitd maps an engine's virtual-memory weights.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda.h>

#include "common/cuda_status.h"
#include "kernels/batch_copy.h"
#include "bench_memory.h"

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
  bool child = false;
  if (int rc = refit::bench::IpcChildMain(argc, argv, &child); child) return rc;
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
  // A position-dependent pattern, so a byte copied to the wrong place is seen.
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = (i >> 3) * 0x9E3779B97F4A7C15ull;
    std::memcpy(static_cast<char*>(h) + i, &v, 8);
  }
  cudaMemcpy(a, h, n, cudaMemcpyHostToDevice);
  float d2d = TimeMs(b, a, n, cudaMemcpyDeviceToDevice);
  float h2d = TimeMs(b, h, n, cudaMemcpyHostToDevice);
  // Regions as one Llama-8B layer's FP8 parameters and scales, repeated until n bytes.
  const size_t layer[] = {16777216, 16384, 4194304, 4096, 4194304, 4096, 16777216, 16384,
                          58720256, 57344, 58720256, 57344, 58720256, 57344, 8192, 8192};
  std::vector<refit::kernels::CopyRegion> regions;
  size_t off = 0;
  for (size_t i = 0; off < n; ++i) {
    // Odd offsets: some regions start at 16-byte-aligned addresses, as engine parameters do.
    size_t len = std::min(layer[i % (sizeof(layer) / sizeof(layer[0]))], n - off);
    regions.push_back({static_cast<char*>(b) + off, static_cast<const char*>(a) + off, len});
    off += len;
  }
  cudaMemset(b, 0, n);
  auto batch = refit::kernels::BatchCopy::Create(regions.data(), regions.size(), nullptr);
  if (!batch.ok()) {
    std::fprintf(stderr, "copy_bench: %s\n", std::string(batch.status().message()).c_str());
    return 1;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0);
    (void)(*batch)->Launch(nullptr);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const float batch_ms = ms[ms.size() / 2];
  // The same regions, one cudaMemcpyAsync each (what the batch replaces).
  auto median_of = [&](auto&& enqueue) {
    std::vector<float> t;
    for (int i = 0; i < 12; ++i) {
      cudaEventRecord(e0);
      enqueue();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float x = 0;
      cudaEventElapsedTime(&x, e0, e1);
      if (i >= 2) t.push_back(x);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const float per_region_ms = median_of([&] {
    for (const auto& r : regions) cudaMemcpyAsync(r.dst, r.src, r.bytes, cudaMemcpyDeviceToDevice);
  });
  // Sources in allocations of their own, as refitd's staging pool holds them (one per tensor).
  std::vector<void*> own;
  std::vector<refit::kernels::CopyRegion> scattered = regions;
  for (auto& r : scattered) {
    void* p = nullptr;
    if (cudaMalloc(&p, r.bytes) != cudaSuccess) break;
    cudaMemcpy(p, r.src, r.bytes, cudaMemcpyDeviceToDevice);
    own.push_back(p);
    r.src = p;
  }
  float scattered_ms = -1;
  if (own.size() == scattered.size()) {
    auto sb = refit::kernels::BatchCopy::Create(scattered.data(), scattered.size(), nullptr);
    if (sb.ok()) scattered_ms = median_of([&] { (void)(*sb)->Launch(nullptr); });
  }
  // The scattered regions copied into one buffer at `base`, one after another.
  auto into_buffer = [&](uint8_t* base) {
    std::vector<refit::kernels::CopyRegion> into = scattered;
    size_t o = 0;
    for (auto& r : into) {
      r.dst = base + o;
      o += r.bytes;
    }
    return into;
  };
  // Into another process's memory opened by its CUDA IPC handle, as refitd writes the engine's.
  float ipc_ms = -1, ipc_read_ms = -1;
  if (std::unique_ptr<refit::bench::ChildAllocation> remote = refit::bench::ChildAllocation::Open(argv[0], n)) {
    std::vector<refit::kernels::CopyRegion> into = into_buffer(remote->data());
    auto ib = refit::kernels::BatchCopy::Create(into.data(), into.size(), nullptr);
    if (ib.ok()) ipc_ms = median_of([&] { (void)(*ib)->Launch(nullptr); });
    // And reading it: out of the other process's memory into local allocations.
    std::vector<refit::kernels::CopyRegion> out_of = into;
    for (size_t k = 0; k < out_of.size(); ++k) {
      out_of[k].src = into[k].dst;
      out_of[k].dst = const_cast<void*>(scattered[k].src);
    }
    auto ob = refit::kernels::BatchCopy::Create(out_of.data(), out_of.size(), nullptr);
    if (ob.ok()) ipc_read_ms = median_of([&] { (void)(*ob)->Launch(nullptr); });
  }
  // Into CUDA virtual memory (cuMemCreate with a POSIX descriptor, as vLLM's and SGLang's
  // sleep-mode allocators make it), mapped the way refitd maps an engine's (storage::VmmImport of
  // the exported descriptor).
  float vmm_ms = -1;
  if (std::unique_ptr<refit::storage::VmmImport> imported = refit::bench::ImportedVmm(n)) {
    std::vector<refit::kernels::CopyRegion> into = into_buffer(imported->address());
    auto vb = refit::kernels::BatchCopy::Create(into.data(), into.size(), nullptr);
    if (vb.ok()) vmm_ms = median_of([&] { (void)(*vb)->Launch(nullptr); });
  }
  for (void* p : own) cudaFree(p);
  // Every byte copied: compare in 256 MiB pieces through pinned memory (`h` holds the source).
  bool equal = cudaGetLastError() == cudaSuccess;
  const size_t piece = std::min<size_t>(n, 256u << 20);
  std::vector<char> got(piece);
  for (size_t o = 0; equal && o < n; o += piece) {
    const size_t m = std::min(piece, n - o);
    cudaMemcpy(h, static_cast<char*>(a) + o, m, cudaMemcpyDeviceToHost);
    cudaMemcpy(got.data(), static_cast<char*>(b) + o, m, cudaMemcpyDeviceToHost);
    equal = std::memcmp(h, got.data(), m) == 0;
  }
  std::printf("{\"bytes\":%zu,\"d2d_ms\":%.3f,\"h2d_ms\":%.3f,\"batch_ms\":%.3f,\"regions\":%zu,"
              "\"batch_vs_d2d\":%.3f,\"batch_equal\":%s,\"per_region_memcpy_ms\":%.3f,"
              "\"scattered_batch_ms\":%.3f,\"ipc_scattered_batch_ms\":%.3f,\"ipc_read_batch_ms\":%.3f,"
              "\"vmm_scattered_batch_ms\":%.3f}\n",
              n, d2d, h2d, batch_ms, regions.size(), d2d / batch_ms, equal ? "true" : "false", per_region_ms,
              scattered_ms, ipc_ms, ipc_read_ms, vmm_ms);
  return equal ? 0 : 3;
}
