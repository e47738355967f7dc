// Every shipped model spec (deploy/models) on the GPU fast path: a tiny checkpoint of the family
// (tests/integration/specs/make_checkpoints.py) arrives as device payloads (device ring slots, as
// from NCCL) in small buckets, so fused groups straddle buckets; the session converts with the
// GPU converter into device staging (transposes, this rank's TP slices and fused NVFP4 group amax
// on the device), and the commit's prepare step builds layout steps and derived parameters with
// the GPU kernels. Every engine parameter's bytes must equal the offline engine layout of the same
// checkpoint (what `refitctl convert --engine-layout` writes), over three refits with new values;
// the second refit announces the trainer's amax (single-pass NVFP4); a fourth refit that leaves one tensor out (for qwen3_moe a fused NVFP4 member, whose partner
// then waits on the device) is refused at validation, naming it.
#include <cuda_runtime.h>
#include <unistd.h>

#include "../../cuda_device.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/checksum.h"
#include "formats/format.h"
#include "refit/checkpoint_io.h"
#include "refit/committer.h"
#include "refit/gpu/gpu_converter.h"
#include "refit/offline.h"
#include "refit/planner.h"
#include "refit/session.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "transport/memory/memory_receiver.h"

namespace refit {
namespace {

std::string SourceDir() {
  const char* env = std::getenv("REFIT_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : REFIT_SOURCE_DIR_DEFAULT;
}


struct Family {
  std::string name;
  std::string spec;
  std::string drop;   // left out of a fourth refit, which must be refused...
  std::string error;  // ...with this in the verdict (the host-path test's, test_families.py)
};

class DeviceStagingFamilies : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    REFIT_SKIP_WITHOUT_GPU();
    char tmpl[] = "/tmp/refit-devfam-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) (void)std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  std::string Checkpoint(const std::string& family, int seed) {
    const std::string out = absl::StrCat(dir_, "/", family, seed);
    const std::string cmd = absl::StrCat("python3 '", SourceDir(), "/tests/integration/specs/make_checkpoints.py' ",
                                         family, " '", out, "' --seed ", seed, " > /dev/null");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return out + "/model.safetensors";
  }
  std::string dir_;
};

TEST_P(DeviceStagingFamilies, EngineBytesEqualTheOfflineEngineLayout) {
  const Family& f = GetParam();
  // The shipped spec, its sizes from the family's small checkpoint's config.json.
  const std::string ckpt0 = Checkpoint(f.name, 0);
  absl::StatusOr<spec::ModelConfig> config =
      spec::LoadModelConfigFile((std::filesystem::path(ckpt0).parent_path() / "config.json").string());
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<spec::ModelSpec> spec =
      spec::LoadModelSpecFile(SourceDir() + "/deploy/models/" + f.spec, {.model_config = &*config});
  ASSERT_TRUE(spec.ok()) << spec.status();

  absl::StatusOr<std::unique_ptr<storage::Memory>> device = storage::NewDeviceMemory(0);
  ASSERT_TRUE(device.ok()) << device.status();
  GpuConverterStats stats;
  GpuConverterOptions copts;
  copts.stats = &stats;
  absl::StatusOr<std::unique_ptr<Converter>> converter = NewGpuConverter(0, copts);
  ASSERT_TRUE(converter.ok()) << converter.status();
  ASSERT_NE((*converter)->device_ops(), nullptr);
  absl::StatusOr<std::unique_ptr<storage::Memory>> pool_memory = storage::NewDeviceMemory(0);
  ASSERT_TRUE(pool_memory.ok());
  StagingPool pool(std::move(*pool_memory));
  constexpr uint64_t kBucket = 96 << 10;  // small: fused groups straddle buckets
  std::unique_ptr<BucketRing> ring;
  std::unique_ptr<Planner> planner;
  uint64_t held_peak = 0;
  uint32_t built_on_device = 0;

  for (int refit = 0; refit < 4; ++refit) {
    SCOPED_TRACE(absl::StrCat(f.name, " refit ", refit));
    const bool stranded = refit == 3;  // the last refit leaves `f.drop` out
    absl::StatusOr<std::unique_ptr<refit::Checkpoint>> ckpt = refit::Checkpoint::Open(Checkpoint(f.name, refit + 1));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    const std::vector<InputTensor>& inputs = (*ckpt)->tensors();
    // The reference: the offline conversion and engine layout of the same checkpoint.
    absl::StatusOr<std::vector<ConvertedTensor>> converted = ConvertCheckpoint(*spec, inputs);
    ASSERT_TRUE(converted.ok()) << converted.status();
    std::map<std::string, const ConvertedTensor*> by_name;
    for (const ConvertedTensor& t : *converted) by_name[t.name] = &t;
    std::vector<storage::ParamInfo> infos;
    for (const InputTensor& in : inputs) infos.push_back({in.name, in.dtype, in.shape, *DenseBytes(in.dtype, in.shape)});
    absl::StatusOr<std::vector<ConvertedTensor>> expected = EngineLayout(*spec, infos, by_name);
    ASSERT_TRUE(expected.ok()) << expected.status();
    if (planner == nullptr) {
      std::vector<storage::ParamInfo> params;
      for (const ConvertedTensor& t : *expected) params.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
      absl::StatusOr<Planner> p = Planner::Create(*spec, params);
      ASSERT_TRUE(p.ok()) << p.status();
      planner = std::make_unique<Planner>(std::move(*p));
      uint64_t largest = 0;
      for (const InputTensor& in : inputs) largest = std::max(largest, *DenseBytes(in.dtype, in.shape));
      absl::StatusOr<std::unique_ptr<BucketRing>> r = BucketRing::Create(2, std::max(kBucket, largest), **device);
      ASSERT_TRUE(r.ok()) << r.status();
      ring = std::move(*r);
    }

    // Buckets of device payloads, in checkpoint order.
    std::vector<BucketHeader> headers;
    std::vector<std::vector<uint8_t>> payloads;
    for (const InputTensor& in : inputs) {
      const uint64_t n = *DenseBytes(in.dtype, in.shape);
      absl::StatusOr<TensorPlan> plan = planner->Plan(in.name, in.dtype, in.shape);
      if (!plan.ok() && absl::StrContains(plan.status().message(), "never carry")) continue;  // the engine's own
      if (stranded && in.name == f.drop) continue;
      ASSERT_TRUE(plan.ok()) << plan.status();
      if (headers.empty() || payloads.back().size() + n > std::max(kBucket, n)) {
        headers.push_back({});
        headers.back().seq = static_cast<uint32_t>(headers.size() - 1);
        payloads.emplace_back();
      }
      std::vector<uint8_t>& p = payloads.back();
      p.resize((p.size() + 15) & ~size_t{15});
      TensorDesc d;
      d.name = in.name;
      d.dtype = in.dtype;
      d.shape = in.shape;
      d.offset = p.size();
      d.nbytes = n;
      // The second refit announces the trainer's amax of every BF16 tensor (single-pass NVFP4,
      // fused members not held): the same engine bytes.
      if (refit == 1 && in.dtype == DType::kBF16) d.amax = *formats::Amax({in.dtype, in.shape, in.data}, spec->options, in.name);
      p.insert(p.end(), static_cast<const uint8_t*>(in.data), static_cast<const uint8_t*>(in.data) + n);
      headers.back().tensors.push_back(d);
    }
    transport::MemoryReceiver receiver(device->get());
    Session::Options options;
    options.id = static_cast<uint64_t>(refit + 1);
    options.limits.bucket_bytes = ring->slot_bytes();
    options.limits.staging_bytes = uint64_t{8} << 30;
    auto session = std::make_unique<Session>(*planner, receiver, *ring, **converter, pool, options);
    for (size_t b = 0; b < headers.size(); ++b) {
      headers[b].nbytes = payloads[b].size();
      receiver.Put(Session::Tag(options.id, headers[b].seq), &payloads[b]);
      ASSERT_TRUE(session->Announce(headers[b]).ok());
    }
    absl::Status finished = session->Finish();
    ASSERT_TRUE(finished.ok()) << finished;
    absl::Status valid = session->Validate();
    if (stranded) {
      // Refused at validation, before anything is built or written; a fused member whose group
      // never completed (held on the device) is dropped with the session.
      EXPECT_FALSE(valid.ok());
      EXPECT_TRUE(absl::StrContains(valid.message(), f.error)) << valid;
      session.reset();
      continue;
    }
    ASSERT_TRUE(valid.ok()) << valid;
    // Odd refits write fused and stacked parameters piece by piece (PrepareOptions::pieces_in_place).
    PrepareOptions prepare_options;
    prepare_options.pieces_in_place = refit % 2 == 1;
    absl::StatusOr<PreparedCommit> prepared = PrepareCommit(*planner, session->staging(), session->ledger().Produced(),
                                                            (*converter)->device_ops(), prepare_options);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    built_on_device += prepared->built_on_device;
    held_peak = std::max(held_peak, session->Report().fused_held_peak_bytes);

    std::map<std::string, const ConvertedTensor*> want;
    for (const ConvertedTensor& t : *expected) want[t.name] = &t;
    // What the engine's parameters hold after the writes (each at its offset), poisoned first.
    std::map<size_t, std::vector<uint8_t>> engine;
    size_t pieces = 0;
    for (const PreparedCommit::Write& w : prepared->writes) {
      const storage::ParamInfo& p = planner->params()[w.index];
      std::vector<uint8_t>& bytes = engine.try_emplace(w.index, p.nbytes, uint8_t{0xA5}).first->second;
      ASSERT_LE(w.offset + w.bytes, p.nbytes) << p.name;
      ASSERT_EQ(cudaMemcpy(bytes.data() + w.offset, w.data, w.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      pieces += w.bytes != p.nbytes;
    }
    if (prepare_options.pieces_in_place && (f.name == "llama3" || f.name == "qwen3_moe")) {
      EXPECT_GT(pieces, 0u) << "fused parameters are written piece by piece";
    }
    if (!prepare_options.pieces_in_place) {
      EXPECT_EQ(pieces, 0u);
    }
    EXPECT_EQ(prepared->params, engine.size());
    size_t compared = 0;
    for (const auto& [index, got] : engine) {
      const storage::ParamInfo& p = planner->params()[index];
      auto it = want.find(p.name);
      ASSERT_NE(it, want.end()) << p.name;
      ASSERT_EQ(got.size(), it->second->bytes.size()) << p.name;
      size_t first = got.size();
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != it->second->bytes[i]) {
          first = i;
          break;
        }
      }
      EXPECT_EQ(first, got.size()) << "engine parameter '" << p.name << "' differs from the offline engine layout at byte "
                                   << first << " of " << got.size();
      ++compared;
    }
    size_t expected_writes = 0;
    for (const ConvertedTensor& t : *expected) {
      const int64_t i = planner->IndexOf(t.name);
      if (i >= 0 && planner->source(static_cast<size_t>(i)).kind != ParamSource::Kind::kKept) ++expected_writes;
    }
    EXPECT_EQ(compared, expected_writes);
    session.reset();
  }
  std::printf("[ family %s ] %llu tensors with the whole plan on the device, %u parameters laid out or derived on the "
              "device, fused members held across buckets: %llu bytes at most\n",
              f.name.c_str(), static_cast<unsigned long long>(stats.planned), built_on_device,
              static_cast<unsigned long long>(held_peak));
}

// Real layer shapes with the shipped specs (REFIT_DEVSTAGING_BENCH=1; skipped otherwise): the
// session's convert time and the commit's prepare time, device path vs the host path it replaces
// (GpuConverterOptions::device_ops off: host payloads converted whole on the CPU, layout steps on
// the host), engine bytes checked against the offline engine layout.
struct Generated {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<InputTensor> inputs;
  void Add(const std::string& name, Shape shape, uint32_t seed, bool norm = false) {
    const int64_t n = *NumElements(shape);
    std::vector<uint8_t> b(static_cast<size_t>(n) * 2);
    uint32_t x = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      // BF16 of magnitude ~2^-7 .. 2^-4 with a random sign (norms: 1 .. 2).
      const uint16_t v = norm ? static_cast<uint16_t>(0x3F80 | ((x >> 9) & 0x7F))
                              : static_cast<uint16_t>(((x >> 16) & 0x8000) | ((0x78 + ((x >> 13) & 3)) << 7) | ((x >> 3) & 0x7F));
      b[2 * i] = static_cast<uint8_t>(v);
      b[2 * i + 1] = static_cast<uint8_t>(v >> 8);
    }
    names.push_back(name);
    shapes.push_back(std::move(shape));
    bytes.push_back(std::move(b));
  }
  void Finish() {
    for (size_t i = 0; i < names.size(); ++i) inputs.push_back({names[i], DType::kBF16, shapes[i], bytes[i].data()});
  }
};

