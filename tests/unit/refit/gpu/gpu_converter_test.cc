// The GPU converter on buckets shaped like a MoE refit: every output byte of every tensor equals
// the CPU reference converter (formats::Quantize, memcpy), whether the tensor went through a
// batched run or the single-tensor path; a NaN in the middle of a run fails exactly that tensor,
// named, at its first bad flat index; the stats prove the batched paths ran.
#include "refit/gpu/gpu_converter.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "refit/convert.h"
#include "refit/cpu_converter.h"
#include "tests/unit/kernels/device_test_util.h"
#include "tests/unit/kernels/test_values.h"

namespace refit {
namespace {

using formats::Format;
using kernels::testing::DeviceBuffer;
using ::testing::HasSubstr;

struct Spec {
  std::string name;
  Shape shape;
  ConvertKind kind;
  Format format = Format::kBf16;
  std::vector<float> values;
  DType dtype = DType::kBF16;
};

// One received bucket: the tensors packed 16-byte aligned in one buffer (device, as an NCCL ring
// slot, or pinned host, as a UCX slot), device outputs per tensor, and the CPU reference outputs.
class Bucket {
 public:
  Bucket(std::vector<Spec> specs, storage::MemoryKind kind, const formats::QuantizeOptions& options)
      : specs_(std::move(specs)), kind_(kind), options_(options) {
    uint64_t offset = 0;
    for (Spec& s : specs_) {
      TensorDesc d;
      d.name = s.name;
      d.dtype = s.dtype;
      d.shape = s.shape;
      d.offset = offset;
      d.nbytes = *DenseBytes(s.dtype, s.shape);
      offset = (offset + d.nbytes + 15) & ~uint64_t{15};
      descs_.push_back(d);
    }
    host_.assign(offset + 16, 0);
    for (size_t i = 0; i < specs_.size(); ++i) {
      std::vector<uint8_t> bytes = kernels::testing::Encode(specs_[i].values, specs_[i].dtype);
      std::memcpy(host_.data() + descs_[i].offset, bytes.data(), bytes.size());
    }
    if (kind_ == storage::MemoryKind::kDevice) {
      device_ = std::make_unique<DeviceBuffer>(host_.size());
      device_->Upload(host_.data(), host_.size());
    } else {
      EXPECT_EQ(cudaMallocHost(&pinned_, host_.size()), cudaSuccess);
      std::memcpy(pinned_, host_.data(), host_.size());
    }
  }
  ~Bucket() {
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
  }

  // Converts every tensor, then Syncs; returns the failures.
  std::vector<std::pair<std::string, absl::Status>> Convert(Converter& converter) {
    Prepare();
    Issue(converter);
    return converter.Sync();
  }

