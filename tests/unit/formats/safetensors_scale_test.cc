// Checkpoints with hundreds of thousands of tensors: writing and parsing the header stays
// linear in the tensor count (the ctest TIMEOUT catches a quadratic regression: before, 200k
// tensors took over 5 CPU-minutes), and the header keeps its order and bytes.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "../temp_path.h"
#include "absl/strings/str_cat.h"
#include "formats/quantize_file.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"

namespace refit::formats {
namespace {

using ::refit::test_util::TempPath;

TEST(SafetensorsScaleTest, HundredThousandTensorsRoundTripInOrder) {
  constexpr int kTensors = 100000;
  std::vector<std::string> names;
  names.reserve(kTensors);
  // Not sorted: the header order is the given order.
  for (int i = 0; i < kTensors; ++i) names.push_back(absl::StrCat("model.layers.", (i * 7919) % kTensors, ".w"));
  const std::vector<uint8_t> two(2, 0);
  std::vector<SafetensorsWriteEntry> entries;
  for (const std::string& n : names) entries.push_back({n, DType::kBF16, {1}, two, nullptr});
  SafetensorsWriteOptions options;
  options.metadata = {{"format", "pt"}, {"b", "1"}, {"a", "2"}, {"b", "3"}};
  const std::string path = TempPath("scale.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, entries, options).ok());

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<SafetensorsEntry>& read = (*file)->view().tensors();
  ASSERT_EQ(read.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) ASSERT_EQ(read[i].name, names[i]) << i;
  // A repeated metadata key keeps its first place and its last value.
  const SafetensorsMetadata want = {{"format", "pt"}, {"b", "3"}, {"a", "2"}};
  EXPECT_EQ((*file)->view().metadata(), want);

  // refitctl quantize's path over the same file.
  QuantizeFileOptions q;
  q.format = Format::kFp16;
  absl::StatusOr<std::vector<TensorReport>> reports = QuantizeFile(path, TempPath("scale.out.safetensors"), q);
  ASSERT_TRUE(reports.ok()) << reports.status();
  EXPECT_EQ(reports->size(), names.size());
  std::remove(path.c_str());
  std::remove(TempPath("scale.out.safetensors").c_str());
}

TEST(SafetensorsScaleTest, HeaderBytesAreOrderedJsonDump) {
  const std::vector<uint8_t> two(2, 0);
  std::vector<SafetensorsWriteEntry> entries = {{"z", DType::kBF16, {1}, two, nullptr},
                                                {"a\"q", DType::kF16, {1}, two, nullptr}};
  SafetensorsWriteOptions options;
  options.metadata = {{"format", "pt"}};
  const std::string path = TempPath("bytes.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, entries, options).ok());
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string bytes(4096, '\0');
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},\"z\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
      "\"a\\\"q\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[2,4]}}";
  EXPECT_EQ(bytes.substr(8, header.size()), header);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace refit::formats