Generated Qwen3MoeLayers(int layers) {  // Qwen3-30B-A3B: hidden 2048, 32 q / 4 kv heads of 128, 128 experts of 768
  Generated g;
  uint32_t seed = 1;
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    g.Add(p + "input_layernorm.weight", {2048}, seed++, true);
    g.Add(p + "self_attn.q_proj.weight", {4096, 2048}, seed++);
    g.Add(p + "self_attn.k_proj.weight", {512, 2048}, seed++);
    g.Add(p + "self_attn.v_proj.weight", {512, 2048}, seed++);
    g.Add(p + "self_attn.o_proj.weight", {2048, 4096}, seed++);
    g.Add(p + "self_attn.q_norm.weight", {128}, seed++, true);
    g.Add(p + "self_attn.k_norm.weight", {128}, seed++, true);
    g.Add(p + "post_attention_layernorm.weight", {2048}, seed++, true);
    g.Add(p + "mlp.gate.weight", {128, 2048}, seed++);
    for (int e = 0; e < 128; ++e) {
      const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
      g.Add(ep + "gate_proj.weight", {768, 2048}, seed++);
      g.Add(ep + "up_proj.weight", {768, 2048}, seed++);
      g.Add(ep + "down_proj.weight", {2048, 768}, seed++);
    }
  }
  g.Finish();
  return g;
}