  // Allocates the (poisoned) outputs.
  void Prepare() {
    outs_.clear();
    outs_bytes_.assign(specs_.size(), {});
    for (size_t i = 0; i < specs_.size(); ++i) {
      std::vector<std::unique_ptr<DeviceBuffer>> bufs;
      for (uint64_t b : OutputBytes(i)) {
        bufs.push_back(std::make_unique<DeviceBuffer>(b));
        outs_bytes_[i].push_back({bufs.back()->get(), b});
      }
      outs_.push_back(std::move(bufs));
    }
    // The poison memsets ran on the legacy stream, which the converter's stream does not wait for.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // Issues every tensor's conversion into the prepared outputs.
  void Issue(Converter& converter) {
    const uint8_t* base = kind_ == storage::MemoryKind::kDevice ? static_cast<const uint8_t*>(device_->get())
                                                                  : static_cast<const uint8_t*>(pinned_);
    for (size_t i = 0; i < specs_.size(); ++i) {
      absl::Status st = converter.Convert(Plan(i), descs_[i], base + descs_[i].offset, kind_, outs_bytes_[i], options_);
      EXPECT_TRUE(st.ok()) << specs_[i].name << ": " << st;
    }
  }

  // Every output byte of tensor i against the CPU converter.
  void ExpectMatchesCpu(size_t i) {
    CpuConverter cpu;
    std::vector<std::vector<uint8_t>> want;
    std::vector<formats::MutableBytes> outs;
    for (uint64_t b : OutputBytes(i)) want.emplace_back(b, 0x5A);
    for (auto& w : want) outs.push_back({w.data(), w.size()});
    absl::Status st = cpu.Convert(Plan(i), descs_[i], host_.data() + descs_[i].offset, storage::MemoryKind::kHost, outs,
                                  options_);
    ASSERT_TRUE(st.ok()) << st;
    for (size_t p = 0; p < want.size(); ++p) {
      std::vector<uint8_t> got = outs_[i][p]->Download(want[p].size());
      size_t bad = 0, first = 0;
      for (size_t b = 0; b < got.size(); ++b) {
        if (got[b] != want[p][b] && bad++ == 0) first = b;
      }
      EXPECT_EQ(bad, 0u) << specs_[i].name << ShapeString(specs_[i].shape) << " output " << p << ": " << bad << " of "
                         << got.size() << " bytes differ from the CPU reference, first at " << first;
    }
  }

  size_t size() const { return specs_.size(); }
  const std::string& name(size_t i) const { return specs_[i].name; }

 private:
  TensorPlan Plan(size_t i) const {
    TensorPlan plan;
    plan.kind = specs_[i].kind;
    plan.format = specs_[i].format;
    plan.input_shape = specs_[i].shape;
    return plan;
  }
  std::vector<uint64_t> OutputBytes(size_t i) const {
    if (specs_[i].kind == ConvertKind::kCopy) return {descs_[i].nbytes};
    std::vector<uint64_t> bytes;
    absl::StatusOr<std::vector<formats::OutputSpec>> plan =
        formats::PlanOutputs(specs_[i].format, specs_[i].dtype, specs_[i].shape);
    EXPECT_TRUE(plan.ok()) << specs_[i].name << ": " << plan.status();
    if (!plan.ok()) return bytes;
    for (const formats::OutputSpec& o : *plan) bytes.push_back(o.bytes);
    return bytes;
  }

  std::vector<Spec> specs_;
  storage::MemoryKind kind_;
  formats::QuantizeOptions options_;
  std::vector<TensorDesc> descs_;
  std::vector<uint8_t> host_;
  std::unique_ptr<DeviceBuffer> device_;
  void* pinned_ = nullptr;
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> outs_;
  std::vector<std::vector<formats::MutableBytes>> outs_bytes_;
};

uint64_t FreshSeed() {
  static const uint64_t base = std::random_device{}();
  static uint64_t counter = 0;
  return base + 7919 * counter++;
}

std::vector<float> Values(const Shape& s, std::mt19937_64& rng, float stddev) {
  return kernels::testing::RandomValues(*NumElements(s), rng, stddev);
}

// A layer of a MoE refit in bucket order: norms and attention (copies, one big), the router, then
// experts {gate, up} [48, 64] and down [64, 48] to NVFP4, one expert in the edge-value mix, an
// nvfp4_te tensor, an FP8 block-128 tensor (single-tensor path) and a tail norm.
std::vector<Spec> MoeLayer(std::mt19937_64& rng, int experts) {
  std::vector<Spec> s;
  s.push_back({"l.input_layernorm.weight", {64}, ConvertKind::kCopy, Format::kBf16, Values({64}, rng, 1.0f)});
  s.push_back({"l.q_proj.weight", {256, 64}, ConvertKind::kCopy, Format::kBf16, Values({256, 64}, rng, 0.02f)});
  s.push_back({"l.k_proj.weight", {16, 64}, ConvertKind::kCopy, Format::kBf16, Values({16, 64}, rng, 0.02f)});
  s.push_back({"l.router.weight", {8, 64}, ConvertKind::kCopy, Format::kBf16, Values({8, 64}, rng, 0.02f)});
  for (int e = 0; e < experts; ++e) {
    const std::string p = "l.experts." + std::to_string(e) + ".";
    const float sd = 0.01f + 0.002f * e;
    s.push_back({p + "gate_proj.weight", {48, 64}, ConvertKind::kQuantize, Format::kNvfp4, Values({48, 64}, rng, sd)});
    s.push_back({p + "up_proj.weight", {48, 64}, ConvertKind::kQuantize, Format::kNvfp4,
                 e == 1 ? kernels::testing::EdgeValues(48 * 64, rng) : Values({48, 64}, rng, sd)});
    s.push_back({p + "down_proj.weight", {64, 48}, ConvertKind::kQuantize, Format::kNvfp4, Values({64, 48}, rng, sd)});
  }
  s.push_back({"l.shared.weight", {32, 64}, ConvertKind::kQuantize, Format::kNvfp4Te, Values({32, 64}, rng, 0.03f)});
  s.push_back({"l.o_proj.weight", {128, 256}, ConvertKind::kQuantize, Format::kFp8Block128,
               Values({128, 256}, rng, 0.02f)});
  s.push_back({"l.post_attention_layernorm.weight", {64}, ConvertKind::kCopy, Format::kBf16, Values({64}, rng, 1.0f)});
  return s;
}

class GpuConverterTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_GPU(); }

