// Batched GPU launches (kernels/batch_quantize.h) against the CPU reference: every output byte of
// every tensor of an NVFP4 batch equals formats::Quantize with the tensor's own amax, each
// tensor's amax equals formats::Amax, non-finite input is recorded in the word of the tensor
// that holds it (and no other), and batched copies equal their sources.
#include "kernels/batch_quantize.h"

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/bits.h"
#include "formats/format.h"
#include "tests/unit/kernels/device_test_util.h"
#include "tests/unit/kernels/test_values.h"

namespace refit::kernels {
namespace {

using formats::Format;
using testing::DeviceBuffer;
using testing::PinnedBuffer;

uint64_t FreshSeed() {
  static const uint64_t base = std::random_device{}();
  static uint64_t counter = 0;
  return base + 7919 * counter++;
}

// One tensor of a test batch: host input, device input and outputs, its slot words.
struct Tensor {
  std::string name;
  Shape shape;
  std::vector<uint8_t> host;
  std::unique_ptr<DeviceBuffer> in;
  std::vector<std::unique_ptr<DeviceBuffer>> outs;
  std::vector<formats::MutableBytes> out_bytes;
};

class Batch {
 public:
  Batch(Format f, DType dtype, formats::QuantizeOptions options) : f_(f), dtype_(dtype), options_(options) {}

  void Add(const std::string& name, const Shape& shape, const std::vector<float>& values) {
    auto t = std::make_unique<Tensor>();
    t->name = name;
    t->shape = shape;
    t->host = testing::Encode(values, dtype_);
    t->in = std::make_unique<DeviceBuffer>(t->host.size());
    t->in->Upload(t->host.data(), t->host.size());
    auto plan = formats::PlanOutputs(f_, dtype_, shape);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const auto& s : *plan) {
      t->outs.push_back(std::make_unique<DeviceBuffer>(s.bytes));
      t->out_bytes.push_back({t->outs.back()->get(), s.bytes});
    }
    tensors_.push_back(std::move(t));
  }

  // Runs the batch; words[i] and amax[i] belong to tensor i.
  void Run() {
    const size_t n = tensors_.size();
    words_ = std::make_unique<DeviceBuffer>(n * 8, 0xFF);
    amax_ = std::make_unique<DeviceBuffer>(n * 4, 0x00);
    std::vector<Nvfp4BatchItem> items;
    for (size_t i = 0; i < n; ++i) {
      Tensor& t = *tensors_[i];
      auto item = Nvfp4BatchItemFor(f_, {dtype_, t.shape, t.in->get()}, options_, t.out_bytes, t.name,
                                    static_cast<float*>(amax_->get()) + i,
                                    static_cast<unsigned long long*>(words_->get()) + i);
      ASSERT_TRUE(item.ok()) << item.status();
      ASSERT_TRUE(item->has_value()) << t.name << " was not batchable";
      items.push_back(**item);
    }
    PinnedBuffer host_table(Nvfp4BatchTableBytes(n));
    DeviceBuffer device_table(Nvfp4BatchTableBytes(n));
    auto st = QuantizeNvfp4Batch(Nvfp4KindOf(f_, dtype_, options_), items, host_table.get(), device_table.get(),
                                 nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  unsigned long long Word(size_t i) const {
    auto w = words_->Download(n_bytes_words());
    unsigned long long x;
    std::memcpy(&x, w.data() + 8 * i, 8);
    return x;
  }

  // Every output byte and the amax of tensor i against the CPU reference.
  void ExpectMatchesReference(size_t i, const std::string& what) const {
    const Tensor& t = *tensors_[i];
    auto plan = formats::PlanOutputs(f_, dtype_, t.shape);
    ASSERT_TRUE(plan.ok());
    std::vector<std::vector<uint8_t>> cpu;
    std::vector<formats::MutableBytes> cpu_outs;
    for (const auto& s : *plan) cpu.emplace_back(s.bytes, 0x5A);
    for (auto& c : cpu) cpu_outs.push_back({c.data(), c.size()});
    auto st = formats::Quantize(f_, {dtype_, t.shape, t.host.data()}, options_, std::nullopt, cpu_outs, t.name);
    ASSERT_TRUE(st.ok()) << st;
    for (size_t p = 0; p < cpu.size(); ++p) {
      auto gpu = t.outs[p]->Download(cpu[p].size());
      size_t bad = 0, first = 0;
      for (size_t b = 0; b < gpu.size(); ++b) {
        if (gpu[b] != cpu[p][b] && bad++ == 0) first = b;
      }
      EXPECT_EQ(bad, 0u) << what << " tensor " << t.name << ShapeString(t.shape) << " output " << p << ": " << bad
                         << " of " << gpu.size() << " bytes differ, first at " << first;
    }
    auto ref = formats::Amax({dtype_, t.shape, t.host.data()},
                             {options_.fp32_input, formats::NonfinitePolicy::kPropagate}, t.name);
    ASSERT_TRUE(ref.ok());
    auto a = amax_->Download(4 * tensors_.size());
    float got;
    std::memcpy(&got, a.data() + 4 * i, 4);
    EXPECT_EQ(formats::bits::F32Bits(got), formats::bits::F32Bits(*ref)) << what << " amax of " << t.name;
  }

  size_t size() const { return tensors_.size(); }

 private:
  size_t n_bytes_words() const { return 8 * tensors_.size(); }
  Format f_;
  DType dtype_;
  formats::QuantizeOptions options_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
  std::unique_ptr<DeviceBuffer> words_, amax_;
};

class KernelsBatchTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_GPU(); }
};

// A MoE-like run: same-shape experts, a transposed one, a 3-D one, a tiny one and one of many
// tiles, in every NVFP4 format, input dtype and fp32 policy.
TEST_F(KernelsBatchTest, Nvfp4RunMatchesReference) {
  const Shape shapes[] = {{64, 256}, {64, 256}, {64, 256}, {64, 256}, {256, 64}, {3, 2, 48}, {1, 16}, {300, 512}};
  for (Format f : {Format::kNvfp4, Format::kNvfp4Te}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      for (auto policy : {formats::Fp32InputPolicy::kExact, formats::Fp32InputPolicy::kRoundToBf16}) {
        if (dtype == DType::kBF16 && policy == formats::Fp32InputPolicy::kRoundToBf16) continue;
        const uint64_t seed = FreshSeed();
        std::mt19937_64 rng(seed);
        const std::string what = std::string(formats::FormatName(f)) + " " + DTypeName(dtype) +
                                 (policy == formats::Fp32InputPolicy::kRoundToBf16 ? " round_to_bf16" : "") +
                                 " seed=" + std::to_string(seed);
        Batch batch(f, dtype, {policy, formats::NonfinitePolicy::kReject});
        int i = 0;
        for (const Shape& s : shapes) {
          const int64_t n = *NumElements(s);
          // Alternate random tensors of different magnitudes with the edge-value mix.
          batch.Add("t" + std::to_string(i), s,
                    i % 2 ? testing::EdgeValues(n, rng) : testing::RandomValues(n, rng, 0.02f * (i + 1)));
          ++i;
        }
        batch.Run();
        for (size_t k = 0; k < batch.size(); ++k) {
          batch.ExpectMatchesReference(k, what);
          EXPECT_EQ(batch.Word(k), ~0ULL) << what << ": tensor " << k << " recorded a non-finite value";
        }
      }
    }
  }
}

