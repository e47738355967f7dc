// kernel_bench: GB/s of the refitd quantize kernels on a Llama-8B-like weight (14336x4096 bf16,
// several input copies rotated so that L2 never holds the next input), against a plain
// device-to-device cudaMemcpy measured in the same run. Logical traffic = input read once +
// every output written once. The "nvfp4 batch, MoE layer" rows run one Qwen3-30B-A3B layer's
// experts (384 tensors of 768x2048, gate/up sharing an amax) through the batched two-pass NVFP4
// path in runs of 16, 64 and 256 MiB, as refitd's GPU converter issues a MoE bucket.
// Usage: kernel_bench [--json PATH] [--rows R] [--cols K] [--copies C] [--iters N]
//
// kernel_bench --sequence: a whole Llama-3-8B-shaped refit's conversion (224 FP8 block-128
// projections, BF16 embedding, head and norms; 16.06 GB in, 9.08 GB out) as refitd's converter
// enqueues it, on 1-4 streams, with the inputs in separate allocations, in one allocation, in
// CUDA virtual memory imported from its POSIX descriptor, and in another process's cudaMalloc
// opened by its CUDA IPC handle (as refitd reads a colocated trainer's weights); against the
// bound (the model's bytes read once and written once at the copy rate of the same run).
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

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

#include "bench_memory.h"
#include "formats/format.h"
#include "kernels/batch_quantize.h"
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

// --sequence: one Llama-3-8B-shaped model (the tensors a refit converts: 224 FP8 block-128
// projections, BF16 embedding and head, 65 norms) from its own inputs into its own outputs, as
// one refit's conversion enqueues it, on `streams` streams (tensors dealt round-robin). Prints
// the model's wall against the bound (its bytes read once and written once at the copy rate of
// the same run) and the host's enqueue time.
int RunSequence(const char* argv0, int iters) {
  struct T {
    int64_t rows, cols;
    bool fp8;
  };
  std::vector<T> model;
  const int64_t h = 4096, kv = 1024, inter = 14336, vocab = 128256;
  model.push_back({vocab, h, false});
  for (int l = 0; l < 32; ++l) {
    for (T t : {T{h, h, true}, T{kv, h, true}, T{kv, h, true}, T{h, h, true}, T{inter, h, true},
                T{inter, h, true}, T{h, inter, true}, T{1, h, false}, T{1, h, false}}) {
      model.push_back(t);
    }
  }
  model.push_back({1, h, false});
  model.push_back({vocab, h, false});
  uint64_t in_bytes = 0, out_bytes = 0;
  std::vector<void*> sep, outs, scales;
  std::vector<uint64_t> offsets;
  for (const T& t : model) {
    const uint64_t n = static_cast<uint64_t>(t.rows * t.cols);
    void *i = nullptr, *o = nullptr, *s = nullptr;
    CHECK_CUDA(cudaMalloc(&i, n * 2));
    CHECK_CUDA(cudaMemset(i, 0x3c, n * 2));
    CHECK_CUDA(cudaMalloc(&o, t.fp8 ? n : n * 2));
    const uint64_t sb = t.fp8 ? static_cast<uint64_t>((t.rows + 127) / 128 * ((t.cols + 127) / 128)) * 4 : 0;
    if (sb) CHECK_CUDA(cudaMalloc(&s, n / 32 + 4096));
    sep.push_back(i);
    outs.push_back(o);
    scales.push_back(s);
    offsets.push_back(in_bytes);
    in_bytes += (n * 2 + 255) / 256 * 256;
    out_bytes += (t.fp8 ? n : n * 2) + sb;
  }
  const uint64_t copy_n = 4ull << 30;
  double rate = 0;
  {
    Buf ca(copy_n), cb(copy_n);
    const double copy_ms = TimeMs([&](int) { CHECK_CUDA(cudaMemcpyAsync(cb.p, ca.p, copy_n, cudaMemcpyDeviceToDevice)); }, 1);
    rate = copy_n / copy_ms;  // bytes per ms, each read once and written once
  }
  const double bound = (in_bytes + out_bytes) / (2 * rate);
  std::printf("model: %zu tensors, %.2f GB in, %.2f GB out; copy %.1f GB/s; bound %.3f ms\n", model.size(),
              in_bytes / 1e9, out_bytes / 1e9, rate / 1e6, bound);
  auto probe = refit::kernels::NonfiniteProbe::Create();
  CHECK_OK(probe.status());
  const Format format = Format::kFp8Block128;
  auto run = [&](const char* label, const std::vector<void*>& ins, int nstreams) {
    std::vector<cudaStream_t> ss(nstreams);
    for (auto& s : ss) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    g_iters = iters;
    uint64_t bytes = 0;
    const double ms = TimeMs([&](int) {
      bytes = 0;
      CHECK_CUDA(cudaEventRecord(fork, nullptr));
      for (auto& s : ss) CHECK_CUDA(cudaStreamWaitEvent(s, fork));
      for (size_t k = 0; k < model.size(); ++k) {
        const T& t = model[k];
        cudaStream_t s = ss[k % nstreams];
        const uint64_t n = static_cast<uint64_t>(t.rows * t.cols);
        if (!t.fp8) {
          CHECK_CUDA(cudaMemcpyAsync(outs[k], ins[k], n * 2, cudaMemcpyDeviceToDevice, s));
          bytes += 4 * n;
          continue;
        }
        auto ob = refit::kernels::OutputBytes(format, DType::kBF16, refit::Shape{t.rows, t.cols});
        CHECK_OK(ob.status());
        const uint64_t sb = (*ob)[1];
        std::vector<refit::formats::MutableBytes> o{{outs[k], (*ob)[0]}, {scales[k], sb}};
        CHECK_OK(refit::kernels::Quantize(format, {DType::kBF16, refit::Shape{t.rows, t.cols}, ins[k]},
                                          {}, {}, o, "w", &*probe, s));
        bytes += 3 * n + sb;
      }
      for (auto& s : ss) {
        CHECK_CUDA(cudaEventRecord(join, s));
        CHECK_CUDA(cudaStreamWaitEvent(nullptr, join));
      }
    }, 1);
    std::printf("%-28s streams %d: %8.3f ms, %7.1f GB/s of traffic (%.3f of copy), host enqueue %.3f ms\n", label,
                nstreams, ms, bytes / ms / 1e6, bytes / ms / (2 * rate), g_host_us / 1e3);
    for (auto& s : ss) cudaStreamDestroy(s);
  };
  for (int ns : {1, 2, 3, 4}) run("separate allocations", sep, ns);
  {
    Buf one(in_bytes);
    CHECK_CUDA(cudaMemset(one.p, 0x3c, in_bytes));
    std::vector<void*> packed;
    for (uint64_t o : offsets) packed.push_back(static_cast<char*>(one.p) + o);
    run("one allocation", packed, 1);
  }
  // CUDA virtual memory exported as a POSIX descriptor and imported (storage::VmmImport), as
  // refitd maps an engine's virtual-memory weights.
  if (std::unique_ptr<refit::storage::VmmImport> imported = refit::bench::ImportedVmm(in_bytes)) {
    CHECK_CUDA(cudaMemset(imported->address(), 0x3c, in_bytes));
    std::vector<void*> packed;
    for (uint64_t o : offsets) packed.push_back(imported->address() + o);
    for (int ns : {1, 2}) run("vmm-imported allocation", packed, ns);
  }
  // Another process's allocation opened by its CUDA IPC handle, as refitd reads a colocated trainer's.
  if (std::unique_ptr<refit::bench::ChildAllocation> remote = refit::bench::ChildAllocation::Open(argv0, in_bytes)) {
    CHECK_CUDA(cudaMemset(remote->data(), 0x3c, in_bytes));
    std::vector<void*> packed;
    for (uint64_t o : offsets) packed.push_back(remote->data() + o);
    for (int ns : {1, 2, 3, 4}) run("ipc-opened allocation", packed, ns);
  } else {
    std::printf("ipc: could not open the child's allocation\n");
  }
  return 0;
}

