// kernel_bench: GB/s of the refitd quantize kernels on a Llama-8B-like weight (14336x4096 bf16,
// several input copies rotated so that L2 never holds the next input), against a plain
// device-to-device cudaMemcpy measured in the same run. Logical traffic = input read once +
// every output written once. Usage: kernel_bench [--json PATH] [--rows R] [--cols K] [--copies C] [--iters N]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "formats/format.h"
#include "kernels/checksum.h"
#include "kernels/derive.h"
#include "kernels/quantize.h"

namespace {

using refit::DType;
using refit::formats::Format;

#define CHECK_CUDA(x)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

#define CHECK_OK(x)                                                                   \
  do {                                                                                \
    auto s_ = (x);                                                                    \
    if (!s_.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, std::string(s_.message()).c_str()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buf(size_t n) : bytes(n) { CHECK_CUDA(cudaMalloc(&p, n < 16 ? 16 : n)); }
  ~Buf() { cudaFree(p); }
};

double g_host_us = 0;
int g_iters = 30;  // --iters  // host time to enqueue one call, from the last TimeMs

// Warm up, then time `iters` calls with events three times; returns the best ms per call.
// Also records in g_host_us how long the host took to enqueue one call: when that is close to
// the device time, the measurement is launch-bound, not kernel-bound.
template <class Fn>
double TimeMs(Fn&& fn, int copies) {
  const int iters = g_iters;
  for (int i = 0; i < 3; ++i) fn(i % copies);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    CHECK_CUDA(cudaEventRecord(a));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn(i % copies);
    g_host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, static_cast<double>(ms) / iters);
  }
  CHECK_CUDA(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

struct Row {
  std::string name;
  double ms, gbps, ratio, goal;
  double host_us = g_host_us;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 14336, cols = 4096;
  int copies = 8;
  const char* json_path = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--json")) json_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--rows")) rows = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--cols")) cols = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--copies")) copies = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--iters")) g_iters = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int64_t n = rows * cols;
  const refit::Shape shape{rows, cols};
  std::printf("device: %s, %d SMs, L2 %d MiB; weight %lldx%lld, %d rotated copies\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, static_cast<long long>(rows),
              static_cast<long long>(cols), copies);

  // Inputs: bf16 N(0, 0.02) and an fp32 copy for the fp32-input rows.
  std::vector<uint16_t> host(static_cast<size_t>(n));
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> hostf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(rng);
    uint32_t b;
    std::memcpy(&b, &x, 4);
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16;
    host[i] = static_cast<uint16_t>(b);
    b <<= 16;
    std::memcpy(&hostf[i], &b, 4);
  }
  float host_amax = 0.0f;
  for (float x : hostf) host_amax = std::max(host_amax, std::fabs(x));
  std::vector<std::unique_ptr<Buf>> in(copies), out(copies);
  for (int c = 0; c < copies; ++c) {
    in[c] = std::make_unique<Buf>(n * 2);
    out[c] = std::make_unique<Buf>(n * 2 + (n / 16) * 4 + 4096);
    CHECK_CUDA(cudaMemcpy(in[c]->p, host.data(), n * 2, cudaMemcpyHostToDevice));
  }
  auto probe = refit::kernels::NonfiniteProbe::Create();
  CHECK_OK(probe.status());
  Buf amax(4);

  std::vector<Row> table;
  const double copy_ms = TimeMs([&](int c) {
    CHECK_CUDA(cudaMemcpyAsync(out[c]->p, in[c]->p, n * 2, cudaMemcpyDeviceToDevice));
  }, copies);
  const double copy_gbps = 2.0 * n * 2 / copy_ms / 1e6;
  table.push_back({"d2d copy (read+write)", copy_ms, copy_gbps, 1.0, 0});

  auto run_format = [&](const std::string& name, Format f, DType dtype, std::vector<std::unique_ptr<Buf>>& inputs,
                        int mode /*0 plain, 1 host amax, 2 device amax two-pass*/, double goal) {
    auto bytes = refit::kernels::OutputBytes(f, dtype, shape);
    CHECK_OK(bytes.status());
    uint64_t total_out = 0;
    for (auto b : *bytes) total_out += b;
    const refit::formats::QuantizeOptions opt{};
    const double ms = TimeMs([&](int c) {
      std::vector<refit::formats::MutableBytes> outs;
      char* p = static_cast<char*>(out[c]->p);
      for (auto b : *bytes) {
        outs.push_back({p, b});
        p += (b + 255) / 256 * 256;
      }
      const refit::formats::ConstTensor t{dtype, shape, inputs[c]->p};
      refit::kernels::GlobalAmax ga;
      if (mode == 1) ga.host = host_amax;
      if (mode == 2) {
        CHECK_OK(refit::kernels::ResetAmax(static_cast<float*>(amax.p), nullptr));
        CHECK_OK(refit::kernels::AccumulateAmax(t, opt, static_cast<float*>(amax.p), nullptr));
        ga.device = static_cast<const float*>(amax.p);
      }
      CHECK_OK(refit::kernels::Quantize(f, t, opt, ga, outs, name, &*probe, nullptr));
    }, copies);
    CHECK_OK(probe->Check(name, nullptr));
    const double logical = static_cast<double>(n) * refit::DTypeSize(dtype) + static_cast<double>(total_out);
    const double gbps = logical / ms / 1e6;
    table.push_back({name, ms, gbps, gbps / copy_gbps, goal});
  };

  run_format("fp8_block128", Format::kFp8Block128, DType::kBF16, in, 0, 0.85);
  run_format("fp8_block128_ue8m0", Format::kFp8Block128Ue8m0, DType::kBF16, in, 0, 0.85);
  run_format("mxfp8", Format::kMxfp8, DType::kBF16, in, 0, 0.85);
  run_format("mxfp4", Format::kMxfp4, DType::kBF16, in, 0, 0.85);
  run_format("nvfp4 (amax given, 1 pass)", Format::kNvfp4, DType::kBF16, in, 1, 0.85);
  run_format("nvfp4 (amax computed, 2 pass)", Format::kNvfp4, DType::kBF16, in, 2, 0.55);
  run_format("nvfp4_te (amax given, 1 pass)", Format::kNvfp4Te, DType::kBF16, in, 1, 0.85);
  run_format("nvfp4_te (amax computed, 2 pass)", Format::kNvfp4Te, DType::kBF16, in, 2, 0.55);
  run_format("fp16 cast", Format::kFp16, DType::kBF16, in, 0, 0);
  {
    // Amax pass alone (read only; logical bytes = input).
    const double ms = TimeMs([&](int c) {
      CHECK_OK(refit::kernels::ResetAmax(static_cast<float*>(amax.p), nullptr));
      CHECK_OK(refit::kernels::AccumulateAmax({DType::kBF16, shape, in[c]->p}, {}, static_cast<float*>(amax.p),
                                              nullptr));
    }, copies);
    table.push_back({"amax pass (read only)", ms, n * 2.0 / ms / 1e6, n * 2.0 / ms / 1e6 / copy_gbps, 0});
    const double gms = TimeMs([&](int c) {
      CHECK_OK(refit::kernels::GemmaPlusOne(in[c]->p, DType::kBF16, n, out[c]->p, nullptr));
    }, copies);
    table.push_back({"gemma w+1 (bf16)", gms, n * 4.0 / gms / 1e6, n * 4.0 / gms / 1e6 / copy_gbps, 0});
    const double cms = TimeMs([&](int c) {
      CHECK_OK(refit::kernels::DeviceChecksum(in[c]->p, n * 2, 0, static_cast<uint64_t*>(amax.p), nullptr));
    }, copies);
    table.push_back({"checksum (read only)", cms, n * 2.0 / cms / 1e6, n * 2.0 / cms / 1e6 / copy_gbps, 0});
  }
  // FP32 input (half as many copies fit the same memory; still far above L2).
  {
    std::vector<std::unique_ptr<Buf>> inf(std::max(2, copies / 2));
    for (auto& b : inf) {
      b = std::make_unique<Buf>(n * 4);
      CHECK_CUDA(cudaMemcpy(b->p, hostf.data(), n * 4, cudaMemcpyHostToDevice));
    }
    const int saved = copies;
    copies = static_cast<int>(inf.size());
    run_format("fp8_block128 (fp32 in)", Format::kFp8Block128, DType::kF32, inf, 0, 0);
    run_format("mxfp8 (fp32 in)", Format::kMxfp8, DType::kF32, inf, 0, 0);
    run_format("nvfp4 (fp32 in, 1 pass)", Format::kNvfp4, DType::kF32, inf, 1, 0);
    copies = saved;
  }

  std::printf("\n%-36s %9s %8s %9s %7s %6s\n", "kernel", "ms", "host_us", "GB/s", "ratio", "goal");
  for (const Row& r : table) {
    std::printf("%-36s %9.4f %8.1f %9.1f %7.3f %6s%s\n", r.name.c_str(), r.ms, r.host_us, r.gbps, r.ratio,
                r.goal > 0 ? std::to_string(r.goal).substr(0, 4).c_str() : "",
                r.goal > 0 ? (r.ratio >= r.goal ? "  ok" : "  BELOW") : "");
  }
  if (json_path != nullptr) {
    FILE* f = std::fopen(json_path, "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "{\n \"device\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"copy_GBps\": %.3f,\n \"kernels\": {\n",
                 prop.name, static_cast<long long>(rows), static_cast<long long>(cols), copy_gbps);
    for (size_t i = 0; i < table.size(); ++i) {
      std::fprintf(f, "  \"%s\": {\"ms\": %.5f, \"GBps\": %.3f, \"ratio\": %.4f, \"goal\": %.2f}%s\n",
                   table[i].name.c_str(), table[i].ms, table[i].gbps, table[i].ratio, table[i].goal,
                   i + 1 < table.size() ? "," : "");
    }
    std::fprintf(f, " }\n}\n");
    std::fclose(f);
  }
  return 0;
}