// More tensors than CTAs of the encode grid and amax tiles that end mid-tensor.
TEST_F(KernelsBatchTest, ManySmallTensorsMatchReference) {
  const uint64_t seed = FreshSeed();
  std::mt19937_64 rng(seed);
  Batch batch(Format::kNvfp4, DType::kBF16, {});
  for (int i = 0; i < 600; ++i) {
    const Shape s = i % 3 == 2 ? Shape{32, 16} : Shape{16, 32};
    batch.Add("e" + std::to_string(i), s, testing::RandomValues(512, rng, 0.01f + 0.001f * (i % 17)));
  }
  batch.Run();
  for (size_t k = 0; k < batch.size(); ++k) batch.ExpectMatchesReference(k, "seed=" + std::to_string(seed));
}

// More tiles than resident CTAs, in tensors of several tiles each: every CTA's range of the
// encode walk starts, ends or crosses tensors mid-range, and the tensors' sizes differ so that
// range and tensor boundaries fall everywhere.
TEST_F(KernelsBatchTest, TensorsSpanningSeveralCtaRangesMatchReference) {
  const uint64_t seed = FreshSeed();
  std::mt19937_64 rng(seed);
  Batch batch(Format::kNvfp4, DType::kBF16, {});
  for (int i = 0; i < 160; ++i) {
    const Shape s = i % 5 == 4 ? Shape{96, 1040} : Shape{128, 1024};
    const int64_t n = *NumElements(s);
    batch.Add("x" + std::to_string(i), s, testing::RandomValues(n, rng, 0.01f + 0.002f * (i % 13)));
  }
  batch.Run();
  for (size_t k = 0; k < batch.size(); ++k) batch.ExpectMatchesReference(k, "seed=" + std::to_string(seed));
}

// A NaN in the middle tensor of a run (and an Inf after it) is recorded in that tensor's word
// only, at its first bad flat index; the other tensors still equal the reference.
TEST_F(KernelsBatchTest, NonfiniteRecordedForItsTensorOnly) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const uint64_t seed = FreshSeed();
    std::mt19937_64 rng(seed);
    Batch batch(Format::kNvfp4, dtype, {});
    for (int i = 0; i < 5; ++i) {
      std::vector<float> v = testing::RandomValues(128 * 256, rng, 0.02f);
      if (i == 2) {
        v[20000] = std::numeric_limits<float>::infinity();
        v[7777] = std::numeric_limits<float>::quiet_NaN();
      }
      batch.Add("expert." + std::to_string(i), {128, 256}, v);
    }
    batch.Run();
    const std::string what = std::string(DTypeName(dtype)) + " seed=" + std::to_string(seed);
    for (size_t k = 0; k < batch.size(); ++k) {
      EXPECT_EQ(batch.Word(k), k == 2 ? 7777ULL : ~0ULL) << what << " tensor " << k;
      if (k != 2) batch.ExpectMatchesReference(k, what);
    }
  }
}

