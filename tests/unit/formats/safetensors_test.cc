// Safetensors writer/reader round trip and rejection of malformed files with errors that
// name the problem and the tensor.
#include "formats/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../temp_path.h"
#include "gtest/gtest.h"

namespace refit::formats {
namespace {

using ::refit::test_util::TempPath;

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// A file from a raw header string and data section.
std::vector<uint8_t> Build(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0xAB);
  return out;
}

absl::Status ParseError(const std::string& header, size_t data_bytes, SafetensorsLimits limits = {}) {
  std::vector<uint8_t> file = Build(header, data_bytes);
  return SafetensorsView::Parse(file, limits).status();
}

void ExpectError(const absl::Status& s, const std::vector<std::string>& needles) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s << " lacks " << n;
}

TEST(SafetensorsTest, RoundTripWithMetadataInGivenOrder) {
  std::vector<uint16_t> a = {1, 2, 3, 4, 5, 6};
  std::vector<float> b = {1.5f};
  std::vector<uint8_t> c = {};
  std::vector<SafetensorsWriteEntry> entries = {
      {"z.weight", DType::kBF16, {2, 3}, {reinterpret_cast<const uint8_t*>(a.data()), 12}, nullptr},
      {"a.scale", DType::kF32, {}, {reinterpret_cast<const uint8_t*>(b.data()), 4}, nullptr},
      {"empty", DType::kU8, {0, 4}, {}, nullptr},
  };
  entries.push_back({"m.filled", DType::kU8, {3}, {}, [](std::span<uint8_t> d) {
                       for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(10 + i);
                       return absl::OkStatus();
                     }});
  SafetensorsWriteOptions opts;
  opts.metadata = {{"format", "pt"}, {"producer", "refitd"}};
  const std::string path = TempPath("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, entries, opts).ok());
  std::vector<uint8_t> raw = ReadAll(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | raw[i];
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_len + 12 + 4 + 0 + 3);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const SafetensorsView& v = (*f)->view();
  ASSERT_EQ(v.tensors().size(), 4u);
  EXPECT_EQ(v.tensors()[0].name, "z.weight");
  EXPECT_EQ(v.tensors()[1].name, "a.scale");
  EXPECT_EQ(v.metadata(), opts.metadata);
  const SafetensorsEntry* z = v.Find("z.weight");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->dtype, DType::kBF16);
  EXPECT_EQ(z->shape, (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(v.Data(*z).data(), a.data(), 12), 0);
  EXPECT_EQ(v.Find("a.scale")->shape, Shape{});
  EXPECT_EQ(v.Data(*v.Find("m.filled"))[2], 12);
  EXPECT_EQ(v.Find("missing"), nullptr);
}

TEST(SafetensorsTest, SortedOrderAndWriterErrors) {
  std::vector<uint8_t> one = {7};
  std::vector<SafetensorsWriteEntry> entries = {{"b", DType::kU8, {1}, one, nullptr},
                                                {"a", DType::kU8, {1}, one, nullptr}};
  SafetensorsWriteOptions opts;
  opts.order = HeaderOrder::kSortedByName;
  const std::string path = TempPath("sorted.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, entries, opts).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->view().tensors()[0].name, "a");
  EXPECT_EQ((*f)->view().tensors()[0].begin, 0u);

  entries[1].name = "b";
  ExpectError(WriteSafetensors(path, entries), {"'b'", "duplicate"});
  entries[1].name = "a";
  entries[1].shape = {2};
  ExpectError(WriteSafetensors(path, entries), {"'a'", "needs 2 bytes"});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsTest, RejectsTruncatedAndOversizedHeaders) {
  std::vector<uint8_t> tiny = {1, 2, 3};
  ExpectError(SafetensorsView::Parse(tiny).status(), {"too short"});
  std::vector<uint8_t> file = Build("{}", 0);
  file[0] = 200;  // header length past the end
  ExpectError(SafetensorsView::Parse(file).status(), {"runs past the end"});
  std::vector<uint8_t> huge(16, 0);
  huge[7] = 0x7F;  // ~9e18
  ExpectError(SafetensorsView::Parse(huge).status(), {"exceeds the limit"});
  SafetensorsLimits small;
  small.max_header_bytes = 8;
  ExpectError(ParseError(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, small), {"exceeds the limit"});
}

TEST(SafetensorsTest, RejectsBadJson) {
  ExpectError(ParseError(R"({"a": {"dtype": )", 0), {"not valid JSON"});
  ExpectError(ParseError("[1, 2]", 0), {"not a JSON object"});
  ExpectError(ParseError(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
              {"duplicate header key 'a'"});
  ExpectError(ParseError(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'"});
  ExpectError(ParseError(R"({"a":[1]})", 0), {"'a'", "not a JSON object"});
  ExpectError(ParseError(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1), {"'a'", "unexpected field 'x'"});
}

TEST(SafetensorsTest, RejectsBadEntries) {
  ExpectError(ParseError(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1), {"'w'", "unknown dtype 'Q7'"});
  ExpectError(ParseError(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"'w'", "non-negative"});
  ExpectError(ParseError(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), {"'w'", "non-negative"});
  ExpectError(ParseError(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), {"'w'", "needs 12 bytes", "span 8"});
  ExpectError(ParseError(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 2), {"'w'", "run past the data section"});
  ExpectError(ParseError(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}})", 3), {"'w'", "reversed"});
  ExpectError(ParseError(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0]}})", 4), {"'w'", "two integers"});
  ExpectError(ParseError(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,0]}})", 0),
              {"'w'", "overflows"});
  ExpectError(ParseError(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1), {"'w'", "dtype"});
  ExpectError(ParseError(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}})", 1), {"'w'"});
}

TEST(SafetensorsTest, RejectsOverlapsGapsAndTrailingBytes) {
  ExpectError(ParseError(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6),
              {"'b'", "overlap tensor 'a'"});
  ExpectError(ParseError(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", 6),
              {"'b'", "gap of 2 bytes"});
  ExpectError(ParseError(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5), {"3 trailing bytes"});
  EXPECT_TRUE(ParseError(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )", 2).ok());
}

TEST(SafetensorsTest, OpenMissingFile) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(TempPath("does-not-exist"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("does-not-exist"), std::string::npos);
}

}  // namespace
}  // namespace refit::formats