  std::unique_ptr<Converter> Make(GpuConverterOptions options) {
    options.stats = &stats_;
    auto c = NewGpuConverter(0, options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  GpuConverterStats stats_;
};

TEST_F(GpuConverterTest, MoeBucketMatchesCpuReference) {
  for (auto kind : {storage::MemoryKind::kDevice, storage::MemoryKind::kHost}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE("seed=" + std::to_string(seed) + (kind == storage::MemoryKind::kHost ? " host slot" : " device slot"));
    std::mt19937_64 rng(seed);
    stats_ = {};
    GpuConverterOptions options;
    options.max_batched_copy_bytes = 16 * 1024;  // q_proj (32 KiB) takes cudaMemcpyAsync
    options.max_nvfp4_run_bytes = 4 * 48 * 64 * 2;  // runs of 4 experts' tensors
    std::unique_ptr<Converter> converter = Make(options);
    ASSERT_NE(converter, nullptr);
    Bucket bucket(MoeLayer(rng, 6), kind, {});
    auto failed = bucket.Convert(*converter);
    for (const auto& [name, st] : failed) ADD_FAILURE() << name << ": " << st;
    for (size_t i = 0; i < bucket.size(); ++i) bucket.ExpectMatchesCpu(i);
    // 18 expert tensors and the nvfp4_te one: batched (NVFP4 runs of at most 4); small copies
    // batched only from device slots (host slots copy straight to staging).
    EXPECT_EQ(stats_.tensors, bucket.size());
    EXPECT_EQ(stats_.batched_nvfp4, 19u);
    EXPECT_GE(stats_.runs, 6u);
    EXPECT_EQ(stats_.batched_copies, kind == storage::MemoryKind::kDevice ? 4u : 0u);
    EXPECT_EQ(stats_.drains, 0u);
  }
}

// Warm (a refit begins) from another thread while a bucket converts, as refitd's event loop may
// while an ended session's threads finish: the bucket's bytes are unchanged.
TEST_F(GpuConverterTest, WarmFromAnotherThreadDuringABucketChangesNothing) {
  std::mt19937_64 rng(FreshSeed());
  std::unique_ptr<Converter> converter = Make({});
  ASSERT_NE(converter, nullptr);
  converter->Warm();  // before any bucket
  Bucket bucket(MoeLayer(rng, 3), storage::MemoryKind::kDevice, {});
  std::atomic<bool> stop{false};
  std::atomic<int> warmed{0};
  std::thread warmer([&] {
    while (!stop.load()) {
      converter->Warm();
      ++warmed;
    }
  });
  // The warmer is running when the bucket starts (a fast GPU converts it before a thread that
  // only starts now would call Warm once), and keeps warming until the bucket is done.
  while (warmed.load() == 0) std::this_thread::yield();
  auto failed = bucket.Convert(*converter);
  stop = true;
  warmer.join();
  EXPECT_THAT(failed, ::testing::IsEmpty());
  for (size_t i = 0; i < bucket.size(); ++i) bucket.ExpectMatchesCpu(i);
}

TEST_F(GpuConverterTest, BatchingOffGivesTheSameBytes) {
  std::mt19937_64 rng(FreshSeed());
  GpuConverterOptions options;
  options.batch = false;
  std::unique_ptr<Converter> converter = Make(options);
  ASSERT_NE(converter, nullptr);
  Bucket bucket(MoeLayer(rng, 3), storage::MemoryKind::kDevice, {});
  EXPECT_THAT(bucket.Convert(*converter), ::testing::IsEmpty());
  for (size_t i = 0; i < bucket.size(); ++i) bucket.ExpectMatchesCpu(i);
  EXPECT_EQ(stats_.batched_nvfp4 + stats_.batched_copies + stats_.runs, 0u);
}

// A NaN in the middle expert of a run, under nonfinite: reject: that tensor fails, named, at its
// first bad flat index; its neighbours in the run are converted correctly; the next bucket on the
// same converter starts clean.
TEST_F(GpuConverterTest, NanInTheMiddleOfARunNamesThatTensor) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::unique_ptr<Converter> converter = Make({});
  ASSERT_NE(converter, nullptr);
  std::vector<Spec> specs = MoeLayer(rng, 3);
  size_t bad = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == "l.experts.1.gate_proj.weight") {
      bad = i;
      specs[i].values[1234] = std::numeric_limits<float>::quiet_NaN();
      specs[i].values[2000] = -std::numeric_limits<float>::infinity();
    }
  }
  ASSERT_GT(bad, 0u);
  Bucket bucket(specs, storage::MemoryKind::kDevice, {});
  auto failed = bucket.Convert(*converter);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].first, "l.experts.1.gate_proj.weight");
  EXPECT_EQ(failed[0].second.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(failed[0].second.message(), HasSubstr("l.experts.1.gate_proj.weight"));
  EXPECT_THAT(failed[0].second.message(), HasSubstr("non-finite value (NaN or Inf) at flat index 1234"));
  EXPECT_GE(stats_.batched_nvfp4, 9u);  // the NaN tensor sat inside a batched run
  for (size_t i = 0; i < bucket.size(); ++i) {
    if (i != bad) bucket.ExpectMatchesCpu(i);
  }
  // The next bucket's probe words were reset.
  Bucket clean(MoeLayer(rng, 3), storage::MemoryKind::kDevice, {});
  EXPECT_THAT(clean.Convert(*converter), ::testing::IsEmpty());
  for (size_t i = 0; i < clean.size(); ++i) clean.ExpectMatchesCpu(i);
}