TEST_F(KernelsBatchTest, ItemForSendsOddTensorsToTheSingleTensorPath) {
  DeviceBuffer in(4096 + 16), q(2048 + 16), sc(512), s2(4), words(8, 0xFF), amax(4, 0);
  auto* a = static_cast<float*>(amax.get());
  auto* w = static_cast<unsigned long long*>(words.get());
  auto outs_for = [&](const Shape& shape) {
    auto plan = formats::PlanOutputs(Format::kNvfp4, DType::kBF16, shape);
    EXPECT_TRUE(plan.ok());
    return std::vector<formats::MutableBytes>{
        {q.get(), (*plan)[0].bytes}, {sc.get(), (*plan)[1].bytes}, {s2.get(), (*plan)[2].bytes}};
  };
  auto outs = outs_for({64, 32});
  auto ok = Nvfp4BatchItemFor(Format::kNvfp4, {DType::kBF16, {64, 32}, in.get()}, {}, outs, "w", a, w);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->has_value());
  // Another format, a misaligned input, an empty tensor: the single-tensor path.
  auto fp8 = Nvfp4BatchItemFor(Format::kMxfp8, {DType::kBF16, {64, 32}, in.get()}, {}, outs, "w", a, w);
  ASSERT_TRUE(fp8.ok());
  EXPECT_FALSE(fp8->has_value());
  auto shifted = Nvfp4BatchItemFor(Format::kNvfp4, {DType::kBF16, {64, 32}, static_cast<char*>(in.get()) + 2}, {},
                                   outs, "w", a, w);
  ASSERT_TRUE(shifted.ok());
  EXPECT_FALSE(shifted->has_value());
  auto empty_outs = outs_for({0, 32});
  auto empty = Nvfp4BatchItemFor(Format::kNvfp4, {DType::kBF16, {0, 32}, in.get()}, {}, empty_outs, "w", a, w);
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->has_value());
  // Bad input is refused naming the tensor, as Quantize does.
  auto bad_k = Nvfp4BatchItemFor(Format::kNvfp4, {DType::kBF16, {64, 40}, in.get()}, {}, outs, "layers.3.w", a, w);
  ASSERT_FALSE(bad_k.ok());
  EXPECT_NE(bad_k.status().message().find("layers.3.w"), std::string::npos) << bad_k.status();
  auto no_word = Nvfp4BatchItemFor(Format::kNvfp4, {DType::kBF16, {64, 32}, in.get()}, {}, outs, "w", a, nullptr);
  EXPECT_FALSE(no_word.ok());
}

TEST_F(KernelsBatchTest, CopyBatchCopiesEveryRegionExactly) {
  const uint64_t sizes[] = {0, 1, 15, 16, 17, 4096, 16384, 16385, 100003, 1 << 20};
  const size_t shifts[] = {0, 1, 3, 0, 16, 0, 0, 5, 0, 0};
  std::mt19937_64 rng(FreshSeed());
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::unique_ptr<DeviceBuffer>> src, dst;
  std::vector<CopyBatchItem> items;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    host.emplace_back(sizes[i]);
    for (auto& b : host.back()) b = static_cast<uint8_t>(rng());
    src.push_back(std::make_unique<DeviceBuffer>(sizes[i] + shifts[i]));
    dst.push_back(std::make_unique<DeviceBuffer>(sizes[i] + 16, 0xA5));
    src.back()->Upload(host.back().data(), sizes[i], shifts[i]);
    // Odd shifts put source and destination off the 16-byte vector path.
    items.push_back({static_cast<char*>(dst.back()->get()) + (i % 2), static_cast<char*>(src.back()->get()) + shifts[i],
                     sizes[i]});
  }
  PinnedBuffer host_table(CopyBatchTableBytes(items.size()));
  DeviceBuffer device_table(CopyBatchTableBytes(items.size()));
  auto st = CopyBatch(items, host_table.get(), device_table.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < items.size(); ++i) {
    auto got = dst[i]->Download(sizes[i] + 16);
    const size_t off = i % 2;
    EXPECT_TRUE(std::equal(host[i].begin(), host[i].end(), got.begin() + off)) << "region " << i;
    for (size_t b = 0; b < got.size(); ++b) {
      if (b < off || b >= off + sizes[i]) {
        ASSERT_EQ(got[b], 0xA5) << "region " << i << " wrote outside at " << b;
      }
    }
  }
}

}  // namespace
}  // namespace refit::kernels
