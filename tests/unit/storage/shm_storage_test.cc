// Host storage classes against real POSIX shared memory: regions, the engine storage's bounds
// checks (every refusal names the parameter), writes landing at the registered offsets and
// nowhere else, and plain host memory.
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/memory.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"

namespace refit::storage {
namespace {

using ::testing::HasSubstr;

std::string Name(const char* what) {
  static int n = 0;
  return absl::StrCat("/refit-storage-test-", getpid(), "-", what, "-", n++);
}

TEST(ShmRegionTest, CreateZeroFillsOpenSharesAndTheCreatorUnlinks) {
  const std::string name = Name("region");
  {
    absl::StatusOr<std::unique_ptr<ShmRegion>> a = ShmRegion::Create(name, 4096);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->size(), 4096u);
    for (uint64_t i = 0; i < 4096; ++i) ASSERT_EQ((*a)->data()[i], 0) << i;
    EXPECT_FALSE(ShmRegion::Create(name, 4096).ok());  // exists
    absl::StatusOr<std::unique_ptr<ShmRegion>> b = ShmRegion::Open(name);
    ASSERT_TRUE(b.ok()) << b.status();
    (*a)->data()[17] = 42;
    EXPECT_EQ((*b)->data()[17], 42);  // one memory, two mappings
  }
  EXPECT_FALSE(ShmRegion::Open(name).ok());  // unlinked with its creator
}

class ShmEngineStorageTest : public ::testing::Test {
 protected:
  void SetUp() override { region_ = *ShmRegion::Create(name_, 1024); }
  ParamInfo Info(const std::string& n, uint64_t bytes) { return {n, DType::kBF16, {static_cast<int64_t>(bytes / 2)}, bytes}; }
  const std::string name_ = Name("engine");
  std::unique_ptr<ShmRegion> region_;
};

TEST_F(ShmEngineStorageTest, WritesLandAtTheirOffsetsOnly) {
  absl::StatusOr<std::unique_ptr<ShmEngineStorage>> s =
      ShmEngineStorage::Open({{Info("a", 64), name_, 0}, {Info("b", 128), name_, 512}});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->params().size(), 2u);
  EXPECT_EQ((*s)->params()[1].name, "b");
  EXPECT_FALSE((*s)->on_device());
  std::vector<uint8_t> b(128, 0x5A);
  ASSERT_TRUE((*s)->WriteFromHost(1, b.data()).ok());
  ASSERT_TRUE((*s)->Flush().ok());
  for (uint64_t i = 0; i < 1024; ++i) {
    ASSERT_EQ(region_->data()[i], i >= 512 && i < 640 ? 0x5A : 0) << i;
  }
  std::vector<uint8_t> back(128);
  ASSERT_TRUE((*s)->ReadToHost(1, back.data()).ok());
  EXPECT_EQ(back, b);
  EXPECT_EQ((*s)->WriteFromHost(2, b.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*s)->WriteFromDevice({0, 0, b.data(), b.size()}).code(), absl::StatusCode::kUnimplemented);
}

TEST_F(ShmEngineStorageTest, OutOfBoundsParametersAreRefusedNamingThem) {
  absl::StatusOr<std::unique_ptr<ShmEngineStorage>> past = ShmEngineStorage::Open({{Info("tail", 64), name_, 1000}});
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(), HasSubstr("'tail'"));
  // An offset whose end overflows 64 bits.
  absl::StatusOr<std::unique_ptr<ShmEngineStorage>> wrap =
      ShmEngineStorage::Open({{Info("wrap", 64), name_, ~uint64_t{0} - 8}});
  ASSERT_FALSE(wrap.ok());
  EXPECT_THAT(wrap.status().message(), HasSubstr("'wrap'"));
  // nbytes that does not match dtype × shape.
  ParamInfo lie = Info("lie", 64);
  lie.nbytes = 66;
  absl::StatusOr<std::unique_ptr<ShmEngineStorage>> bad = ShmEngineStorage::Open({{lie, name_, 0}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'lie'"));
  // A region that does not exist.
  absl::StatusOr<std::unique_ptr<ShmEngineStorage>> missing =
      ShmEngineStorage::Open({{Info("m", 64), Name("missing"), 0}});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("'m'"));
}

TEST(HostMemoryTest, AllocatesAndCopies) {
  std::unique_ptr<Memory> m = NewHostMemory();
  EXPECT_EQ(m->kind(), MemoryKind::kHost);
  absl::StatusOr<std::shared_ptr<uint8_t>> a = m->Allocate(256);
  absl::StatusOr<std::shared_ptr<uint8_t>> b = m->Allocate(256);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> src(256);
  for (int i = 0; i < 256; ++i) src[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(m->CopyFromHost(a->get(), src.data(), 256).ok());
  ASSERT_TRUE(m->CopyWithin(b->get(), a->get(), 256).ok());
  std::vector<uint8_t> out(256);
  ASSERT_TRUE(m->CopyToHost(out.data(), b->get(), 256).ok());
  EXPECT_EQ(out, src);
  // Pinned host memory falls back to plain host memory where no GPU is usable.
  EXPECT_EQ(NewPinnedHostMemory()->kind(), MemoryKind::kHost);
}

}  // namespace
}  // namespace refit::storage
