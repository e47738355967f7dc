// GPU layout, derive and checksum kernels against their CPU counterparts: formats::PackUe8m0 and
// formats::Swizzle128x4 (plus the closed-form offset of FORMATS.md B §8.1), RN(w + 1) computed
// with formats::bits, and refit::ParallelChecksum64.
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/parallel_checksum.h"
#include "formats/bits.h"
#include "formats/layout.h"
#include "kernels/checksum.h"
#include "kernels/derive.h"
#include "kernels/layout.h"
#include "tests/unit/kernels/device_test_util.h"

namespace refit::kernels {
namespace {

using testing::DeviceBuffer;
namespace bits = formats::bits;

class KernelsLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_GPU(); }
  std::mt19937_64 rng_{std::random_device{}()};
};

TEST_F(KernelsLayoutTest, PackUe8m0MatchesReferenceForAnyRowCount) {
  for (int64_t mn : {2624, 2112, 128, 1, 7, 4096}) {
    for (int64_t kb : {56, 1, 5, 8}) {
      for (int64_t gran : {128, 1}) {
        formats::Ue8m0PackGeometry g{2, mn, kb, gran};
        std::vector<float> sf(static_cast<size_t>(g.ScaleCount()));
        std::uniform_int_distribution<int> e(1, 254);
        for (size_t i = 0; i < sf.size(); ++i) sf[i] = i % 17 == 0 ? 0.0f : bits::F32FromBits(e(rng_) << 23);
        std::vector<int32_t> cpu(static_cast<size_t>(g.PackedWords()));
        ASSERT_TRUE(formats::PackUe8m0(g, sf, cpu).ok());
        DeviceBuffer d_sf(sf.size() * 4), d_out(cpu.size() * 4);
        d_sf.Upload(sf.data(), sf.size() * 4);
        ASSERT_TRUE(PackUe8m0Scales(static_cast<float*>(d_sf.get()), 2, mn, kb, static_cast<int>(gran),
                                    static_cast<int32_t*>(d_out.get()), cpu.size(), nullptr, nullptr)
                        .ok());
        auto gpu = d_out.Download(cpu.size() * 4);
        EXPECT_EQ(0, std::memcmp(gpu.data(), cpu.data(), gpu.size())) << "mn=" << mn << " kb=" << kb << " gran=" << gran;
      }
    }
  }
}

TEST_F(KernelsLayoutTest, PackUe8m0FlagsScalesThatAreNotPowersOfTwo) {
  std::vector<float> sf(3 * 4, 1.0f);
  sf[7] = 1.5f;
  auto words = PackUe8m0OutputWords(1, 300, 4);
  ASSERT_TRUE(words.ok());
  DeviceBuffer d_sf(sf.size() * 4), d_out(*words * 4), d_bad(8, 0xFF);
  d_sf.Upload(sf.data(), sf.size() * 4);
  ASSERT_TRUE(PackUe8m0Scales(static_cast<float*>(d_sf.get()), 1, 300, 4, 128, static_cast<int32_t*>(d_out.get()),
                              *words, static_cast<unsigned long long*>(d_bad.get()), nullptr)
                  .ok());
  uint64_t bad;
  std::memcpy(&bad, d_bad.Download(8).data(), 8);
  EXPECT_EQ(bad, 7u);
  std::vector<int32_t> cpu(*words);
  EXPECT_FALSE(formats::PackUe8m0({1, 300, 4, 128}, sf, cpu).ok());
}

TEST_F(KernelsLayoutTest, Swizzle128x4MatchesReferenceAndClosedForm) {
  for (int64_t rows : {128, 256, 2624, 5}) {
    for (int64_t cols : {56, 7, 4, 448}) {
      formats::Swizzle128x4Geometry g{2, rows, cols};
      std::vector<uint8_t> s(static_cast<size_t>(g.InputBytes()));
      for (auto& b : s) b = static_cast<uint8_t>(rng_() | 1);  // nonzero: padding must stay zero
      std::vector<uint8_t> cpu(static_cast<size_t>(g.SwizzledBytes()));
      ASSERT_TRUE(formats::Swizzle128x4(g, s, cpu).ok());
      DeviceBuffer d_s(s.size()), d_out(cpu.size());
      d_s.Upload(s.data(), s.size());
      ASSERT_TRUE(Swizzle128x4(static_cast<uint8_t*>(d_s.get()), 2, rows, cols, static_cast<uint8_t*>(d_out.get()),
                               cpu.size(), nullptr)
                      .ok());
      auto gpu = d_out.Download(cpu.size());
      EXPECT_EQ(gpu, cpu) << rows << "x" << cols;
      // Independent closed form (FlashInfer get_sf_out_offset_128x4), group 1.
      const int64_t kp = g.PaddedCols(), base = g.PaddedRows() * kp;
      for (int64_t m = 0; m < rows; m += 13) {
        for (int64_t k = 0; k < cols; ++k) {
          const int64_t off = ((m / 128) * (kp / 4) + k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + k % 4;
          ASSERT_EQ(gpu[base + off], s[(rows + m) * cols + k]) << m << "," << k;
        }
      }
    }
  }
}

TEST_F(KernelsLayoutTest, TransposeLast2MatchesTheHostLoopForEveryElementSize) {
  struct Case {
    int64_t batch, rows, cols;
  };
  for (int elem : {1, 2, 4, 8}) {
    for (Case c : {Case{1, 1, 1}, Case{1, 33, 65}, Case{3, 64, 32}, Case{2, 7, 300}, Case{1, 2880, 5760}}) {
      const size_t n = static_cast<size_t>(c.batch * c.rows * c.cols) * elem;
      std::vector<uint8_t> in(n), want(n);
      for (auto& b : in) b = static_cast<uint8_t>(rng_());
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t i = 0; i < c.rows; ++i) {
          for (int64_t j = 0; j < c.cols; ++j) {
            std::memcpy(want.data() + ((b * c.cols + j) * c.rows + i) * elem, in.data() + ((b * c.rows + i) * c.cols + j) * elem,
                        elem);
          }
        }
      }
      DeviceBuffer d_in(n), d_out(n);
      d_in.Upload(in.data(), n);
      ASSERT_TRUE(TransposeLast2(d_in.get(), c.batch, c.rows, c.cols, elem, d_out.get(), nullptr).ok());
      EXPECT_EQ(d_out.Download(n), want) << elem << "-byte elements, " << c.batch << "x" << c.rows << "x" << c.cols;
    }
  }
  EXPECT_FALSE(TransposeLast2(nullptr, 1, 2, 2, 3, nullptr, nullptr).ok());
}