Generated Llama3Layers(int layers) {  // Llama-3-8B: hidden 4096, kv 1024, intermediate 14336
  Generated g;
  uint32_t seed = 1;
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    g.Add(p + "input_layernorm.weight", {4096}, seed++, true);
    g.Add(p + "self_attn.q_proj.weight", {4096, 4096}, seed++);
    g.Add(p + "self_attn.k_proj.weight", {1024, 4096}, seed++);
    g.Add(p + "self_attn.v_proj.weight", {1024, 4096}, seed++);
    g.Add(p + "self_attn.o_proj.weight", {4096, 4096}, seed++);
    g.Add(p + "post_attention_layernorm.weight", {4096}, seed++, true);
    g.Add(p + "mlp.gate_proj.weight", {14336, 4096}, seed++);
    g.Add(p + "mlp.up_proj.weight", {14336, 4096}, seed++);
    g.Add(p + "mlp.down_proj.weight", {4096, 14336}, seed++);
  }
  g.Finish();
  return g;
}

struct Timing {
  double convert_ms = 0, prepare_ms = 0, wall_ms = 0;
};

// One refit of `g` through a Session into device staging, then PrepareCommit; checks every
// written parameter against `expected`.
Timing RefitOnce(const spec::ModelSpec& spec, const Generated& g, const std::vector<ConvertedTensor>& expected,
                 storage::MemoryKind ring_kind, bool device_ops, bool supply_amax = false) {
  Timing t;
  std::vector<storage::ParamInfo> params;
  for (const ConvertedTensor& c : expected) params.push_back({c.name, c.dtype, c.shape, c.bytes.size()});
  absl::StatusOr<Planner> planner = Planner::Create(spec, params);
  EXPECT_TRUE(planner.ok()) << planner.status();
  if (!planner.ok()) return t;
  GpuConverterOptions copts;
  copts.device_ops = device_ops;
  std::unique_ptr<Converter> converter = *NewGpuConverter(0, copts);
  std::unique_ptr<storage::Memory> device = *storage::NewDeviceMemory(0);
  std::unique_ptr<storage::Memory> pinned = storage::NewPinnedHostMemory();
  StagingPool pool(*storage::NewDeviceMemory(0));
  constexpr uint64_t kBucket = uint64_t{256} << 20;
  storage::Memory& ring_memory = ring_kind == storage::MemoryKind::kDevice ? *device : *pinned;
  std::unique_ptr<BucketRing> ring = *BucketRing::Create(2, kBucket, ring_memory);
  std::vector<BucketHeader> headers;
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const uint64_t n = g.bytes[i].size();
    if (headers.empty() || payloads.back().size() + n + 16 > kBucket) {
      headers.push_back({});
      headers.back().seq = static_cast<uint32_t>(headers.size() - 1);
      payloads.emplace_back();
      payloads.back().reserve(kBucket);
    }
    std::vector<uint8_t>& p = payloads.back();
    p.resize((p.size() + 15) & ~size_t{15});
    TensorDesc d{g.names[i], DType::kBF16, g.shapes[i], p.size(), n, {}};
    // The trainer's amax (what RefitSession::MeasureAmax announces): single-pass NVFP4.
    if (supply_amax) d.amax = *formats::Amax({DType::kBF16, g.shapes[i], g.bytes[i].data()}, spec.options, d.name);
    p.insert(p.end(), g.bytes[i].begin(), g.bytes[i].end());
    headers.back().tensors.push_back(d);
  }
  std::unique_ptr<transport::MemoryReceiver> receiver =
      ring_kind == storage::MemoryKind::kDevice ? std::make_unique<transport::MemoryReceiver>(device.get())
                                                : std::make_unique<transport::MemoryReceiver>();
  for (size_t b = 0; b < headers.size(); ++b) {
    headers[b].nbytes = payloads[b].size();
    if (ring_kind == storage::MemoryKind::kHost) headers[b].checksum = Checksum64(payloads[b].data(), payloads[b].size());
  }
  // Two refits on the same converter, ring and staging pool: the second is the steady state
  // (staging buffers allocated by the first), and the one timed.
  for (int refit = 0; refit < 2; ++refit) {
  Session::Options options;
  options.id = static_cast<uint64_t>(refit + 1);
  options.limits.bucket_bytes = kBucket;
  options.limits.staging_bytes = uint64_t{64} << 30;
  absl::Time t0 = absl::Now();
  auto session = std::make_unique<Session>(*planner, *receiver, *ring, *converter, pool, options);
  for (size_t b = 0; b < headers.size(); ++b) {
    receiver->Put(Session::Tag(options.id, headers[b].seq), &payloads[b]);
    EXPECT_TRUE(session->Announce(headers[b]).ok());
  }
  absl::Status finished = session->Finish();
  EXPECT_TRUE(finished.ok()) << finished;
  EXPECT_TRUE(session->Validate().ok()) << session->Validate();
  absl::Time t1 = absl::Now();
  absl::StatusOr<PreparedCommit> prepared =
      PrepareCommit(*planner, session->staging(), session->ledger().Produced(), converter->device_ops());
  absl::Time t2 = absl::Now();
  EXPECT_TRUE(prepared.ok()) << prepared.status();
  t.convert_ms = session->Report().times.convert_ms;
  t.prepare_ms = absl::ToDoubleMilliseconds(t2 - t1);
  t.wall_ms = absl::ToDoubleMilliseconds(t2 - t0);
  if (!prepared.ok()) return t;
  std::printf("[ bench ]     refit %d: receive %.1f ms, convert %.1f ms, prepare %.1f ms (%u built on the device)\n", refit,
              session->Report().times.receive_ms, t.convert_ms, t.prepare_ms, prepared->built_on_device);
  std::map<std::string, const ConvertedTensor*> want;
  for (const ConvertedTensor& c : expected) want[c.name] = &c;
  size_t differ = 0;
  for (const PreparedCommit::Write& w : prepared->writes) {
    const storage::ParamInfo& p = planner->params()[w.index];
    std::vector<uint8_t> got(p.nbytes);
    EXPECT_EQ(cudaMemcpy(got.data(), w.data, p.nbytes, cudaMemcpyDeviceToHost), cudaSuccess);
    if (got != want[p.name]->bytes) {
      ++differ;
      ADD_FAILURE() << "engine parameter '" << p.name << "' differs from the offline engine layout";
    }
  }
  EXPECT_EQ(differ, 0u);
  session.reset();
  }
  return t;
}

