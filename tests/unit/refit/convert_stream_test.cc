// The streaming, multi-threaded, sharded converter against the in-memory reference path
// (ConvertCheckpoint + WriteConvertedCheckpoint): the same bytes, whatever the thread count;
// shards hold exactly the reference tensors and the index names each one's file.
#include "refit/convert_stream.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "refit/offline.h"

namespace refit {
namespace {

namespace fs = std::filesystem;

constexpr char kSpec[] = R"(model: m
rules:
  - match: "l.{L}.{p:q,k}.weight"
    format: fp8_block128
  - match: "l.{L}.e.{E}.{p:w1,w3}.weight"
    target: "l.{L}.w13"
    format: nvfp4
    fuse: {capture: p, order: [w1, w3]}
    stack: {capture: E, count: 2}
)";

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ConvertStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("convert_stream_test." + std::to_string(getpid()) + "." +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 rng(7);
    std::vector<std::pair<std::string, Shape>> shapes;
    for (int l = 0; l < 3; ++l) {
      shapes.push_back({"l." + std::to_string(l) + ".q.weight", {256, 128}});
      shapes.push_back({"l." + std::to_string(l) + ".k.weight", {128, 256}});
      shapes.push_back({"l." + std::to_string(l) + ".norm.weight", {128}});
      for (int e = 0; e < 2; ++e) {
        for (const char* p : {"w1", "w3"}) {
          shapes.push_back({"l." + std::to_string(l) + ".e." + std::to_string(e) + "." + p + ".weight", {64, 64}});
        }
      }
    }
    std::vector<formats::SafetensorsWriteEntry> entries;
    for (const auto& [name, shape] : shapes) {
      std::vector<uint8_t>& b = bytes_.emplace_back(*DenseBytes(DType::kBF16, shape));
      std::normal_distribution<float> d(0.0f, name.find(".e.") != std::string::npos ? 2.0f : 0.05f);
      for (size_t i = 0; i < b.size(); i += 2) {
        float f = d(rng);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        b[i] = static_cast<uint8_t>(u >> 16);
        b[i + 1] = static_cast<uint8_t>(u >> 24);
      }
      entries.push_back({name, DType::kBF16, shape, b, nullptr});
    }
    ASSERT_TRUE(formats::WriteSafetensors((dir_ / "in.safetensors").string(), entries).ok());
    spec_ = *spec::ParseModelSpec(kSpec);
    auto in = Checkpoint::Open((dir_ / "in.safetensors").string());
    ASSERT_TRUE(in.ok()) << in.status();
    in_ = std::move(*in);
    auto converted = ConvertCheckpoint(spec_, in_->tensors());
    ASSERT_TRUE(converted.ok()) << converted.status();
    reference_ = std::move(*converted);
    ASSERT_TRUE(WriteConvertedCheckpoint((dir_ / "ref").string(), spec_, in_->infos(), reference_).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::vector<std::vector<uint8_t>> bytes_;
  spec::ModelSpec spec_;
  std::unique_ptr<Checkpoint> in_;
  std::vector<ConvertedTensor> reference_;
};

TEST_F(ConvertStreamTest, OneShardIsByteIdenticalToTheInMemoryPathForAnyThreadCount) {
  for (int threads : {1, 2, 5}) {
    const fs::path out = dir_ / ("out" + std::to_string(threads));
    StreamConvertOptions o;
    o.threads = threads;
    int calls = 0;
    o.on_progress = [&](const ConvertProgress& p) {
      EXPECT_EQ(p.tensors_done, static_cast<uint64_t>(calls));
      EXPECT_EQ(p.shards, 1u);
      ++calls;
    };
    auto r = ConvertCheckpointToDir(spec_, *in_, out.string(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->threads, threads);
    EXPECT_EQ(calls, static_cast<int>(reference_.size()) + 1);
    std::vector<std::string> ref_files;
    for (const auto& e : fs::directory_iterator(dir_ / "ref")) ref_files.push_back(e.path().filename().string());
    std::sort(ref_files.begin(), ref_files.end());
    std::vector<std::string> files = r->files;
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, ref_files);
    for (const std::string& f : ref_files) {
      EXPECT_EQ(Read(out / f), Read(dir_ / "ref" / f)) << f << " with " << threads << " threads";
    }
  }
}

TEST_F(ConvertStreamTest, ShardsHoldTheReferenceTensorsAndTheIndexNamesThem) {
  StreamConvertOptions o;
  o.threads = 3;
  o.max_shard_bytes = 40000;  // several tensors per shard; a q/k weight (32 KiB + scales) fills one
  const fs::path out = dir_ / "sharded";
  auto r = ConvertCheckpointToDir(spec_, *in_, out.string(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  const nlohmann::json index = nlohmann::json::parse(Read(out / "model.safetensors.index.json"));
  uint64_t total = 0;
  for (const ConvertedTensor& t : reference_) total += t.bytes.size();
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), reference_.size());
  std::set<std::string> shard_files;
  for (const auto& [name, file] : index["weight_map"].items()) shard_files.insert(file.get<std::string>());
  ASSERT_GT(shard_files.size(), 2u);
  const std::string last = *shard_files.rbegin();
  EXPECT_EQ(last, "model-" + std::string(5 - std::to_string(shard_files.size()).size(), '0') +
                      std::to_string(shard_files.size()) + "-of-" +
                      std::string(5 - std::to_string(shard_files.size()).size(), '0') +
                      std::to_string(shard_files.size()) + ".safetensors");
  for (const std::string& f : shard_files) {
    auto shard = formats::SafetensorsFile::Open((out / f).string());
    ASSERT_TRUE(shard.ok()) << shard.status();
    uint64_t bytes = 0;
    for (const formats::SafetensorsEntry& e : (*shard)->view().tensors()) {
      EXPECT_EQ(index["weight_map"][e.name], f) << e.name;
      bytes += e.end - e.begin;
    }
    // At most the limit, unless one tensor alone is larger.
    EXPECT_TRUE(bytes <= o.max_shard_bytes || (*shard)->view().tensors().size() == 1) << f << ": " << bytes;
  }
  auto back = Checkpoint::Open(out.string());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ((*back)->tensors().size(), reference_.size());
  for (const ConvertedTensor& t : reference_) {
    const InputTensor* got = (*back)->Find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->dtype, t.dtype) << t.name;
    EXPECT_EQ(got->shape, t.shape) << t.name;
    EXPECT_EQ(std::memcmp(got->data, t.bytes.data(), t.bytes.size()), 0) << t.name;
  }
  // The quantization metadata is written beside the shards, as in the one-file case.
  int meta = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "ref")) {
    const std::string f = e.path().filename().string();
    if (f == "model.safetensors") continue;
    ++meta;
    EXPECT_EQ(Read(out / f), Read(e.path())) << f;
  }
  EXPECT_GT(meta, 0);
}

TEST_F(ConvertStreamTest, AnUnresolvableTensorWritesNothing) {
  auto bad = *spec::ParseModelSpec("model: m\nrules:\n  - match: \"l.{L}.norm.weight\"\n    format: fp8_block128\n");
  auto r = ConvertCheckpointToDir(bad, *in_, (dir_ / "bad").string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("l.0.norm.weight"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "model.safetensors"));
}

TEST(ParseByteSizeTest, UnitsAsHuggingFaceTakesThem) {
  EXPECT_EQ(*ParseByteSize("5GB"), 5'000'000'000ull);
  EXPECT_EQ(*ParseByteSize("500MB"), 500'000'000ull);
  EXPECT_EQ(*ParseByteSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5 kb"), 1500ull);
  EXPECT_EQ(*ParseByteSize("123"), 123ull);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "1..2GB"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace refit
