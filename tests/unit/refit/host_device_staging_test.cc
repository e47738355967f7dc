// The device staging path without a GPU: a node whose converter stages on "the device" through
// the host-backed stand-in of host_device.h (DeferOnDevice, ConvertDeviceGroup batched and not,
// HoldPendingMembers, StageOnRanks' device branch, the committer's device builds and writes).
// Each refit of a fused NVFP4 group must leave the engine (every rank of it) byte-identical to
// the same refit on the CPU path with host staging, and to the offline converter's engine layout.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "host_device.h"
#include "refit/cpu_converter.h"
#include "refit/node.h"
#include "refit/offline.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"
#include "transport/memory/memory_receiver.h"

namespace refit {
namespace {

using host_device::HostDeviceConverter;
using host_device::HostDeviceOptions;

class Control final : public EngineControl {
 public:
  absl::Status Pause(absl::Duration) override { return absl::OkStatus(); }
  absl::Status Resume(uint64_t, const std::string&, absl::Duration) override { return absl::OkStatus(); }
  bool Responsive() const override { return true; }
};

// BF16 bytes of `shape` with max|x| about `scale`.
std::vector<uint8_t> Bf16(const Shape& shape, float scale, uint32_t seed) {
  const int64_t n = *NumElements(shape);
  std::vector<uint8_t> out(static_cast<size_t>(n) * 2);
  uint32_t x = seed * 2654435761u + 1u;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = scale * (static_cast<float>(x >> 8) / 16777216.0f * 2.0f - 1.0f);
    uint32_t b;
    std::memcpy(&b, &v, 4);
    out[2 * i] = static_cast<uint8_t>(b >> 16);
    out[2 * i + 1] = static_cast<uint8_t>(b >> 24);
  }
  return out;
}

struct Input {
  std::string name;
  Shape shape;
  float scale;  // about its max|x|: members of a group differ, so the group's amax is not each member's
  int bucket = 0;
};

enum class Path { kCpu, kDeviceBatched, kDeviceUnbatched };

const char* PathName(Path p) {
  switch (p) {
    case Path::kCpu: return "cpu";
    case Path::kDeviceBatched: return "device, groups batched";
    case Path::kDeviceUnbatched: return "device, groups not batched";
  }
  return "";
}

// Each rank's engine parameters after a refit, by name.
using EngineBytes = std::vector<std::map<std::string, std::vector<uint8_t>>>;

class HostDeviceStagingTest : public ::testing::Test {
 protected:
  // One refit of `inputs` (each in its bucket) under `yaml` through `path`, committed; every
  // rank's engine parameters afterwards. Ranks: the spec's tensor_parallel.size.
  EngineBytes Refit(const std::string& yaml, const std::vector<Input>& inputs, Path path) {
    // The last refit's node goes before what it uses.
    node_.reset();
    receiver_.reset();
    ring_.reset();
    absl::StatusOr<spec::ModelSpec> parsed = spec::ParseModelSpec(yaml);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (!parsed.ok()) return {};
    spec_ = std::move(*parsed);
    const int ranks = std::max(1, spec_.tp_size);
    const bool device = path != Path::kCpu;
    HostDeviceOptions device_options;
    device_options.batch_groups = path == Path::kDeviceBatched;
    converter_ = nullptr;
    // Payloads arrive in "device" memory on the device path, as from a GPU data plane: a fused
    // group of whole device tensors is what the converter's batched run takes.
    ring_memory_ = device ? host_device::NewHostBackedDeviceMemory() : storage::NewHostMemory();
    // One slot: the second bucket lands where the first was, over any held member still there.
    ring_ = *BucketRing::Create(1, 1 << 20, *ring_memory_);
    receiver_ = device ? std::make_unique<transport::MemoryReceiver>(ring_memory_.get())
                       : std::make_unique<transport::MemoryReceiver>();
    auto new_pool = [device] {
      return std::make_unique<StagingPool>(device ? host_device::NewHostBackedDeviceMemory()
                                                  : storage::NewHostMemory());
    };
    auto new_converter = [this, device, device_options]() -> std::unique_ptr<Converter> {
      if (!device) return std::make_unique<CpuConverter>();
      auto c = std::make_unique<HostDeviceConverter>(device_options);
      converter_ = c.get();
      return c;
    };
    NodeOptions options;
    options.model = "m";
    options.pause_timeout = absl::Milliseconds(500);
    options.resume_timeout = absl::Milliseconds(500);
    if (ranks > 1) {
      options.spec = &spec_;
      options.make_staging = [new_pool, new_converter](EngineSetup& setup) {
        setup.pool = new_pool();
        setup.new_pool = new_pool;
        setup.converter = new_converter();
        return absl::OkStatus();
      };
    }
    node_ = std::make_unique<Node>(options, *receiver_, *ring_, NodeHooks{});

    std::vector<storage::ParamInfo> infos;
    for (const Input& in : inputs) {
      infos.push_back({in.name, DType::kBF16, in.shape, *DenseBytes(DType::kBF16, in.shape)});
    }
    regions_.clear();
    params_.clear();
    for (int r = 0; r < ranks; ++r) {
      absl::StatusOr<spec::ModelSpec> rank_spec = ranks > 1 ? spec::ForRank(spec_, r) : spec_;
      EXPECT_TRUE(rank_spec.ok()) << rank_spec.status();
      absl::StatusOr<std::vector<storage::ParamInfo>> params = EngineParamInfos(*rank_spec, infos);
      EXPECT_TRUE(params.ok()) << params.status();
      if (!rank_spec.ok() || !params.ok()) return {};
      params_.push_back(*params);
      std::unique_ptr<storage::EngineStorage> storage = Map(r);
      if (device) storage = std::make_unique<host_device::HostDeviceEngineStorage>(std::move(storage));
      EngineSetup setup;
      setup.storage = std::move(storage);
      setup.control = std::make_unique<Control>();
      if (ranks > 1) {
        setup.placement.tp_rank = r;
        setup.placement.tp_size = ranks;
        setup.placement.ep_rank = spec_.ep_size > 1 ? r : 0;
        setup.placement.ep_size = spec_.ep_size > 1 ? spec_.ep_size : 0;
        setup.placement.model = "m";
      } else {
        absl::StatusOr<Planner> planner = Planner::Create(spec_, setup.storage->params());
        EXPECT_TRUE(planner.ok()) << planner.status();
        if (!planner.ok()) return {};
        setup.planner = std::make_unique<Planner>(std::move(*planner));
        setup.pool = new_pool();
        setup.new_pool = new_pool;
        setup.converter = new_converter();
      }
      absl::StatusOr<uint64_t> id = node_->RegisterEngine(std::move(setup));
      EXPECT_TRUE(id.ok()) << id.status();
      if (!id.ok()) return {};
    }
    EXPECT_EQ(converter_ != nullptr, device);

    if (!Send(inputs)) return {};
    absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartCommit(session_);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    (*c)->Run();
    const RefitReport& report = node_->FinishCommit(**c);
    EXPECT_EQ(report.outcome, Outcome::kCommitted) << PathName(path) << ": " << report.reason;
    held_peak_bytes_ = report.fused_held_peak_bytes;
    EngineBytes out(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      uint64_t off = 0;
      for (const storage::ParamInfo& p : params_[r]) {
        const uint8_t* d = regions_[r]->data() + off;
        out[r][p.name] = {d, d + p.nbytes};
        off += p.nbytes;
      }
    }
    return out;
  }

