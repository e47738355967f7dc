// Every shipped model spec (deploy/models) on the GPU fast path: a tiny checkpoint of the family
// (tests/integration/specs/make_checkpoints.py) arrives as device payloads (device ring slots, as
// from NCCL) in small buckets, so fused groups straddle buckets; the session converts with the
// GPU converter into device staging (transposes, this rank's TP slices and fused NVFP4 group amax
// on the device), and the commit's prepare step builds layout steps and derived parameters with
// the GPU kernels. Every engine parameter's bytes must equal the offline engine layout of the same
// checkpoint (what `refitctl convert --engine-layout` writes), over three refits with new values.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
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

bool HaveGpu(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
    return false;
  }
  return true;
}

struct Family {
  std::string name;
  std::string spec;
};

class DeviceStagingFamilies : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU for the device-staging family test: " << why;
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
  absl::StatusOr<spec::ModelSpec> spec = spec::LoadModelSpecFile(SourceDir() + "/deploy/models/" + f.spec);
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

  for (int refit = 0; refit < 3; ++refit) {
    SCOPED_TRACE(absl::StrCat(f.name, " refit ", refit));
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
    ASSERT_TRUE(valid.ok()) << valid;
    absl::StatusOr<PreparedCommit> prepared =
        PrepareCommit(*planner, session->staging(), session->ledger().Produced(), (*converter)->device_ops());
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    built_on_device += prepared->built_on_device;
    held_peak = std::max(held_peak, session->Report().fused_held_peak_bytes);

    std::map<std::string, const ConvertedTensor*> want;
    for (const ConvertedTensor& t : *expected) want[t.name] = &t;
    size_t compared = 0;
    for (const PreparedCommit::Write& w : prepared->writes) {
      const storage::ParamInfo& p = planner->params()[w.index];
      auto it = want.find(p.name);
      ASSERT_NE(it, want.end()) << p.name;
      std::vector<uint8_t> got(p.nbytes);
      ASSERT_EQ(cudaMemcpy(got.data(), w.data, p.nbytes, cudaMemcpyDeviceToHost), cudaSuccess);
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

INSTANTIATE_TEST_SUITE_P(Shipped, DeviceStagingFamilies,
                         ::testing::Values(Family{"llama3", "llama3_fp8.yaml"},
                                           Family{"qwen3_moe", "qwen3_moe_nvfp4.yaml"},
                                           Family{"deepseek_v3", "deepseek_v3_fp8_ue8m0.yaml"},
                                           Family{"gpt_oss", "gpt_oss_mxfp4.yaml"},
                                           Family{"qwen35", "qwen35_mxfp8.yaml"}),
                         [](const ::testing::TestParamInfo<Family>& i) { return i.param.name; });

}  // namespace
}  // namespace refit
