// GPU quantizers (kernels/quantize.h) against the CPU reference quantizers (formats/format.h),
// byte for byte: fresh random data, edge-value tensors, ragged shapes, both input dtypes, both
// input policies, both amax paths of the formats with a global amax, and the non-finite policies.
// Each suite runs over the format table's rows of its kind (tests/unit/formats/every_format.h):
// a row added to the table is tested here without a list to edit.
#include "kernels/quantize.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/bits.h"
#include "formats/format.h"
#include "formats/format_info.h"
#include "tests/unit/formats/every_format.h"
#include "tests/unit/kernels/device_test_util.h"
#include "tests/unit/kernels/test_values.h"

namespace refit::kernels {
namespace {

using formats::Format;
using formats::testing::FormatParamName;
using formats::testing::FormatsWhere;
using testing::DeviceBuffer;
using testing::EdgeValues;
using testing::Encode;
using testing::RandomValues;
namespace bits = formats::bits;

uint64_t FreshSeed() {
  static const uint64_t base = std::random_device{}();
  static uint64_t counter = 0;
  return base + 7919 * counter++;
}

struct Outputs {
  std::vector<std::vector<uint8_t>> parts;
};

absl::StatusOr<Outputs> RunCpu(Format f, DType dtype, const Shape& shape, const std::vector<uint8_t>& in,
                               const formats::QuantizeOptions& opt, std::optional<float> amax) {
  auto plan = formats::PlanOutputs(f, dtype, shape);
  if (!plan.ok()) return plan.status();
  Outputs out;
  std::vector<formats::MutableBytes> outs;
  for (const auto& s : *plan) out.parts.emplace_back(s.bytes, 0x5A);
  for (auto& p : out.parts) outs.push_back({p.data(), p.size()});
  auto st = formats::Quantize(f, {dtype, shape, in.data()}, opt, amax, outs, "w");
  if (!st.ok()) return st;
  return out;
}

enum class AmaxPath { kHost, kDevice };

absl::StatusOr<Outputs> RunGpu(Format f, DType dtype, const Shape& shape, const std::vector<uint8_t>& in,
                               const formats::QuantizeOptions& opt, std::optional<float> amax, AmaxPath path,
                               size_t misalign = 0) {
  auto plan = formats::PlanOutputs(f, dtype, shape);
  if (!plan.ok()) return plan.status();
  // `misalign` shifts the input by one element and every output by 4 bytes: off the 16-byte
  // vector alignment, still element-aligned.
  const size_t in_shift = misalign ? DTypeSize(dtype) : 0;
  misalign = misalign ? 4 : 0;
  DeviceBuffer d_in(in.size() + in_shift);
  d_in.Upload(in.data(), in.size(), in_shift);
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<formats::MutableBytes> outs;
  for (const auto& s : *plan) {
    bufs.push_back(std::make_unique<DeviceBuffer>(s.bytes + misalign));
    outs.push_back({static_cast<char*>(bufs.back()->get()) + misalign, s.bytes});
  }
  auto probe = NonfiniteProbe::Create();
  if (!probe.ok()) return probe.status();
  DeviceBuffer d_amax(4);
  GlobalAmax ga;
  const formats::ConstTensor t{dtype, shape, static_cast<char*>(d_in.get()) + in_shift};
  if (formats::NeedsGlobalAmax(f)) {
    if (path == AmaxPath::kDevice && !amax.has_value()) {
      if (auto s = ResetAmax(static_cast<float*>(d_amax.get()), nullptr); !s.ok()) return s;
      if (auto s = AccumulateAmax(t, opt, static_cast<float*>(d_amax.get()), nullptr); !s.ok()) return s;
      ga.device = static_cast<const float*>(d_amax.get());
    } else {
      ga.host = amax;
      if (!amax.has_value()) {
        auto own = formats::Amax({dtype, shape, in.data()}, {opt.fp32_input, formats::NonfinitePolicy::kPropagate}, "w");
        if (!own.ok()) return own.status();
        ga.host = *own;
      }
    }
  }
  if (auto s = Quantize(f, t, opt, ga, outs, "w", &*probe, nullptr); !s.ok()) return s;
  if (opt.nonfinite == formats::NonfinitePolicy::kReject) {
    if (auto s = probe->Check("w", nullptr); !s.ok()) return s;
  }
  Outputs out;
  for (size_t i = 0; i < bufs.size(); ++i) out.parts.push_back(bufs[i]->Download((*plan)[i].bytes, misalign));
  return out;
}

std::string Hex(uint8_t b) {
  static const char* d = "0123456789ABCDEF";
  return std::string{d[b >> 4], d[b & 15]};
}

void ExpectSameBytes(const Outputs& cpu, const Outputs& gpu, const std::string& what) {
  ASSERT_EQ(cpu.parts.size(), gpu.parts.size()) << what;
  for (size_t p = 0; p < cpu.parts.size(); ++p) {
    ASSERT_EQ(cpu.parts[p].size(), gpu.parts[p].size()) << what;
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < cpu.parts[p].size(); ++i) {
      if (cpu.parts[p][i] != gpu.parts[p][i]) {
        if (mismatches++ == 0) first = i;
      }
    }
    EXPECT_EQ(mismatches, 0u) << what << ": output " << p << " differs in " << mismatches << " of "
                              << cpu.parts[p].size() << " bytes; first at byte " << first << ": cpu "
                              << Hex(cpu.parts[p][first]) << " gpu " << Hex(gpu.parts[p][first]);
  }
}

std::string Describe(Format f, DType dtype, const Shape& shape, const char* data, uint64_t seed) {
  return std::string(formats::FormatName(f)) + " " + std::string(DTypeName(dtype)) + ShapeString(shape) + " " +
         data + " seed=" + std::to_string(seed);
}

void Compare(Format f, DType dtype, const Shape& shape, const std::vector<float>& values, const char* data,
             uint64_t seed, formats::QuantizeOptions opt = {}, AmaxPath path = AmaxPath::kHost,
             size_t misalign = 0) {
  const auto in = Encode(values, dtype);
  const std::string what = Describe(f, dtype, shape, data, seed) + (path == AmaxPath::kDevice ? " device-amax" : "") +
                           (misalign ? " misaligned" : "");
  auto cpu = RunCpu(f, dtype, shape, in, opt, std::nullopt);
  auto gpu = RunGpu(f, dtype, shape, in, opt, std::nullopt, path, misalign);
  ASSERT_EQ(cpu.ok(), gpu.ok()) << what << ": cpu " << cpu.status() << " gpu " << gpu.status();
  if (!cpu.ok()) return;
  ExpectSameBytes(*cpu, *gpu, what);
}

class KernelsQuantizeTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_GPU(); }
};