  // Rank `r`'s parameters in a fresh shm region, back to back (0xAB everywhere).
  std::unique_ptr<storage::EngineStorage> Map(int r) {
    const std::string name = absl::StrCat("/refit-host-device-test-", getpid(), "-", counter_++);
    uint64_t total = 0;
    for (const storage::ParamInfo& p : params_[r]) total += p.nbytes;
    regions_.push_back(*storage::ShmRegion::Create(name, total));
    std::memset(regions_.back()->data(), 0xAB, total);
    std::vector<storage::ShmParam> shm;
    uint64_t off = 0;
    for (const storage::ParamInfo& p : params_[r]) {
      shm.push_back({p, name, off});
      off += p.nbytes;
    }
    return *storage::ShmEngineStorage::Open(shm);
  }

  // Begins the session and sends each bucket of `inputs`.
  bool Send(const std::vector<Input>& inputs) {
    Manifest m;
    m.model = "m";
    int buckets = 0;
    for (const Input& in : inputs) {
      m.tensors.push_back({in.name, DType::kBF16, in.shape, 0, *DenseBytes(DType::kBF16, in.shape)});
      buckets = std::max(buckets, in.bucket + 1);
    }
    absl::StatusOr<BeginResult> begun = node_->Begin(m, absl::Now());
    EXPECT_TRUE(begun.ok()) << begun.status();
    if (!begun.ok()) return false;
    session_ = begun->session_id;
    payloads_.assign(static_cast<size_t>(buckets), {});
    for (int b = 0; b < buckets; ++b) {
      BucketHeader h;
      h.seq = static_cast<uint32_t>(b);
      std::vector<uint8_t>& p = payloads_[static_cast<size_t>(b)];
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].bucket != b) continue;
        const std::vector<uint8_t> bytes = Bf16(inputs[i].shape, inputs[i].scale, static_cast<uint32_t>(i + 1));
        p.resize((p.size() + 255) & ~size_t{255});
        h.tensors.push_back({inputs[i].name, DType::kBF16, inputs[i].shape, p.size(), bytes.size()});
        p.insert(p.end(), bytes.begin(), bytes.end());
      }
      h.nbytes = p.size();
      h.checksum = Checksum64(p.data(), p.size());
      receiver_->Put(Session::Tag(session_, static_cast<uint32_t>(b)), &p);
      absl::StatusOr<uint32_t> seq = node_->Announce(session_, h);
      EXPECT_TRUE(seq.ok()) << seq.status();
      if (!seq.ok()) return false;
    }
    return true;
  }

  // What the offline converter leaves in each rank's engine for `inputs` under `yaml`.
  static EngineBytes Offline(const std::string& yaml, const std::vector<Input>& inputs) {
    const spec::ModelSpec spec = *spec::ParseModelSpec(yaml);
    std::vector<std::vector<uint8_t>> data;
    for (size_t i = 0; i < inputs.size(); ++i) {
      data.push_back(Bf16(inputs[i].shape, inputs[i].scale, static_cast<uint32_t>(i + 1)));
    }
    EngineBytes out;
    for (int r = 0; r < std::max(1, spec.tp_size); ++r) {
      const spec::ModelSpec rank = spec.tp_size > 1 ? *spec::ForRank(spec, r) : spec;
      std::vector<InputTensor> in;
      std::vector<storage::ParamInfo> infos;
      for (size_t i = 0; i < inputs.size(); ++i) {
        in.push_back({inputs[i].name, DType::kBF16, inputs[i].shape, data[i].data()});
        infos.push_back({inputs[i].name, DType::kBF16, inputs[i].shape, data[i].size()});
      }
      absl::StatusOr<std::vector<ConvertedTensor>> converted = ConvertCheckpoint(rank, in);
      EXPECT_TRUE(converted.ok()) << converted.status();
      if (!converted.ok()) return {};
      std::map<std::string, const ConvertedTensor*> by_name;
      for (const ConvertedTensor& c : *converted) by_name[c.name] = &c;
      absl::StatusOr<std::vector<ConvertedTensor>> layout = EngineLayout(rank, infos, by_name);
      EXPECT_TRUE(layout.ok()) << layout.status();
      if (!layout.ok()) return {};
      out.emplace_back();
      for (ConvertedTensor& c : *layout) out.back()[c.name] = std::move(c.bytes);
    }
    return out;
  }

  // The device path, batched and not, against the CPU path and the offline converter.
  void ExpectDevicePathAsCpu(const std::string& yaml, const std::vector<Input>& inputs) {
    const EngineBytes offline = Offline(yaml, inputs);
    const EngineBytes cpu = Refit(yaml, inputs, Path::kCpu);
    ASSERT_FALSE(offline.empty());
    ASSERT_EQ(cpu.size(), offline.size());
    for (size_t r = 0; r < cpu.size(); ++r) {
      ASSERT_FALSE(offline[r].empty());
      EXPECT_EQ(cpu[r].size(), offline[r].size()) << "rank " << r;
      for (const auto& [name, bytes] : offline[r]) {
        EXPECT_EQ(cpu[r].at(name), bytes) << "cpu path, rank " << r << ": " << name;
      }
    }
    for (Path path : {Path::kDeviceBatched, Path::kDeviceUnbatched}) {
      const EngineBytes device = Refit(yaml, inputs, path);
      ASSERT_EQ(device.size(), cpu.size()) << PathName(path);
      for (size_t r = 0; r < cpu.size(); ++r) {
        for (const auto& [name, bytes] : cpu[r]) {
          EXPECT_EQ(device[r].at(name), bytes) << PathName(path) << ", rank " << r << ": " << name;
        }
      }
      stats_.push_back({converter_->stats().groups_batched.load(), converter_->stats().groups_declined.load(),
                        converter_->stats().amax_resets.load(), converter_->stats().planned.load(), held_peak_bytes_});
    }
  }

  struct PathStats {
    int batched, declined, resets, planned;
    uint64_t held_peak_bytes;
  };

  static inline int counter_ = 0;
  spec::ModelSpec spec_;
  std::unique_ptr<storage::Memory> ring_memory_;
  std::unique_ptr<BucketRing> ring_;
  std::unique_ptr<transport::MemoryReceiver> receiver_;
  std::vector<std::unique_ptr<storage::ShmRegion>> regions_;
  std::vector<std::vector<storage::ParamInfo>> params_;
  std::unique_ptr<Node> node_;                // after what it uses
  HostDeviceConverter* converter_ = nullptr;  // the engine's, on the device path
  uint64_t session_ = 0;
  std::vector<std::vector<uint8_t>> payloads_;
  uint64_t held_peak_bytes_ = 0;
  std::vector<PathStats> stats_;  // per device path run: batched, then not
};

