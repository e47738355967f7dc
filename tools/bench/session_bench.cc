// session_bench: refitd's host cost per trainer tensor on the receive → convert → stage →
// validate → commit path, on the CPU. It drives the real core (Planner, Session with its two
// threads, Ledger, Staging, CpuConverter, PrepareCommit/WritePrepared into a real
// ShmEngineStorage) for a model of many small tensors, so the measured time is refitd's
// bookkeeping per tensor rather than conversion or copy bandwidth. Buckets come from an
// in-process Receiver (the session's data-plane seam) that copies prepared payloads.
//
//   session_bench [--model moe|llama] [--spec passthrough|nvfp4|PATH] [--buckets N] [--iters N] [--amax]
//                 [demo shape flags: --layers --hidden --intermediate --kv-hidden --vocab
//                  --experts --moe-intermediate]
//
// moe:   Qwen3-30B-A3B names (8 layers, 128 experts: 3131 tensors), tiny dimensions
//        (hidden 64, moe-intermediate 32, kv 32, vocab 512), 9 buckets.
// llama: Llama-8B names (32 layers: 291 tensors), tiny dimensions, 4 buckets.
// --spec nvfp4 quantizes every expert projection to NVFP4 (three staged outputs each), as
// tools/bench/moe_nvfp4_spec.yaml does; passthrough copies everything as sent. --amax: every
// tensor's announcement carries its amax (single-pass NVFP4, as RefitSession::MeasureAmax sends).
// --spec nvfp4-stacked: the expert rules of deploy/models/qwen3_moe_nvfp4.yaml (gate/up fused into
// one NVFP4 amax group, every layer's experts stacked into w13/w2, block scales swizzled), so the
// commit assembles stacked parameters as a MoE engine's does. --device-path: staging "on the
// device" through the host-backed stand-in of tests/unit/refit/host_device.h (device memory that
// is host memory, DeviceOps running the CPU reference code): the session's and the committer's
// device path (fused groups into the converter's batched run, held members, device builds), with
// its bookkeeping measured on the CPU; not a GPU's launch or kernel time.
// Prints milliseconds and microseconds per tensor for each phase (median of --iters sessions,
// after one warm-up session that fills the staging pool and the planner's memo), and the
// converter's own work (copies, reference quantizers) timed alone on the same tensors, so that
// "convert minus converter work" is the session's bookkeeping per tensor.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/cpu_profile.h"
#include "common/status_macros.h"
#include "demo_model.h"
#include "formats/format.h"
#include "refit/bucket_ring.h"
#include "refit/committer.h"
#include "refit/cpu_converter.h"
#include "refit/offline.h"
#include "refit/planner.h"
#include "refit/resolve.h"
#include "refit/session.h"
#include "refit/staging.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"
#include "transport/memory/memory_receiver.h"
#include "transport/transport.h"

#ifdef REFIT_SESSION_BENCH_DEVICE
#include "host_device.h"
#endif

namespace refit {
namespace {

constexpr char kPassthroughSpec[] = R"(model: bench
defaults:
  format: passthrough
)";

// The expert rules of deploy/models/qwen3_moe_nvfp4.yaml; `@` is the stack count (--experts).
constexpr char kNvfp4StackedSpec[] = R"(model: bench
defaults:
  format: auto
rules:
  - match: "model.layers.{L}.mlp.experts.{E}.{p:gate,up}_proj.weight"
    target: "model.layers.{L}.mlp.experts.w13_weight"
    format: nvfp4
    fuse: {capture: p, order: [gate, up]}
    stack: {capture: E, count: @}
    layout:
      - {op: swizzle_128x4, on: _scale}
  - match: "model.layers.{L}.mlp.experts.{E}.down_proj.weight"
    target: "model.layers.{L}.mlp.experts.w2_weight"
    format: nvfp4
    stack: {capture: E, count: @}
    layout:
      - {op: swizzle_128x4, on: _scale}
)";

constexpr char kNvfp4Spec[] = R"(model: bench
defaults:
  format: auto
rules:
  - match: "model.layers.{L}.mlp.experts.{E}.{gate,up,down}_proj.weight"
    format: nvfp4
)";

struct Bucket {
  BucketHeader header;
  std::vector<uint8_t> payload;
};