TEST_F(KernelsLayoutTest, GemmaPlusOneRoundsInTheParameterDtype) {
  const int64_t n = 4099;
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<uint16_t> w(n);
  for (auto& h : w) h = bits::F32ToBf16(normal(rng_));
  w[0] = bits::F32ToBf16(-1.0f);
  w[1] = 0x3B80;  // 2^-8: 1 + 2^-8 is a bf16 tie
  w[2] = 0x8000;
  std::vector<float> wf(n);
  for (auto& x : wf) x = normal(rng_);
  for (int misalign : {0, 2}) {
    DeviceBuffer d_w(n * 2 + 16), d_out(n * 2 + 16);
    d_w.Upload(w.data(), n * 2, misalign);
    ASSERT_TRUE(GemmaPlusOne(static_cast<char*>(d_w.get()) + misalign, DType::kBF16, n,
                             static_cast<char*>(d_out.get()) + misalign, nullptr)
                    .ok());
    auto out = d_out.Download(n * 2, misalign);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t got;
      std::memcpy(&got, out.data() + 2 * i, 2);
      ASSERT_EQ(got, bits::F32ToBf16(bits::Bf16ToF32(w[i]) + 1.0f)) << i;
    }
  }
  DeviceBuffer d_wf(n * 4), d_outf(n * 4);
  d_wf.Upload(wf.data(), n * 4);
  ASSERT_TRUE(GemmaPlusOne(d_wf.get(), DType::kF32, n, d_outf.get(), nullptr).ok());
  auto outf = d_outf.Download(n * 4);
  for (int64_t i = 0; i < n; ++i) {
    float got;
    std::memcpy(&got, outf.data() + 4 * i, 4);
    ASSERT_EQ(got, wf[i] + 1.0f) << i;
  }
  // In place, F16.
  std::vector<uint16_t> h(n);
  for (auto& x : h) x = bits::F32ToF16(normal(rng_));
  DeviceBuffer d_h(n * 2);
  d_h.Upload(h.data(), n * 2);
  ASSERT_TRUE(GemmaPlusOne(d_h.get(), DType::kF16, n, d_h.get(), nullptr).ok());
  auto outh = d_h.Download(n * 2);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t got;
    std::memcpy(&got, outh.data() + 2 * i, 2);
    ASSERT_EQ(got, bits::F32ToF16(bits::F16ToF32(h[i]) + 1.0f)) << i;
  }
  EXPECT_FALSE(GemmaPlusOne(d_h.get(), DType::kU8, n, d_h.get(), nullptr).ok());
}

TEST_F(KernelsLayoutTest, DeviceChecksumEqualsParallelChecksum64) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17}, size_t{4096},
                       size_t{(1 << 22) + 3}}) {
    for (size_t misalign : {size_t{0}, size_t{3}}) {
      std::vector<uint8_t> data(bytes);
      for (auto& b : data) b = static_cast<uint8_t>(rng_());
      DeviceBuffer d(bytes + 16), d_sum(8);
      d.Upload(data.data(), bytes, misalign);
      const uint64_t seed = rng_();
      ASSERT_TRUE(DeviceChecksum(static_cast<char*>(d.get()) + misalign, bytes, seed,
                                 static_cast<uint64_t*>(d_sum.get()), nullptr)
                      .ok());
      uint64_t gpu;
      std::memcpy(&gpu, d_sum.Download(8).data(), 8);
      EXPECT_EQ(gpu, ParallelChecksum64(data.data(), bytes, seed)) << bytes << " misalign " << misalign;
    }
  }
}

}  // namespace
}  // namespace refit::kernels