// Fewer slots than tensors: the converter drains mid-bucket (reading the probe words so far),
// grows, and goes on; a NaN before and one after the drain are both reported.
TEST_F(GpuConverterTest, DrainsWhenSlotsRunOut) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  GpuConverterOptions options;
  options.initial_slots = 4;
  options.max_run_tensors = 3;
  std::unique_ptr<Converter> converter = Make(options);
  ASSERT_NE(converter, nullptr);
  std::vector<Spec> specs = MoeLayer(rng, 5);
  for (Spec& s : specs) {
    if (s.name == "l.experts.0.up_proj.weight") s.values[17] = std::numeric_limits<float>::infinity();
    if (s.name == "l.experts.4.down_proj.weight") s.values[3071] = std::numeric_limits<float>::quiet_NaN();
  }
  Bucket bucket(specs, storage::MemoryKind::kDevice, {});
  auto failed = bucket.Convert(*converter);
  EXPECT_GE(stats_.drains, 1u);
  std::vector<std::string> names;
  for (const auto& [name, st] : failed) names.push_back(std::string(st.message()));
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(
                         "tensor l.experts.0.up_proj.weight: non-finite value (NaN or Inf) at flat index 17",
                         "tensor l.experts.4.down_proj.weight: non-finite value (NaN or Inf) at flat index 3071"));
  for (size_t i = 0; i < bucket.size(); ++i) {
    if (specs[i].name != "l.experts.0.up_proj.weight" && specs[i].name != "l.experts.4.down_proj.weight") {
      bucket.ExpectMatchesCpu(i);
    }
  }
}