// Per-format suites, one per kind of row; each is instantiated over the table below.
class EveryFormatKernelTest : public KernelsQuantizeTest, public ::testing::WithParamInterface<Format> {};
class QuantizedFormatKernelTest : public KernelsQuantizeTest, public ::testing::WithParamInterface<Format> {};
class GlobalAmaxKernelTest : public KernelsQuantizeTest, public ::testing::WithParamInterface<Format> {};
class CastKernelTest : public KernelsQuantizeTest, public ::testing::WithParamInterface<Format> {};

TEST_P(QuantizedFormatKernelTest, RandomBf16AndF32MatchReference) {
  const Format f = GetParam();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Shape& shape : {Shape{256, 4096}, Shape{2624, 512}, Shape{3, 130, 256}}) {
      const uint64_t seed = FreshSeed();
      std::mt19937_64 rng(seed);
      const int64_t n = *NumElements(shape);
      Compare(f, dtype, shape, RandomValues(n, rng, 0.02f), "normal(0.02)", seed);
    }
  }
}

TEST_P(QuantizedFormatKernelTest, EdgeValuesMatchReference) {
  const Format f = GetParam();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int rep = 0; rep < 3; ++rep) {
      const uint64_t seed = FreshSeed();
      std::mt19937_64 rng(seed);
      const Shape shape{384, 1024};
      Compare(f, dtype, shape, EdgeValues(*NumElements(shape), rng), "edge", seed);
    }
  }
}

