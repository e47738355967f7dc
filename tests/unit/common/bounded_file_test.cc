#include "common/bounded_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() / (leaf + "." + std::to_string(getpid()))).string();
}

void WriteFile(const std::string& path, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out << std::string(bytes, 'x');
}

TEST(BoundedFileTest, ReadsAFileUpToTheLimit) {
  const std::string path = TempPath("bounded_ok");
  WriteFile(path, 100);
  absl::StatusOr<std::string> text = ReadBoundedFile(path, 100, "config");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->size(), 100u);
  std::remove(path.c_str());
}

TEST(BoundedFileTest, RefusesALargerFileNamingItAndTheLimit) {
  const std::string path = TempPath("bounded_big");
  WriteFile(path, 3 << 20);
  absl::StatusOr<std::string> text = ReadBoundedFile(path, 1 << 20, "config");
  ASSERT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("config '" + path + "' is 3 MiB, over the limit of 1 MiB"));
  std::remove(path.c_str());
}

TEST(BoundedFileTest, RefusesDevZeroAndDirectoriesAndFifos) {
  absl::StatusOr<std::string> zero = ReadBoundedFile("/dev/zero", 1 << 20, "checkpoint.quant_config");
  EXPECT_THAT(zero.status().message(),
              HasSubstr("checkpoint.quant_config '/dev/zero' is not a regular file (a character device)"));
  EXPECT_THAT(ReadBoundedFile("/tmp", 1 << 20, "model spec").status().message(), HasSubstr("(a directory)"));
  const std::string fifo = TempPath("bounded_fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Opening must not wait for a writer.
  EXPECT_THAT(ReadBoundedFile(fifo, 1 << 20, "tls.cert").status().message(), HasSubstr("(a FIFO)"));
  std::remove(fifo.c_str());
}

TEST(BoundedFileTest, MissingFileIsNotFound) {
  absl::StatusOr<std::string> text = ReadBoundedFile("/nonexistent/refitd.yaml", 10, "config");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(text.status().message(), HasSubstr("cannot read config '/nonexistent/refitd.yaml'"));
}

}  // namespace
}  // namespace refit