// Under nonfinite: propagate no probe word is used: batched runs carry none, and a NaN in a
// single-path tensor (FP8 block-128, whose NaN encoding matches the reference) is not reported.
TEST_F(GpuConverterTest, PropagatePolicyMatchesCpuReference) {
  std::mt19937_64 rng(FreshSeed());
  std::unique_ptr<Converter> converter = Make({});
  ASSERT_NE(converter, nullptr);
  std::vector<Spec> specs = MoeLayer(rng, 3);
  for (Spec& s : specs) {
    if (s.name == "l.o_proj.weight") s.values[99] = std::numeric_limits<float>::quiet_NaN();
  }
  const formats::QuantizeOptions propagate{formats::Fp32InputPolicy::kExact, formats::NonfinitePolicy::kPropagate};
  Bucket bucket(specs, storage::MemoryKind::kDevice, propagate);
  EXPECT_THAT(bucket.Convert(*converter), ::testing::IsEmpty());
  for (size_t i = 0; i < bucket.size(); ++i) bucket.ExpectMatchesCpu(i);
  EXPECT_GE(stats_.batched_nvfp4, 9u);
}

// Buckets in flight (EndBucket, then the next bucket's conversions before WaitBucket): each
// bucket's failures come back with its own ticket, named; every output equals the CPU reference,
// from device slots and from host slots (whose scratch regions the buckets in flight share).
TEST_F(GpuConverterTest, BucketsInFlightReportTheirOwnFailures) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::unique_ptr<Converter> converter = Make({});
  ASSERT_NE(converter, nullptr);
  auto with_nan = [&](const std::string& name, size_t index) {
    std::vector<Spec> specs = MoeLayer(rng, 4);
    for (Spec& s : specs) {
      if (s.name == name) s.values[index] = std::numeric_limits<float>::quiet_NaN();
    }
    return specs;
  };
  Bucket a(with_nan("l.experts.1.gate_proj.weight", 5), storage::MemoryKind::kDevice, {});
  Bucket b(with_nan("l.o_proj.weight", 77), storage::MemoryKind::kHost, {});
  Bucket c(with_nan("l.experts.3.down_proj.weight", 300), storage::MemoryKind::kHost, {});
  a.Prepare();
  b.Prepare();
  c.Prepare();
  auto messages = [](const std::vector<std::pair<std::string, absl::Status>>& failed) {
    std::vector<std::string> m;
    for (const auto& [name, st] : failed) m.push_back(std::string(st.message()));
    return m;
  };
  a.Issue(*converter);
  const uint64_t ta = converter->EndBucket();
  b.Issue(*converter);
  const uint64_t tb = converter->EndBucket();
  EXPECT_THAT(messages(converter->WaitBucket(ta)),
              ::testing::ElementsAre("tensor l.experts.1.gate_proj.weight: non-finite value (NaN or Inf) at flat index 5"));
  c.Issue(*converter);  // behind b, whose scratch it must not overwrite
  const uint64_t tc = converter->EndBucket();
  EXPECT_THAT(messages(converter->WaitBucket(tb)),
              ::testing::ElementsAre("tensor l.o_proj.weight: non-finite value (NaN or Inf) at flat index 77"));
  EXPECT_THAT(messages(converter->WaitBucket(tc)),
              ::testing::ElementsAre("tensor l.experts.3.down_proj.weight: non-finite value (NaN or Inf) at flat index 300"));
  EXPECT_TRUE(converter->BucketDone(tc));
  EXPECT_THAT(converter->Sync(), ::testing::IsEmpty());
  for (Bucket* bucket : {&a, &b, &c}) {
    for (size_t i = 0; i < bucket->size(); ++i) {
      const std::string& name = bucket->name(i);
      if (name != "l.experts.1.gate_proj.weight" && name != "l.o_proj.weight" && name != "l.experts.3.down_proj.weight") {
        bucket->ExpectMatchesCpu(i);
      }
    }
  }
}