// The model's tensors packed, in order, into `count` buckets of about equal tensor counts.
std::vector<Bucket> PackBuckets(const std::vector<demo::HfTensor>& tensors, int count, bool amax) {
  std::vector<Bucket> buckets(static_cast<size_t>(count));
  const size_t per = (tensors.size() + count - 1) / count;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Bucket& b = buckets[i / per];
    std::vector<uint16_t> w = demo::Weights(1, tensors[i]);
    TensorDesc d;
    d.name = tensors[i].name;
    d.dtype = DType::kBF16;
    d.shape = tensors[i].shape;
    d.offset = (b.payload.size() + 15) / 16 * 16;
    d.nbytes = w.size() * 2;
    if (amax) d.amax = *formats::Amax({DType::kBF16, d.shape, w.data()}, {}, d.name);
    b.payload.resize(d.offset + d.nbytes);
    std::memcpy(b.payload.data() + d.offset, w.data(), d.nbytes);
    b.header.tensors.push_back(std::move(d));
  }
  uint32_t seq = 0;
  std::vector<Bucket> out;
  for (Bucket& b : buckets) {
    if (b.header.tensors.empty()) continue;
    b.header.seq = seq++;
    b.header.nbytes = b.payload.size();
    b.header.checksum = Checksum64(b.payload.data(), b.payload.size());
    out.push_back(std::move(b));
  }
  return out;
}

struct Phases {
  double plan = 0, announce = 0, finish = 0, receive = 0, convert = 0, work = 0, bookkeeping = 0, validate = 0, prepare = 0,
         write = 0, close = 0, total = 0;
};

// The converter's own work on every tensor (copies, reference quantizers) outside the session,
// into scratch outputs: convert minus this is the session's bookkeeping.
absl::StatusOr<double> ConverterWorkMs(const Planner& planner, Converter& converter, const std::vector<Bucket>& data) {
  std::vector<std::vector<uint8_t>> scratch;
  std::vector<formats::MutableBytes> outs;
  absl::Duration took;
  for (const Bucket& b : data) {
    for (const TensorDesc& d : b.header.tensors) {
      absl::StatusOr<std::shared_ptr<const TensorPlan>> plan = planner.SharedPlan(d.name, d.dtype, d.shape);
      if (!plan.ok()) return plan.status();
      scratch.resize((*plan)->targets.size());
      outs.clear();
      for (size_t i = 0; i < scratch.size(); ++i) {
        scratch[i].resize((*plan)->targets[i].spec.bytes);
        outs.push_back({scratch[i].data(), scratch[i].size()});
      }
      const absl::Time start = absl::Now();
      absl::Status st = converter.Convert(**plan, d, b.payload.data() + d.offset, storage::MemoryKind::kHost, outs,
                                          planner.spec().options);
      took += absl::Now() - start;
      if (!st.ok()) return st;
    }
  }
  converter.Sync();
  return absl::ToDoubleMilliseconds(took);
}

// The engine parameters the spec makes of `tensors`, back to back in shm region `region`
// (`bytes` in all): the spec's engine layout when it stacks and fuses, else each tensor's outputs.
absl::StatusOr<std::vector<storage::ShmParam>> EngineParams(const spec::ModelSpec& spec,
                                                            const std::vector<demo::HfTensor>& tensors, bool stacked,
                                                            const std::string& region, uint64_t& bytes) {
  std::vector<storage::ParamInfo> params;
  if (stacked) {
    std::vector<storage::ParamInfo> inputs;
    for (const demo::HfTensor& t : tensors) {
      inputs.push_back({t.name, DType::kBF16, t.shape, *DenseBytes(DType::kBF16, t.shape)});
    }
    REFIT_ASSIGN_OR_RETURN(params, EngineParamInfos(spec, inputs));
  } else {
    for (const demo::HfTensor& t : tensors) {
      REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, t.name, DType::kBF16, t.shape));
      for (const ResolvedOutput& o : r.outputs) {
        params.push_back({o.engine_name, o.dtype, o.shape, *DenseBytes(o.dtype, o.shape)});
      }
    }
  }
  std::vector<storage::ShmParam> shm;
  for (const storage::ParamInfo& p : params) {
    shm.push_back({p, region, bytes});
    bytes += (p.nbytes + 63) / 64 * 64;
  }
  return shm;
}

int Run(int argc, char** argv) {
  std::string model = "moe", spec_arg = "nvfp4";
  int buckets = 0, iters = 10;
  bool amax = false, device_path = false;
  demo::ModelShape shape;
  shape.hidden = 64;
  shape.kv_hidden = 32;
  shape.vocab = 512;
  std::vector<char*> shape_args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--spec" && i + 1 < argc) {
      spec_arg = argv[++i];
    } else if (a == "--buckets" && i + 1 < argc) {
      buckets = std::atoi(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--amax") {
      amax = true;
    } else if (a == "--device-path") {
      device_path = true;
    } else {
      shape_args.push_back(argv[i]);
    }
  }
  if (model == "moe") {
    shape.layers = 8;
    shape.experts = 128;
    shape.moe_intermediate = 32;
    if (buckets == 0) buckets = 9;
  } else if (model == "llama") {
    shape.layers = 32;
    shape.intermediate = 128;
    if (buckets == 0) buckets = 4;
  } else {
    std::fprintf(stderr, "--model is moe or llama\n");
    return 2;
  }
  for (int i = 1; i < static_cast<int>(shape_args.size()); ++i) {
    if (!demo::ParseShapeFlag(static_cast<int>(shape_args.size()), shape_args.data(), i, shape)) {
      std::fprintf(stderr, "unknown flag %s\n", shape_args[static_cast<size_t>(i)]);
      return 2;
    }
  }