// Two fused NVFP4 groups (gate/up with its block scales swizzled, q/k/v) and an unfused tensor.
constexpr char kFused[] = R"(model: m
rules:
  - match: "l.{L}.{p:gate,up}.weight"
    target: "l.{L}.gate_up.weight"
    format: nvfp4
    fuse: {capture: p, order: [gate, up]}
    layout:
      - {op: swizzle_128x4, on: _scale}
  - match: "l.{L}.{p:q,k,v}.weight"
    target: "l.{L}.qkv.weight"
    format: nvfp4
    fuse: {capture: p, order: [q, k, v]}
  - match: "l.{L}.down.weight"
    format: nvfp4
)";

std::vector<Input> FusedInputs(bool split) {
  // Split: each group's members straddle the two buckets (the first bucket's are held).
  const int second = split ? 1 : 0;
  return {{"l.0.gate.weight", {128, 64}, 1.0f, 0},  {"l.0.up.weight", {128, 64}, 3.0f, second},
          {"l.0.q.weight", {64, 64}, 0.5f, 0},      {"l.0.k.weight", {32, 64}, 2.0f, second},
          {"l.0.v.weight", {32, 64}, 1.5f, second}, {"l.0.down.weight", {64, 128}, 2.0f, 0}};
}

TEST_F(HostDeviceStagingTest, FusedGroupsInOneBucketStageAsOnTheCpu) {
  ExpectDevicePathAsCpu(kFused, FusedInputs(false));
  ASSERT_EQ(stats_.size(), 2u);
  // Batched: both groups converted by the converter's group run, no amax pass of the session's.
  EXPECT_EQ(stats_[0].batched, 2);
  EXPECT_EQ(stats_[0].resets, 0);
  // Not batched: each group's amax in a device float, each member converted against it.
  EXPECT_EQ(stats_[1].batched, 0);
  EXPECT_EQ(stats_[1].declined, 2);
  EXPECT_EQ(stats_[1].resets, 2);
  EXPECT_EQ(stats_[1].planned, 5);
  for (const PathStats& s : stats_) EXPECT_EQ(s.held_peak_bytes, 0u);
}