// Fused NVFP4 groups (gate/up, q/k/v) through ConvertAmaxGroup, interleaved with single experts in
// the same runs: every member's bytes equal the CPU reference encoded against the group's amax
// (max of the members' TensorAmax); a group whose input is not 16-byte aligned is refused with
// nothing enqueued (false), for the caller's path.
TEST_F(GpuConverterTest, AmaxGroupsInBatchedRunsMatchTheCpuGroupEncode) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  GpuConverterOptions options;
  options.max_nvfp4_run_bytes = 5 * 48 * 64 * 2;  // runs of about five tensors: groups cross the limit
  std::unique_ptr<Converter> converter = Make(options);
  ASSERT_NE(converter, nullptr);
  DeviceOps* ops = converter->device_ops();
  ASSERT_NE(ops, nullptr);
  const formats::QuantizeOptions qopts;
  struct Member {
    TensorDesc desc;
    std::vector<uint8_t> in;
    std::unique_ptr<DeviceBuffer> dev;
    std::vector<std::unique_ptr<DeviceBuffer>> outs;
    std::vector<formats::MutableBytes> out_bytes;
  };
  // Groups of 2 (gate/up) and 3 (q/k/v), one with edge values, each followed by a lone tensor.
  std::vector<std::vector<Member>> groups;
  std::vector<Member> lone;
  auto make = [&](const std::string& name, const Shape& shape, std::vector<float> values) {
    Member m;
    m.in = kernels::testing::Encode(values, DType::kBF16);
    m.desc = TensorDesc{name, DType::kBF16, shape, 0, m.in.size()};
    m.dev = std::make_unique<DeviceBuffer>(m.in.size() + 16);
    m.dev->Upload(m.in.data(), m.in.size());
    const absl::StatusOr<std::vector<formats::OutputSpec>> planned =
        formats::PlanOutputs(Format::kNvfp4, DType::kBF16, shape);
    EXPECT_TRUE(planned.ok()) << planned.status();
    for (const formats::OutputSpec& o : planned.value_or(std::vector<formats::OutputSpec>{})) {
      m.outs.push_back(std::make_unique<DeviceBuffer>(o.bytes));
      m.out_bytes.push_back({m.outs.back()->get(), o.bytes});
    }
    return m;
  };
  for (int g = 0; g < 8; ++g) {
    std::vector<Member> group;
    const int n = g % 3 == 2 ? 3 : 2;
    for (int k = 0; k < n; ++k) {
      const Shape shape{static_cast<int64_t>(16 * (k + 2)), 64};
      group.push_back(make(absl::StrCat("g", g, ".m", k), shape,
                           g == 1 && k == 1 ? kernels::testing::EdgeValues(*NumElements(shape), rng)
                                            : Values(shape, rng, 0.01f * (k + 1 + g))));
    }
    groups.push_back(std::move(group));
    lone.push_back(make(absl::StrCat("lone", g), {48, 64}, Values({48, 64}, rng, 0.02f)));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  TensorPlan plan;
  plan.kind = ConvertKind::kQuantize;
  plan.format = Format::kNvfp4;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<DeviceOps::GroupMember> members;
    for (Member& m : groups[g]) members.push_back({&m.desc, static_cast<const uint8_t*>(m.dev->get()), m.out_bytes});
    absl::StatusOr<bool> batched = ops->ConvertAmaxGroup(Format::kNvfp4, members, qopts);
    ASSERT_TRUE(batched.ok()) << batched.status();
    EXPECT_TRUE(*batched) << "group " << g;
    Member& l = lone[g];
    plan.input_shape = l.desc.shape;
    ASSERT_TRUE(converter
                    ->Convert(plan, l.desc, static_cast<const uint8_t*>(l.dev->get()), storage::MemoryKind::kDevice,
                              l.out_bytes, qopts)
                    .ok());
  }
  EXPECT_THAT(converter->Sync(), ::testing::IsEmpty());
  EXPECT_EQ(stats_.grouped, 2u * 8 + 2);  // eight groups of two, and groups 2 and 5 have a third member
  EXPECT_EQ(stats_.batched_nvfp4, stats_.grouped + lone.size());
  auto expect_cpu = [&](const Member& m, std::optional<float> amax) {
    std::vector<std::vector<uint8_t>> want;
    std::vector<formats::MutableBytes> outs;
    for (const formats::MutableBytes& o : m.out_bytes) want.emplace_back(o.bytes, 0);
    for (auto& w : want) outs.push_back({w.data(), w.size()});
    const ConvertStep step{ConvertKind::kQuantize, Format::kNvfp4, false};
    ASSERT_TRUE(ConvertFull(step, {DType::kBF16, m.desc.shape, m.in.data()}, qopts, amax, outs, m.desc.name).ok());
    for (size_t p = 0; p < want.size(); ++p) {
      EXPECT_TRUE(m.outs[p]->Download(want[p].size()) == want[p]) << m.desc.name << " output " << p;
    }
  };
  for (const auto& group : groups) {
    float a = 0;
    for (const Member& m : group) a = std::max(a, *TensorAmax({DType::kBF16, m.desc.shape, m.in.data()}, qopts, ""));
    for (const Member& m : group) expect_cpu(m, a);
  }
  for (const Member& m : lone) expect_cpu(m, std::nullopt);
  // Misaligned input: not taken, nothing counted.
  Member odd = make("odd", {32, 64}, Values({32, 64}, rng, 0.02f));
  std::vector<DeviceOps::GroupMember> members{
      {&groups[0][0].desc, static_cast<const uint8_t*>(groups[0][0].dev->get()), groups[0][0].out_bytes},
      {&odd.desc, static_cast<const uint8_t*>(odd.dev->get()) + 2, odd.out_bytes}};
  const uint64_t grouped = stats_.grouped;
  absl::StatusOr<bool> batched = ops->ConvertAmaxGroup(Format::kNvfp4, members, qopts);
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_FALSE(*batched);
  EXPECT_EQ(stats_.grouped, grouped);
  EXPECT_THAT(converter->Sync(), ::testing::IsEmpty());
}