TEST(DeviceStagingBench, ShippedSpecsAtLayerShapes) {
  REFIT_SKIP_WITHOUT_GPU();
  const char* on = std::getenv("REFIT_DEVSTAGING_BENCH");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "benchmark: set REFIT_DEVSTAGING_BENCH=1";
  struct Case {
    std::string name, spec;
    Generated (*make)(int);
    int layers;
  };
  // The shipped specs as they are, their sizes from the real models' config.json (tests/models/).
  for (const Case& c :
       {Case{"qwen3_moe_nvfp4 (Qwen3-30B-A3B layer, 128 experts)", "qwen3_moe_nvfp4.yaml", Qwen3MoeLayers, 1},
        Case{"llama3_fp8 (Llama-3-8B layers, one engine rank)", "llama3_fp8.yaml", Llama3Layers, 2}}) {
    const std::string model = c.spec == "qwen3_moe_nvfp4.yaml" ? "Qwen3-30B-A3B" : "Meta-Llama-3-8B";
    absl::StatusOr<spec::ModelConfig> config =
        spec::LoadModelConfigFile(SourceDir() + "/tests/models/" + model + "/config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<spec::ModelSpec> spec =
        spec::LoadModelSpecFile(SourceDir() + "/deploy/models/" + c.spec, {.model_config = &*config});
    ASSERT_TRUE(spec.ok()) << spec.status();
    Generated g = c.make(c.layers);
    uint64_t bytes = 0;
    for (const auto& b : g.bytes) bytes += b.size();
    absl::Time r0 = absl::Now();
    absl::StatusOr<std::vector<ConvertedTensor>> converted = ConvertCheckpoint(*spec, g.inputs);
    ASSERT_TRUE(converted.ok()) << converted.status();
    std::map<std::string, const ConvertedTensor*> by_name;
    for (const ConvertedTensor& t : *converted) by_name[t.name] = &t;
    std::vector<storage::ParamInfo> infos;
    for (const InputTensor& i : g.inputs) infos.push_back({i.name, i.dtype, i.shape, *DenseBytes(i.dtype, i.shape)});
    absl::StatusOr<std::vector<ConvertedTensor>> expected = EngineLayout(*spec, infos, by_name);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const double reference_ms = absl::ToDoubleMilliseconds(absl::Now() - r0);
    Timing before = RefitOnce(*spec, g, *expected, storage::MemoryKind::kHost, false);
    Timing host_in = RefitOnce(*spec, g, *expected, storage::MemoryKind::kHost, true);
    Timing after = RefitOnce(*spec, g, *expected, storage::MemoryKind::kDevice, true);
    Timing supplied = RefitOnce(*spec, g, *expected, storage::MemoryKind::kDevice, true, /*supply_amax=*/true);
    std::printf("[ bench ] %s: %zu tensors, %.2f GB BF16 in; offline reference %.0f ms\n", c.name.c_str(),
                g.inputs.size(), bytes / 1e9, reference_ms);
    auto row = [](const char* what, const Timing& t) {
      std::printf("[ bench ]   %-52s convert %9.1f ms  prepare %8.1f ms  wall %9.1f ms\n", what, t.convert_ms,
                  t.prepare_ms, t.wall_ms);
    };
    row("host payloads, host path (device_ops off: before)", before);
    row("host payloads, device path", host_in);
    row("device payloads, device path", after);
    row("device payloads, device path, trainer-supplied amax", supplied);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shipped, DeviceStagingFamilies,
    ::testing::Values(Family{"llama3", "llama3_fp8.yaml", "model.layers.0.mlp.up_proj.weight",
                             "incomplete: engine parameter 'model.layers.0.mlp.gate_up_proj.weight' lacks "
                             "'model.layers.0.mlp.up_proj.weight'"},
                      // A fused NVFP4 member whose partner never comes: held on the device, then refused.
                      Family{"qwen3_moe", "qwen3_moe_nvfp4.yaml", "model.layers.1.mlp.experts.2.up_proj.weight",
                             "lacks 'model.layers.1.mlp.experts.2.up_proj.weight'"},
                      Family{"deepseek_v3", "deepseek_v3_fp8_ue8m0.yaml",
                             "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                             "incomplete: engine parameter 'model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight' "
                             "lacks 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight'"},
                      Family{"gpt_oss", "gpt_oss_mxfp4.yaml", "model.layers.1.mlp.experts.down_proj",
                             "missing: 'model.layers.1.mlp.experts.down_proj_blocks'"},
                      Family{"qwen35", "qwen35_mxfp8.yaml", "mtp.layers.0.mlp.gate_proj.weight",
                             "incomplete: engine parameter 'mtp.layers.0.mlp.gate_up_proj.weight' lacks "
                             "'mtp.layers.0.mlp.gate_proj.weight'"},
                      // compressed-tensors per-channel FP8 (ct_fp8_channel), fused qkv / gate_up.
                      Family{"llama3_ct", "llama3_ct_fp8_dynamic.yaml", "model.layers.0.mlp.up_proj.weight",
                             "incomplete: engine parameter 'model.layers.0.mlp.gate_up_proj.weight' lacks "
                             "'model.layers.0.mlp.up_proj.weight'"},
                      // SGLang's w_kc / w_vc derived from the staged block-FP8 kv_b_proj.
                      Family{"deepseek_v3_absorbed", "deepseek_v3_fp8_absorbed.yaml",
                             "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                             "incomplete: engine parameter 'model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight' "
                             "lacks 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight'"},
                      // The TRT-LLM MXFP4 MoE layout: padded, swapped and shuffled on the host.
                      Family{"gpt_oss_trtllm", "gpt_oss_mxfp4_trtllm.yaml", "model.layers.1.mlp.experts.down_proj",
                             "missing: 'model.layers.1.mlp.experts.down_proj_blocks'"}),
    [](const ::testing::TestParamInfo<Family>& i) { return i.param.name; });

}  // namespace
}  // namespace refit