TEST_F(HostDeviceStagingTest, FusedGroupsSplitAcrossBucketsAreHeldAndStageAsOnTheCpu) {
  ExpectDevicePathAsCpu(kFused, FusedInputs(true));
  ASSERT_EQ(stats_.size(), 2u);
  // gate and q were held on "the device" over the bucket's end; held members are device tensors,
  // so the batched run still takes their groups.
  EXPECT_EQ(stats_[0].batched, 2);
  EXPECT_EQ(stats_[1].resets, 2);
  for (const PathStats& s : stats_) EXPECT_EQ(s.held_peak_bytes, (128 * 64 + 64 * 64) * 2u);
}

// Two engine ranks: gate/up column-parallel (each rank its rows of both), q/k/v replicated
// (both ranks share its parts, staged once), down row-parallel.
constexpr char kTp2[] = R"(model: m
tensor_parallel: {size: 2}
rules:
  - match: "l.{L}.{p:gate,up}.weight"
    target: "l.{L}.gate_up.weight"
    format: nvfp4
    fuse: {capture: p, order: [gate, up]}
    shard: {dim: 0}
  - match: "l.{L}.{p:q,k,v}.weight"
    target: "l.{L}.qkv.weight"
    format: nvfp4
    fuse: {capture: p, order: [q, k, v]}
  - match: "l.{L}.down.weight"
    format: nvfp4
    shard: {dim: 1}
)";