// One Qwen3-30B-A3B MoE layer's experts (128 x gate, up, down of 768 x 2048 BF16: 1.21 GB, about
// one 1.2 GB bucket) through the batched NVFP4 path as refitd's GPU converter issues it: each
// expert's gate and up share one amax (a fused group), down has its own; runs of at most
// `run_mib` MiB, each one table upload and two launches (QuantizeNvfp4Batch). Inputs lie in one
// allocation (a bucket), outputs in an allocation per tensor (staging). Two-pass: amax computed.
void AddMoeBatchRows(const std::vector<uint16_t>& host, double copy_gbps, std::vector<Row>& table) {
  constexpr int kExperts = 128;
  constexpr int64_t kElems = 768 * 2048;
  constexpr int kTensors = kExperts * 3;
  const uint64_t in_bytes = static_cast<uint64_t>(kTensors) * kElems * 2;
  Buf in(in_bytes);
  for (int t = 0; t < kTensors; ++t) {
    const size_t off = static_cast<size_t>(t % 16) * kElems;  // the host weight has 37 tensors' worth
    CHECK_CUDA(cudaMemcpy(static_cast<char*>(in.p) + static_cast<uint64_t>(t) * kElems * 2, host.data() + off,
                          kElems * 2, cudaMemcpyHostToDevice));
  }
  std::vector<std::unique_ptr<Buf>> q(kTensors), sc(kTensors), s2(kTensors);
  Buf amax(kTensors * 4);
  std::vector<refit::kernels::Nvfp4BatchItem> items;
  for (int t = 0; t < kTensors; ++t) {
    q[t] = std::make_unique<Buf>(kElems / 2);
    sc[t] = std::make_unique<Buf>(kElems / 16);
    s2[t] = std::make_unique<Buf>(4);
    const int expert = t / 3, which = t % 3;  // gate, up, down
    float* a = static_cast<float*>(amax.p) + (which == 2 ? kExperts + expert : expert);
    items.push_back({static_cast<char*>(in.p) + static_cast<uint64_t>(t) * kElems * 2, kElems,
                     static_cast<uint8_t*>(q[t]->p), static_cast<uint8_t*>(sc[t]->p), static_cast<float*>(s2[t]->p), a,
                     nullptr});
  }
  const refit::kernels::Nvfp4BatchKind kind{Format::kNvfp4, DType::kBF16, {}};
  const double logical = static_cast<double>(in_bytes) + kTensors * (kElems / 2.0 + kElems / 16.0 + 4);
  for (int run_mib : {16, 64, 256}) {
    // Runs as the converter cuts them: a group never split, a run closed when it reaches run_mib.
    std::vector<std::pair<size_t, size_t>> runs;
    size_t first = 0;
    uint64_t bytes = 0;
    for (size_t t = 0; t < items.size(); ++t) {
      const bool group_start = t % 3 != 1;  // up stays with its gate
      if (group_start && bytes >= (static_cast<uint64_t>(run_mib) << 20)) {
        runs.push_back({first, t});
        first = t;
        bytes = 0;
      }
      bytes += kElems * 2;
    }
    runs.push_back({first, items.size()});
    std::vector<void*> host_tables, device_tables;
    for (const auto& [b, e] : runs) {
      void* h = nullptr;
      void* d = nullptr;
      CHECK_CUDA(cudaMallocHost(&h, refit::kernels::Nvfp4BatchTableBytes(e - b)));
      CHECK_CUDA(cudaMalloc(&d, refit::kernels::Nvfp4BatchTableBytes(e - b)));
      host_tables.push_back(h);
      device_tables.push_back(d);
    }
    const double ms = TimeMs(
        [&](int) {
          CHECK_CUDA(cudaMemsetAsync(amax.p, 0, kTensors * 4));
          for (size_t r = 0; r < runs.size(); ++r) {
            const auto [b, e] = runs[r];
            CHECK_OK(refit::kernels::QuantizeNvfp4Batch(
                kind, std::span<const refit::kernels::Nvfp4BatchItem>(items.data() + b, e - b), host_tables[r],
                device_tables[r], nullptr));
          }
        },
        1);
    for (size_t r = 0; r < runs.size(); ++r) {
      cudaFreeHost(host_tables[r]);
      cudaFree(device_tables[r]);
    }
    const double gbps = logical / ms / 1e6;
    table.push_back(
        {"nvfp4 batch, MoE layer (" + std::to_string(run_mib) + " MiB runs, " + std::to_string(runs.size()) + ")", ms,
         gbps, gbps / copy_gbps, 0});
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool child = false;
  if (int rc = refit::bench::IpcChildMain(argc, argv, &child); child) return rc;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sequence")) return RunSequence(argv[0], 5);
  }
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
  AddMoeBatchRows(host, copy_gbps, table);

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
  // compressed-tensors: per-channel FP8 and W4A16 need no global amax (one CTA per row, one thread
  // per group); per-tensor FP8 and NVFP4 packed take the tensor's amax like nvfp4.
  run_format("ct_fp8_channel", Format::kCtFp8Channel, DType::kBF16, in, 0, 0.85);
  run_format("ct_fp8_tensor (amax given, 1 pass)", Format::kCtFp8Tensor, DType::kBF16, in, 1, 0.85);
  run_format("ct_fp8_tensor (amax computed, 2 pass)", Format::kCtFp8Tensor, DType::kBF16, in, 2, 0.55);
  run_format("ct_nvfp4 (amax given, 1 pass)", Format::kCtNvfp4, DType::kBF16, in, 1, 0.85);
  run_format("ct_nvfp4 (amax computed, 2 pass)", Format::kCtNvfp4, DType::kBF16, in, 2, 0.55);
  run_format("ct_w4a16", Format::kCtW4a16, DType::kBF16, in, 0, 0.85);
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

  std::printf("\n%-40s %9s %8s %9s %7s %6s\n", "kernel", "ms", "host_us", "GB/s", "ratio", "goal");
  for (const Row& r : table) {
    std::printf("%-40s %9.4f %8.1f %9.1f %7.3f %6s%s\n", r.name.c_str(), r.ms, r.host_us, r.gbps, r.ratio,
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