// CopyMany: a stacked parameter's pieces assembled in one launch, each where it belongs.
TEST_F(GpuConverterTest, CopyManyAssemblesPieces) {
  std::unique_ptr<Converter> converter = Make({});
  ASSERT_NE(converter, nullptr);
  DeviceOps* ops = converter->device_ops();
  ASSERT_NE(ops, nullptr);
  std::mt19937_64 rng(FreshSeed());
  const int pieces = 200;
  const uint64_t piece = 3000;  // not a multiple of 16: every other piece starts unaligned
  std::vector<uint8_t> host(pieces * piece);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  DeviceBuffer src(host.size()), dst(host.size());
  src.Upload(host.data(), host.size());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<DeviceOps::CopyRegion> regions;
  for (int i = 0; i < pieces; ++i) {  // piece i comes from slot (i * 7) % pieces of the source
    const uint64_t from = static_cast<uint64_t>((i * 7) % pieces) * piece;
    regions.push_back(
        {static_cast<uint8_t*>(dst.get()) + i * piece, static_cast<const uint8_t*>(src.get()) + from, piece});
  }
  ASSERT_TRUE(ops->CopyMany(regions).ok());
  ASSERT_TRUE(ops->Synchronize().ok());
  std::vector<uint8_t> got = dst.Download(host.size()), want(host.size());
  for (int i = 0; i < pieces; ++i) {
    std::memcpy(want.data() + i * piece, host.data() + static_cast<uint64_t>((i * 7) % pieces) * piece, piece);
  }
  EXPECT_TRUE(got == want);
}