TEST_F(HostDeviceStagingTest, TwoRanksStageTheirPartsOfAFusedGroupAsOnTheCpu) {
  // The member that arrives first has the larger max|x|: the group's amax is not the last member's.
  const std::vector<Input> inputs = {{"l.0.gate.weight", {128, 64}, 3.0f, 0}, {"l.0.up.weight", {128, 64}, 1.0f, 1},
                                     {"l.0.q.weight", {64, 64}, 2.0f, 0},     {"l.0.k.weight", {32, 64}, 0.5f, 1},
                                     {"l.0.v.weight", {32, 64}, 1.0f, 1},     {"l.0.down.weight", {64, 128}, 2.0f, 0}};
  ExpectDevicePathAsCpu(kTp2, inputs);
  ASSERT_EQ(stats_.size(), 2u);
  // The sharded gate/up takes the session's amax pass and each member's distinct parts through
  // the device ops' whole plan; the shared q/k/v lands whole, so it takes the batched run when
  // the converter has one.
  EXPECT_EQ(stats_[0].batched, 1);
  EXPECT_EQ(stats_[0].resets, 1);
  EXPECT_EQ(stats_[1].batched, 0);
  EXPECT_EQ(stats_[1].resets, 2);
  for (const PathStats& s : stats_) EXPECT_GE(s.planned, 2);
}

// Two ranks of two experts each: each rank holds its experts' fused gate/up whole.
constexpr char kMoeEp2[] = R"(model: m
tensor_parallel: {size: 2}
expert_parallel: {size: 2}
rules:
  - match: "e.{E}.{p:gate,up}.weight"
    target: "experts.w13"
    format: nvfp4
    fuse: {capture: p, order: [gate, up]}
    stack: {capture: E, count: 4}
    layout:
      - {op: swizzle_128x4, on: _scale}
  - match: "attn"
    format: nvfp4
    shard: {dim: 0}
)";

TEST_F(HostDeviceStagingTest, ExpertParallelRanksStageTheirExpertsFusedGroupsAsOnTheCpu) {
  std::vector<Input> inputs;
  for (int e = 0; e < 4; ++e) {
    inputs.push_back({absl::StrCat("e.", e, ".gate.weight"), {64, 64}, 1.0f + e, e % 2});
    inputs.push_back({absl::StrCat("e.", e, ".up.weight"), {64, 64}, 4.0f - e, 0});
  }
  inputs.push_back({"attn", {64, 64}, 1.0f, 1});
  ExpectDevicePathAsCpu(kMoeEp2, inputs);
  ASSERT_EQ(stats_.size(), 2u);
  // Each expert's gate/up lands whole on its rank: the batched run takes the group, as on one rank.
  EXPECT_EQ(stats_[0].batched, 4);
  EXPECT_EQ(stats_[0].resets, 0);
  EXPECT_EQ(stats_[1].batched, 0);
  EXPECT_EQ(stats_[1].resets, 4) << "one amax pass per expert's gate/up";
}

}  // namespace
}  // namespace refit