#ifndef REFIT_SESSION_BENCH_DEVICE
  if (device_path) {
    std::fprintf(stderr, "--device-path needs a build with the test suite (REFIT_TESTING)\n");
    return 2;
  }
#endif
  const bool stacked = spec_arg == "nvfp4-stacked";
  if (stacked && shape.experts == 0) {
    std::fprintf(stderr, "--spec nvfp4-stacked needs --model moe\n");
    return 2;
  }
  absl::StatusOr<spec::ModelSpec> spec =
      spec_arg == "passthrough" ? spec::ParseModelSpec(kPassthroughSpec)
      : spec_arg == "nvfp4"     ? spec::ParseModelSpec(kNvfp4Spec)
      : stacked ? spec::ParseModelSpec(absl::StrReplaceAll(kNvfp4StackedSpec, {{"@", absl::StrCat(shape.experts)}}))
                : spec::LoadModelSpecFile(spec_arg);
  if (!spec.ok()) {
    std::fprintf(stderr, "spec: %s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  const std::vector<demo::HfTensor> tensors = demo::Tensors(shape);

  // The engine registers what the spec makes of every tensor, in shared memory.
  const std::string region_name = absl::StrCat("/refit_session_bench_", getpid());
  uint64_t region_bytes = 0;
  absl::StatusOr<std::vector<storage::ShmParam>> shm = EngineParams(*spec, tensors, stacked, region_name, region_bytes);
  if (!shm.ok()) {
    std::fprintf(stderr, "%s\n", std::string(shm.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<storage::ShmRegion>> region = storage::ShmRegion::Create(region_name, region_bytes);
  if (!region.ok()) {
    std::fprintf(stderr, "shm: %s\n", std::string(region.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<storage::ShmEngineStorage>> shm_engine = storage::ShmEngineStorage::Open(*shm);
  if (!shm_engine.ok()) {
    std::fprintf(stderr, "engine storage: %s\n", std::string(shm_engine.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<storage::EngineStorage> engine_storage = *std::move(shm_engine);
  std::unique_ptr<storage::Memory> ring_memory = storage::NewHostMemory();
  std::unique_ptr<StagingPool> pool_owner = std::make_unique<StagingPool>(storage::NewHostMemory());
  std::unique_ptr<Converter> converter_owner = std::make_unique<CpuConverter>();
#ifdef REFIT_SESSION_BENCH_DEVICE
  if (device_path) {
    engine_storage = std::make_unique<host_device::HostDeviceEngineStorage>(std::move(engine_storage));
    ring_memory = host_device::NewHostBackedDeviceMemory();
    pool_owner = std::make_unique<StagingPool>(host_device::NewHostBackedDeviceMemory());
    converter_owner = std::make_unique<host_device::HostDeviceConverter>();
  }
#endif
  storage::EngineStorage* engine = engine_storage.get();
  StagingPool& pool = *pool_owner;
  Converter& converter = *converter_owner;
  absl::StatusOr<Planner> planner = Planner::Create(*spec, engine->params());
  if (!planner.ok()) {
    std::fprintf(stderr, "planner: %s\n", std::string(planner.status().message()).c_str());
    return 1;
  }

  const std::vector<Bucket> data = PackBuckets(tensors, buckets, amax);
  uint64_t slot_bytes = 0, total_bytes = 0;
  for (const Bucket& b : data) {
    slot_bytes = std::max<uint64_t>(slot_bytes, b.payload.size());
    total_bytes += b.payload.size();
  }
  absl::StatusOr<std::unique_ptr<BucketRing>> ring = BucketRing::Create(2, slot_bytes, *ring_memory);
  if (!ring.ok()) return 1;
  // On the device path the payloads arrive in "device" memory, as from a GPU data plane.
  transport::MemoryReceiver receiver(device_path ? ring_memory.get() : nullptr);
  Manifest manifest;
  for (const Bucket& b : data) manifest.tensors.insert(manifest.tensors.end(), b.header.tensors.begin(), b.header.tensors.end());

  std::printf("model %s: %zu tensors, %zu buckets, %.1f MiB in, %zu engine parameters, spec %s, amax %s, %s\n",
              model.c_str(), tensors.size(), data.size(), total_bytes / 1048576.0, engine->params().size(),
              spec_arg.c_str(), amax ? "supplied" : "computed by refitd",
              device_path ? "device path (host-backed)" : "host path");

  std::vector<Phases> runs;
  for (int it = 0; it <= iters; ++it) {  // run 0 warms the staging pool
    Phases p;
    const absl::Time t0 = absl::Now();
    // Daemon.begin: every manifest tensor is planned up front (fail fast).
    for (const TensorDesc& t : manifest.tensors) {
      if (!planner->Plan(t.name, t.dtype, t.shape).ok()) return 1;
    }
    const absl::Time t1 = absl::Now();
    Session::Options options;
    options.id = static_cast<uint64_t>(it + 1);
    options.limits.bucket_bytes = slot_bytes;
    auto session = std::make_unique<Session>(*planner, receiver, **ring, converter, pool, options);
    for (const Bucket& b : data) receiver.Put(Session::Tag(options.id, b.header.seq), &b.payload);
    for (const Bucket& b : data) {
      if (absl::Status st = session->Announce(b.header); !st.ok()) {
        std::fprintf(stderr, "announce: %s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    const absl::Time t2 = absl::Now();
    if (absl::Status st = session->Finish(); !st.ok()) {
      std::fprintf(stderr, "finish: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    const absl::Time t3 = absl::Now();
    if (absl::Status st = session->Validate(); !st.ok()) {
      std::fprintf(stderr, "validate: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    const absl::Time t4 = absl::Now();
    absl::StatusOr<PreparedCommit> prepared =
        PrepareCommit(*planner, session->staging(), session->ledger().Produced(), converter.device_ops());
    if (prepared.ok()) {
      if (absl::Status st = PrepareStorageWrites(*prepared, *engine); !st.ok()) prepared = st;
    }
    if (!prepared.ok()) {
      std::fprintf(stderr, "prepare: %s\n", std::string(prepared.status().message()).c_str());
      return 1;
    }
    const absl::Time t5 = absl::Now();
    absl::StatusOr<CommitStats> written = WritePrepared(*planner, *prepared, *engine);
    if (!written.ok()) {
      std::fprintf(stderr, "write: %s\n", std::string(written.status().message()).c_str());
      return 1;
    }
    const absl::Time t6 = absl::Now();
    RefitReport report = session->Report();
    session.reset();
    const absl::Time t7 = absl::Now();
    auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
    p.plan = ms(t1 - t0);
    p.announce = ms(t2 - t1);
    p.finish = ms(t3 - t2);
    p.receive = report.times.receive_ms;
    p.convert = report.times.convert_ms;
    p.validate = ms(t4 - t3);
    p.prepare = ms(t5 - t4);
    p.write = ms(t6 - t5);
    p.close = ms(t7 - t6);
    p.total = ms(t7 - t0);
    absl::StatusOr<double> work = ConverterWorkMs(*planner, converter, data);
    if (!work.ok()) {
      std::fprintf(stderr, "converter: %s\n", std::string(work.status().message()).c_str());
      return 1;
    }
    p.work = *work;
    p.bookkeeping = p.convert - p.work;
    if (it > 0) runs.push_back(p);
  }
  auto median = [&](double Phases::*field) {
    std::vector<double> v;
    for (const Phases& p : runs) v.push_back(p.*field);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double n = static_cast<double>(tensors.size());
  std::printf("%-34s %10s %12s\n", "phase (median of runs)", "ms", "us/tensor");
  const std::pair<const char*, double Phases::*> rows[] = {
      {"begin: plan manifest", &Phases::plan},
      {"session start + announce", &Phases::announce},
      {"  receive (session timer)", &Phases::receive},
      {"  convert (session timer)", &Phases::convert},
      {"    converter work (measured alone)", &Phases::work},
      {"    convert minus converter work", &Phases::bookkeeping},
      {"finish (receive+convert wall)", &Phases::finish},
      {"validate (Ledger::Check)", &Phases::validate},
      {"prepare commit", &Phases::prepare},
      {"write into shm", &Phases::write},
      {"session close", &Phases::close},
      {"total", &Phases::total},
  };
  for (const auto& [label, field] : rows) {
    const double m = median(field);
    std::printf("%-34s %10.3f %12.3f\n", label, m, m * 1000.0 / n);
  }
  return 0;
}

}  // namespace
}  // namespace refit

int main(int argc, char** argv) {
  // As refitd (src/server/main.cc): the system Abseil's lock-order detector is not what it measures.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  refit::StartCpuProfileFromEnv();  // REFIT_CPU_PROFILE (common/cpu_profile.h)
  return refit::Run(argc, argv);
}