TEST_P(GlobalAmaxKernelTest, DeviceAmaxPathMatchesReference) {
  const Format f = GetParam();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const uint64_t seed = FreshSeed();
    std::mt19937_64 rng(seed);
    Compare(f, dtype, {1024, 2048}, RandomValues(1024 * 2048, rng, 0.05f), "normal(0.05)", seed, {},
            AmaxPath::kDevice);
    Compare(f, dtype, {256, 512}, EdgeValues(256 * 512, rng), "edge", seed, {}, AmaxPath::kDevice);
  }
}

TEST_F(KernelsQuantizeTest, DeviceAmaxEqualsReferenceAmax) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (auto policy : {formats::Fp32InputPolicy::kExact, formats::Fp32InputPolicy::kRoundToBf16}) {
      const uint64_t seed = FreshSeed();
      std::mt19937_64 rng(seed);
      const Shape shape{1000, 1003};  // odd size: the scalar path
      const auto in = Encode(EdgeValues(*NumElements(shape), rng), dtype);
      formats::QuantizeOptions opt{policy, formats::NonfinitePolicy::kReject};
      auto cpu = formats::Amax({dtype, shape, in.data()}, opt, "w");
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      DeviceBuffer d_in(in.size()), d_amax(4);
      d_in.Upload(in.data(), in.size());
      ASSERT_TRUE(ResetAmax(static_cast<float*>(d_amax.get()), nullptr).ok());
      ASSERT_TRUE(AccumulateAmax({dtype, shape, d_in.get()}, opt, static_cast<float*>(d_amax.get()), nullptr).ok());
      float gpu;
      std::memcpy(&gpu, d_amax.Download(4).data(), 4);
      EXPECT_EQ(bits::F32Bits(gpu), bits::F32Bits(*cpu)) << "seed=" << seed;
    }
  }
}

TEST_F(KernelsQuantizeTest, GroupAmaxIsMaxOverMembers) {
  std::mt19937_64 rng(FreshSeed());
  auto a = Encode(RandomValues(4096, rng, 0.01f), DType::kBF16);
  auto b = Encode(RandomValues(4096, rng, 0.5f), DType::kBF16);
  DeviceBuffer da(a.size()), db(b.size()), d_amax(4);
  da.Upload(a.data(), a.size());
  db.Upload(b.data(), b.size());
  ASSERT_TRUE(ResetAmax(static_cast<float*>(d_amax.get()), nullptr).ok());
  ASSERT_TRUE(AccumulateAmax({DType::kBF16, {64, 64}, da.get()}, {}, static_cast<float*>(d_amax.get()), nullptr).ok());
  ASSERT_TRUE(AccumulateAmax({DType::kBF16, {64, 64}, db.get()}, {}, static_cast<float*>(d_amax.get()), nullptr).ok());
  float gpu;
  std::memcpy(&gpu, d_amax.Download(4).data(), 4);
  const float ca = *formats::Amax({DType::kBF16, {64, 64}, a.data()}, {}, "a");
  const float cb = *formats::Amax({DType::kBF16, {64, 64}, b.data()}, {}, "b");
  EXPECT_EQ(gpu, std::max(ca, cb));
}

TEST_P(QuantizedFormatKernelTest, RaggedShapesAndMisalignedBuffers) {
  const Format f = GetParam();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Shape& shape : {Shape{2624, 7168}, Shape{300, 200}, Shape{129, 100}, Shape{1, 32}, Shape{130, 96},
                               Shape{0, 64}}) {
      if (f != Format::kFp8Block128 && shape[0] == 2624) continue;
      const uint64_t seed = FreshSeed();
      std::mt19937_64 rng(seed);
      const int64_t n = *NumElements(shape);
      Compare(f, dtype, shape, RandomValues(n, rng, 1.0f), "normal(1)", seed);
      if (n > 0) Compare(f, dtype, shape, RandomValues(n, rng, 1.0f), "normal(1)", seed, {}, AmaxPath::kHost, 2);
    }
  }
}

