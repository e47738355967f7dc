// QuantizeFile and the `refitctl quantize` command on real files: which tensors are
// quantized or copied (and why), output names/dtypes/shapes/bytes, metadata, exit codes.
#include "formats/quantize_file.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_path.h"
#include "gtest/gtest.h"
#include "oracle.h"
#include "run_quantize.h"

namespace refit::formats {
namespace {

namespace o = oracle;

using ::refit::test_util::TempPath;

struct Input {
  std::vector<uint16_t> w = o::ToBf16(o::Weights(64 * 96, 91));  // K = 96: mxfp8 ok, fp8 partial
  std::vector<uint16_t> experts = o::ToBf16(o::Weights(2 * 32 * 64, 92));
  std::vector<uint16_t> norm = o::ToBf16(o::Weights(64, 93));
  std::vector<float> odd = o::Weights(8 * 40, 94);  // K = 40
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<uint16_t> zeros = std::vector<uint16_t>(16 * 32, 0);
};

template <typename T>
std::span<const uint8_t> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

std::string WriteInput(const Input& in) {
  const std::string path = TempPath("in.safetensors");
  std::vector<SafetensorsWriteEntry> e = {
      {"layer.w", DType::kBF16, {64, 96}, Bytes(in.w), nullptr},
      {"layer.experts", DType::kBF16, {2, 32, 64}, Bytes(in.experts), nullptr},
      {"layer.norm", DType::kBF16, {64}, Bytes(in.norm), nullptr},
      {"layer.odd", DType::kF32, {8, 40}, Bytes(in.odd), nullptr},
      {"ids", DType::kI64, {3}, Bytes(in.ids), nullptr},
      {"layer.zeros", DType::kBF16, {16, 32}, Bytes(in.zeros), nullptr},
  };
  SafetensorsWriteOptions opts;
  opts.metadata = {{"format", "pt"}};
  EXPECT_TRUE(WriteSafetensors(path, e, opts).ok());
  return path;
}

TEST(QuantizeFileTest, Mxfp8ReportAndOutputs) {
  Input in;
  const std::string src = WriteInput(in), dst = TempPath("out_mxfp8.safetensors");
  QuantizeFileOptions opts;
  opts.format = Format::kMxfp8;
  absl::StatusOr<std::vector<TensorReport>> r = QuantizeFile(src, dst, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 6u);
  EXPECT_EQ((*r)[0].action, TensorReport::Action::kQuantized);
  EXPECT_EQ((*r)[0].outputs, (std::vector<std::string>{"layer.w", "layer.w_scale_inv"}));
  EXPECT_EQ((*r)[1].action, TensorReport::Action::kQuantized);
  EXPECT_EQ((*r)[2].action, TensorReport::Action::kCopied);
  EXPECT_NE((*r)[2].reason.find("rank 1"), std::string::npos);
  EXPECT_EQ((*r)[3].action, TensorReport::Action::kCopied);
  EXPECT_NE((*r)[3].reason.find("K=40 is not a multiple of 32"), std::string::npos) << (*r)[3].reason;
  EXPECT_EQ((*r)[4].action, TensorReport::Action::kCopied);
  EXPECT_NE((*r)[4].reason.find("not a floating tensor"), std::string::npos);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> out = SafetensorsFile::Open(dst);
  ASSERT_TRUE(out.ok()) << out.status();
  const SafetensorsView& v = (*out)->view();
  EXPECT_EQ(v.metadata(), (SafetensorsMetadata{{"format", "pt"}}));
  absl::StatusOr<testing::Quantized> want =
      testing::RunQuantize(Format::kMxfp8, DType::kBF16, {64, 96}, in.w.data());
  ASSERT_TRUE(want.ok());
  const SafetensorsEntry* w = v.Find("layer.w");
  const SafetensorsEntry* s = v.Find("layer.w_scale_inv");
  ASSERT_TRUE(w && s);
  EXPECT_EQ(w->dtype, DType::kF8E4M3);
  EXPECT_EQ(s->dtype, DType::kU8);
  EXPECT_EQ(s->shape, (Shape{64, 3}));
  EXPECT_TRUE(std::equal(v.Data(*w).begin(), v.Data(*w).end(), want->parts[0].begin()));
  EXPECT_TRUE(std::equal(v.Data(*s).begin(), v.Data(*s).end(), want->parts[1].begin()));
  EXPECT_EQ(v.Find("layer.experts_scale_inv")->shape, (Shape{2, 32, 2}));
  const SafetensorsEntry* norm = v.Find("layer.norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kBF16);
  EXPECT_TRUE(std::equal(v.Data(*norm).begin(), v.Data(*norm).end(), Bytes(in.norm).begin()));
  EXPECT_EQ(v.Find("ids")->dtype, DType::kI64);
}

TEST(QuantizeFileTest, Nvfp4KeepsZeroTensorAndNamesOutputs) {
  Input in;
  const std::string src = WriteInput(in), dst = TempPath("out_nvfp4.safetensors");
  QuantizeFileOptions opts;
  opts.format = Format::kNvfp4;
  absl::StatusOr<std::vector<TensorReport>> r = QuantizeFile(src, dst, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].outputs, (std::vector<std::string>{"layer.w", "layer.w_scale", "layer.w_scale_2"}));
  EXPECT_EQ((*r)[5].action, TensorReport::Action::kCopied);
  EXPECT_NE((*r)[5].reason.find("all zeros"), std::string::npos);
  EXPECT_EQ((*r)[3].action, TensorReport::Action::kCopied);  // K = 40
}

TEST(QuantizeFileTest, RejectsNaNWithoutWritingOutput) {
  Input in;
  in.odd[5] = std::numeric_limits<float>::quiet_NaN();
  const std::string src = WriteInput(in), dst = TempPath("out_nan.safetensors");
  std::filesystem::remove(dst);
  QuantizeFileOptions opts;
  opts.format = Format::kFp8Block128;
  absl::StatusOr<std::vector<TensorReport>> r = QuantizeFile(src, dst, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer.odd"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("flat index 5"), std::string::npos) << r.status();
  EXPECT_FALSE(std::filesystem::exists(dst));
}

// The CLI, as the golden-file comparison drives it.
int RunCli(const std::string& args, std::string* out) {
  const std::string bin = REFITCTL_PATH;
  const std::string log = TempPath("cli.out");
  const int rc = std::system((bin + " " + args + " >" + log + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(RefitctlQuantizeTest, ExitCodesAndOutputLines) {
  Input in;
  const std::string src = WriteInput(in), dst = TempPath("cli_out.safetensors");
  std::string out;
  EXPECT_EQ(RunCli("quantize --format fp8_block128 " + src + " " + dst, &out), 0) << out;
  EXPECT_NE(out.find("quantized layer.w -> layer.w, layer.w_scale_inv"), std::string::npos) << out;
  EXPECT_NE(out.find("copied ids: not a floating tensor (I64)"), std::string::npos) << out;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(dst);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->view().Find("layer.w_scale_inv")->shape, (Shape{1, 1}));
  EXPECT_EQ(RunCli("quantize --format nvfp4 --fp32-input round_to_bf16 --nonfinite propagate " + src + " " + dst, &out), 0) << out;
  EXPECT_EQ(RunCli("quantize --format fp9 " + src + " " + dst, &out), 2);
  EXPECT_NE(out.find("unknown format 'fp9'"), std::string::npos) << out;
  EXPECT_EQ(RunCli("quantize --format mxfp4 " + src, &out), 2);
  EXPECT_EQ(RunCli("quantize --format mxfp4 --nonfinite maybe " + src + " " + dst, &out), 2);
  EXPECT_EQ(RunCli("frobnicate", &out), 2);
  EXPECT_EQ(RunCli("quantize --format mxfp4 " + TempPath("missing.safetensors") + " " + dst, &out), 1);
  EXPECT_NE(out.find("missing.safetensors"), std::string::npos) << out;
}

}  // namespace
}  // namespace refit::formats
