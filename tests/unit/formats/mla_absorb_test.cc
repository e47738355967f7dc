// MLA absorbed weights against SGLang's post_load_weights computation on DeepSeek-V3 per-head
// shapes (a transcription of its torch code: tests/golden/make_layout_goldens.py).
#include "formats/mla_absorb.h"

#include <cstring>
#include <vector>

#include "golden_file.h"
#include "gtest/gtest.h"

namespace refit::formats {
namespace {

using golden::FirstDiff;
using golden::Get;
using golden::GoldenTensor;

template <typename T>
std::vector<T> As(const GoldenTensor& t) {
  std::vector<T> v(t.bytes.size() / sizeof(T));
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

std::vector<uint8_t> Bytes(const std::vector<uint16_t>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class MlaAbsorbGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = golden::OpenLayoutGolden("mla_absorb.safetensors");
    ASSERT_NE(file_, nullptr);
  }
  void Check(const std::string& c, const MlaAbsorbGeometry& g, bool fp8) {
    GoldenTensor w = Get(*file_, "in." + c + ".weight");
    std::vector<uint16_t> kc(static_cast<size_t>(g.WkcElements())), vc(static_cast<size_t>(g.WvcElements()));
    absl::Status st;
    if (fp8) {
      st = MlaAbsorbFp8Block128(g, w.bytes, As<float>(Get(*file_, "in." + c + ".weight_scale_inv")), kc, vc);
    } else {
      st = MlaAbsorbBf16(g, As<uint16_t>(w), kc, vc);
    }
    ASSERT_TRUE(st.ok()) << st;
    GoldenTensor want_kc = Get(*file_, "out." + c + ".w_kc"), want_vc = Get(*file_, "out." + c + ".w_vc");
    EXPECT_EQ(want_kc.shape, (Shape{g.heads, g.kv_lora_rank, g.qk_nope_head_dim}));
    EXPECT_EQ(want_vc.shape, (Shape{g.heads, g.v_head_dim, g.kv_lora_rank}));
    EXPECT_EQ(FirstDiff(Bytes(kc), want_kc.bytes), -1) << c << " w_kc: first differing byte";
    EXPECT_EQ(FirstDiff(Bytes(vc), want_vc.bytes), -1) << c << " w_vc: first differing byte";
  }
  std::unique_ptr<SafetensorsFile> file_;
};

TEST_F(MlaAbsorbGolden, Bf16DeepSeekV3Heads) { Check("bf16", {2, 128, 128, 512}, false); }
TEST_F(MlaAbsorbGolden, Fp8Block128DeepSeekV3Heads) { Check("fp8", {2, 128, 128, 512}, true); }
TEST_F(MlaAbsorbGolden, Fp8PartialTiles) { Check("fp8_partial", {1, 64, 96, 200}, true); }

TEST(MlaAbsorb, RefusesMismatchedSizes) {
  MlaAbsorbGeometry g{2, 4, 4, 8};
  std::vector<uint16_t> kv(static_cast<size_t>(g.InputElements())), kc(static_cast<size_t>(g.WkcElements())),
      vc(static_cast<size_t>(g.WvcElements()));
  EXPECT_TRUE(MlaAbsorbBf16(g, kv, kc, vc).ok());
  std::vector<uint16_t> short_kc(kc.size() - 1);
  absl::Status st = MlaAbsorbBf16(g, kv, short_kc, vc);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("w_kc of 63"), std::string_view::npos) << st;
  std::vector<uint8_t> q(kv.size());
  std::vector<float> scales(3);
  st = MlaAbsorbFp8Block128(g, q, scales, kc, vc);
  EXPECT_NE(st.message().find("weight_scale_inv of 3 elements"), std::string_view::npos) << st;
  EXPECT_FALSE(MlaAbsorbBf16({0, 4, 4, 8}, kv, kc, vc).ok());
  // Sizes whose element count would overflow are refused before any size is computed.
  st = CheckMlaAbsorbGeometry({int64_t{1} << 23, int64_t{1} << 23, int64_t{1} << 23, int64_t{1} << 23});
  EXPECT_NE(st.message().find("at most"), std::string_view::npos) << st;
}

}  // namespace
}  // namespace refit::formats