TEST_F(KernelsQuantizeTest, Fp8Block128ScaleShapeFor2624Rows) {
  auto plan = formats::PlanOutputs(Format::kFp8Block128, DType::kBF16, {2624, 7168});
  ASSERT_TRUE(plan.ok());
  auto bytes = OutputBytes(Format::kFp8Block128, DType::kBF16, {2624, 7168});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)[1], 21u * 56u * 4u);
  EXPECT_EQ((*bytes)[1], (*plan)[1].bytes);
}

TEST_P(EveryFormatKernelTest, OutputBytesMatchPlanOutputs) {
  const Format f = GetParam();
  for (const Shape& shape : {Shape{64, 64}, Shape{3, 5, 96}, Shape{7, 100}}) {
    auto plan = formats::PlanOutputs(f, DType::kBF16, shape);
    auto bytes = OutputBytes(f, DType::kBF16, shape);
    ASSERT_EQ(plan.ok(), bytes.ok()) << formats::FormatName(f) << ShapeString(shape);
    if (!plan.ok()) continue;
    ASSERT_EQ(plan->size(), bytes->size());
    for (size_t i = 0; i < plan->size(); ++i) EXPECT_EQ((*plan)[i].bytes, (*bytes)[i]);
  }
}

TEST_P(CastKernelTest, CastsMatchReference) {
  const Format f = GetParam();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (auto policy : {formats::Fp32InputPolicy::kExact, formats::Fp32InputPolicy::kRoundToBf16}) {
      for (const Shape& shape : {Shape{1024, 1024}, Shape{7, 13}}) {
        const uint64_t seed = FreshSeed();
        std::mt19937_64 rng(seed);
        std::vector<float> v = EdgeValues(*NumElements(shape), rng);
        for (size_t i = 0; i < v.size(); i += 97) v[i] = 70000.0f + static_cast<float>(i);  // fp16 overflow
        Compare(f, dtype, shape, v, "edge", seed, {policy, formats::NonfinitePolicy::kReject});
      }
    }
  }
}

TEST_P(QuantizedFormatKernelTest, Fp32InputRoundToBf16Policy) {
  const Format f = GetParam();
  const uint64_t seed = FreshSeed();
  std::mt19937_64 rng(seed);
  Compare(f, DType::kF32, {256, 1024}, RandomValues(256 * 1024, rng, 0.3f), "normal(0.3)", seed,
          {formats::Fp32InputPolicy::kRoundToBf16, formats::NonfinitePolicy::kReject});
}

TEST_P(QuantizedFormatKernelTest, Bf16AndItsF32UpcastGiveIdenticalBytes) {
  const Format f = GetParam();
  std::mt19937_64 rng(FreshSeed());
  std::vector<float> v = RandomValues(128 * 512, rng, 0.1f);
  for (float& x : v) x = bits::RoundToBf16(x);
  auto a = RunGpu(f, DType::kBF16, {128, 512}, Encode(v, DType::kBF16), {}, std::nullopt, AmaxPath::kDevice);
  auto b = RunGpu(f, DType::kF32, {128, 512}, Encode(v, DType::kF32), {}, std::nullopt, AmaxPath::kDevice);
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectSameBytes(*a, *b, std::string(formats::FormatName(f)) + " bf16 vs f32");
}

TEST_P(EveryFormatKernelTest, RejectNamesTheFirstNonfiniteIndex) {
  const Format f = GetParam();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    std::mt19937_64 rng(FreshSeed());
    std::vector<float> v = RandomValues(256 * 256, rng, 1.0f);
    v[40000] = std::numeric_limits<float>::infinity();
    v[12345] = std::numeric_limits<float>::quiet_NaN();
    const auto in = Encode(v, dtype);
    auto gpu = RunGpu(f, dtype, {256, 256}, in, {}, 1.0f, AmaxPath::kHost);
    ASSERT_FALSE(gpu.ok()) << formats::FormatName(f);
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(gpu.status().message()).find("index 12345"), std::string::npos) << gpu.status();
    EXPECT_NE(std::string(gpu.status().message()).find("w"), std::string::npos);
  }
}