// Whole device tensors go to two lanes (streams). A device op reading a tensor converted on the
// side lane waits for it, and a tensor converted on the side lane after a device op wrote its
// input waits for the op. Each race would show: the op copies the big tensor's last tiles, which
// its kernel writes last; the side lane's input is written by an op queued behind a long copy.
TEST_F(GpuConverterTest, DeviceOpsAreOrderedAgainstTheSideLane) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::unique_ptr<Converter> converter = Make({});
  ASSERT_NE(converter, nullptr);
  DeviceOps* ops = converter->device_ops();
  ASSERT_NE(ops, nullptr);
  const Shape small{128, 128}, big{4096, 8192};
  const std::vector<uint8_t> small_in = kernels::testing::Encode(Values(small, rng, 0.02f), DType::kBF16);
  const std::vector<uint8_t> big_in = kernels::testing::Encode(Values(big, rng, 0.02f), DType::kBF16);
  TensorPlan plan;
  plan.kind = ConvertKind::kQuantize;
  plan.format = Format::kFp8Block128;
  auto outputs = formats::PlanOutputs(Format::kFp8Block128, DType::kBF16, big);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const uint64_t q_bytes = (*outputs)[0].bytes, s_bytes = (*outputs)[1].bytes;
  std::vector<uint8_t> want_q(q_bytes), want_s(s_bytes);
  {
    CpuConverter cpu;
    TensorDesc d{"big", DType::kBF16, big, 0, big_in.size()};
    std::vector<formats::MutableBytes> outs{{want_q.data(), q_bytes}, {want_s.data(), s_bytes}};
    ASSERT_TRUE(cpu.Convert(plan, d, big_in.data(), storage::MemoryKind::kHost, outs, {}).ok());
  }
  DeviceBuffer in_small(small_in.size()), in_big(big_in.size()), staged_big(big_in.size()), busy(big_in.size());
  in_small.Upload(small_in.data(), small_in.size());
  in_big.Upload(big_in.data(), big_in.size());
  auto convert = [&](const char* name, const Shape& shape, const void* in, uint64_t bytes, DeviceBuffer& q,
                     DeviceBuffer& sc) {
    TensorDesc d{name, DType::kBF16, shape, 0, bytes};
    TensorPlan p = plan;
    p.input_shape = shape;
    auto o = formats::PlanOutputs(Format::kFp8Block128, DType::kBF16, shape);
    std::vector<formats::MutableBytes> outs{{q.get(), (*o)[0].bytes}, {sc.get(), (*o)[1].bytes}};
    absl::Status st = converter->Convert(p, d, static_cast<const uint8_t*>(in), storage::MemoryKind::kDevice, outs, {});
    EXPECT_TRUE(st.ok()) << name << ": " << st;
  };
  auto copy = [&](void* dst, const void* src, uint64_t bytes) {
    absl::Status st = ops->Copy(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes,
                                storage::MemoryKind::kDevice);
    EXPECT_TRUE(st.ok()) << st;
  };
  // A device op after a side-lane tensor reads that tensor's last tiles.
  const uint64_t tail = 1 << 20;
  DeviceBuffer q_small(small[0] * small[1]), s_small(4), q_big(q_bytes), s_big(s_bytes), copied(tail);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  convert("small", small, in_small.get(), small_in.size(), q_small, s_small);  // the main lane
  convert("big", big, in_big.get(), big_in.size(), q_big, s_big);              // the side lane
  copy(copied.get(), static_cast<const uint8_t*>(q_big.get()) + q_bytes - tail, tail);
  EXPECT_THAT(converter->Sync(), ::testing::IsEmpty());
  EXPECT_EQ(stats_.side_lane, 1u);
  EXPECT_TRUE(q_big.Download(q_bytes) == want_q) << "the side lane's tensor differs from the CPU reference";
  EXPECT_TRUE(copied.Download(tail) == std::vector<uint8_t>(want_q.end() - tail, want_q.end()))
      << "the device op read the side lane's output before it was written";
  // A side-lane tensor after a device op reads what the op wrote.
  DeviceBuffer q2(q_bytes), s2(s_bytes);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  convert("small", small, in_small.get(), small_in.size(), q_small, s_small);  // the main lane
  for (int i = 0; i < 4; ++i) copy(busy.get(), in_big.get(), big_in.size());   // keeps the main lane busy
  copy(staged_big.get(), in_big.get(), big_in.size());
  convert("big again", big, staged_big.get(), big_in.size(), q2, s2);  // the side lane
  EXPECT_THAT(converter->Sync(), ::testing::IsEmpty());
  EXPECT_EQ(stats_.side_lane, 2u);
  EXPECT_TRUE(q2.Download(q_bytes) == want_q) << "the side lane read the device op's output before it was written";
  EXPECT_TRUE(s2.Download(s_bytes) == want_s);
}

}  // namespace
}  // namespace refit