// Under nonfinite=propagate, NaN inputs follow the producer's arithmetic on both sides. (Inf
// inputs are left out: Inf * 0 yields the x86 default NaN, whose sign bit differs from CUDA's
// canonical NaN, so those output codes differ in sign; see docs/kernels.md.)
TEST_P(QuantizedFormatKernelTest, PropagateMatchesReferenceOnNan) {
  const Format f = GetParam();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    std::mt19937_64 rng(FreshSeed());
    std::vector<float> v = RandomValues(128 * 256, rng, 1.0f);
    v[100] = std::numeric_limits<float>::quiet_NaN();
    v[5000] = std::numeric_limits<float>::quiet_NaN();
    const formats::QuantizeOptions opt{formats::Fp32InputPolicy::kExact, formats::NonfinitePolicy::kPropagate};
    const auto in = Encode(v, dtype);
    const std::optional<float> amax = formats::NeedsGlobalAmax(f) ? std::optional<float>(100.0f) : std::nullopt;
    auto cpu = RunCpu(f, dtype, {128, 256}, in, opt, amax);
    auto gpu = RunGpu(f, dtype, {128, 256}, in, opt, amax, AmaxPath::kHost);
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
    ExpectSameBytes(*cpu, *gpu, std::string(formats::FormatName(f)) + " propagate");
  }
}

INSTANTIATE_TEST_SUITE_P(Table, EveryFormatKernelTest, ::testing::ValuesIn(FormatsWhere(formats::testing::AnyFormat)),
                         FormatParamName);
INSTANTIATE_TEST_SUITE_P(Table, QuantizedFormatKernelTest,
                         ::testing::ValuesIn(FormatsWhere(formats::testing::IsQuantized)), FormatParamName);
INSTANTIATE_TEST_SUITE_P(Table, GlobalAmaxKernelTest, ::testing::ValuesIn(FormatsWhere(formats::testing::HasGlobalAmax)),
                         FormatParamName);
INSTANTIATE_TEST_SUITE_P(Table, CastKernelTest, ::testing::ValuesIn(FormatsWhere(formats::testing::IsCast)),
                         FormatParamName);

TEST_F(KernelsQuantizeTest, Nvfp4GoldenBlock) {
  // FORMATS.md §12.2: A = 2688, s2 = 1; scales 0x38, 0x7E; ModelOpt sign rule for -0.
  std::vector<float> v = {0, -0.0f, 0.25f, -0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, 6, -6, 0.1f, -0.1f, 3, -4,
                          2688, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  auto gpu = RunGpu(Format::kNvfp4, DType::kF32, {1, 32}, Encode(v, DType::kF32), {}, std::nullopt, AmaxPath::kDevice);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<uint8_t> packed = {0x00, 0x80, 0x22, 0x44, 0x66, 0xF7, 0x80, 0xE5, 0x07, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(gpu->parts[0], packed);
  EXPECT_EQ(gpu->parts[1], (std::vector<uint8_t>{0x38, 0x7E}));
  float s2;
  std::memcpy(&s2, gpu->parts[2].data(), 4);
  EXPECT_EQ(s2, 1.0f);
}

TEST_F(KernelsQuantizeTest, Nvfp4HostAmaxZeroIsRejectedLikeReference) {
  std::vector<float> v(64, 0.0f);
  const auto in = Encode(v, DType::kBF16);
  auto cpu = RunCpu(Format::kNvfp4, DType::kBF16, {2, 32}, in, {}, std::nullopt);
  auto gpu = RunGpu(Format::kNvfp4, DType::kBF16, {2, 32}, in, {}, std::nullopt, AmaxPath::kHost);
  EXPECT_FALSE(cpu.ok());
  EXPECT_FALSE(gpu.ok());
}

TEST_F(KernelsQuantizeTest, WrongOutputSizesAreRejected) {
  DeviceBuffer d_in(64 * 64 * 2), out(64 * 64);
  std::vector<formats::MutableBytes> outs = {{out.get(), 64 * 64}};
  auto s = Quantize(Format::kMxfp8, {DType::kBF16, {64, 64}, d_in.get()}, {formats::Fp32InputPolicy::kExact,
                    formats::NonfinitePolicy::kPropagate}, {}, outs, "layer.w", nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("layer.w"), std::string::npos);
}

}  // namespace
}  // namespace refit::kernels
