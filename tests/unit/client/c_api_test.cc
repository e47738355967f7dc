// Tests of the C ABI (src/client/c_api.h) through librefit_client.so that need no other process:
// the library's helpers, per-thread errors, a refused connect, and the struct-size versioning
// (client/abi_struct.h). Against a real refitd: tests/integration/c_api/c_api_test.cc.
#include "client/c_api.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "client/abi_struct.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace abi_test {

// A struct as this library would see it in a later ABI version, which added `lanes` (default 4)
// after version 1's last field `count`, and the same struct as a caller compiled against version 1
// passes it: one field shorter.
struct Widget {
  uint32_t struct_size;
  uint64_t count;
  uint32_t lanes;
};
struct WidgetV1 {
  uint32_t struct_size;
  uint64_t count;
};

}  // namespace abi_test

REFIT_ABI_V1_SIZE(abi_test::Widget, count);

namespace {

using ::testing::HasSubstr;

std::string LastError() { return refit_last_error(); }

TEST(CApiTest, LibraryBasics) {
  EXPECT_GE(refit_abi_version(), 1u);
  EXPECT_STREQ(refit_code_name(REFIT_FAILED_PRECONDITION), "FAILED_PRECONDITION");
  EXPECT_STREQ(refit_code_name(999), "UNKNOWN");
  uint64_t bytes = 0;
  const int64_t shape[] = {3, 5};
  ASSERT_EQ(refit_dense_bytes("BF16", shape, 2, &bytes), REFIT_OK);
  EXPECT_EQ(bytes, 30u);
  EXPECT_EQ(refit_dense_bytes("F33", shape, 2, &bytes), REFIT_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(), HasSubstr("F33"));
  const int64_t negative[] = {-1};
  EXPECT_EQ(refit_dense_bytes("F32", negative, 1, &bytes), REFIT_INVALID_ARGUMENT);
  EXPECT_NE(refit_checksum64("ab", 2, 0), refit_checksum64("ac", 2, 0));
}

TEST(CApiTest, LastErrorIsPerThread) {
  uint64_t bytes;
  ASSERT_EQ(refit_dense_bytes("NOPE", nullptr, 0, &bytes), REFIT_INVALID_ARGUMENT);
  std::string other = "unset";
  std::thread([&] { other = refit_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_THAT(LastError(), HasSubstr("NOPE"));
}

TEST(CApiTest, ConnectFailureIsUnavailableAndNamesTheAddress) {
  refit_client* c = reinterpret_cast<refit_client*>(0x1);
  EXPECT_EQ(refit_client_connect("unix:/nonexistent/refitd.sock", &c), REFIT_UNAVAILABLE);
  EXPECT_EQ(c, nullptr);
  EXPECT_THAT(LastError(), HasSubstr("/nonexistent/refitd.sock"));
  EXPECT_EQ(refit_client_connect(nullptr, &c), REFIT_INVALID_ARGUMENT);
}

TEST(CApiStructTest, OlderCallersSmallerStructIsAcceptedAndDefaulted) {
  using abi_test::Widget;
  using abi_test::WidgetV1;
  static_assert(sizeof(WidgetV1) < sizeof(Widget));
  static_assert(refit::client::abi::kV1Size<Widget> == sizeof(WidgetV1));
  WidgetV1 old{sizeof(WidgetV1), 7};
  Widget w{};
  const Widget defaults{0, 0, 4};
  ASSERT_TRUE(refit::client::abi::ReadStruct(reinterpret_cast<const Widget*>(&old), "widget", &w, defaults).ok());
  EXPECT_EQ(w.struct_size, sizeof(WidgetV1));
  EXPECT_EQ(w.count, 7u);
  EXPECT_EQ(w.lanes, 4u);  // not passed: its default
  ASSERT_TRUE(refit::client::abi::ReadStruct(reinterpret_cast<const Widget*>(&old), "widget", &w).ok());
  EXPECT_EQ(w.lanes, 0u);  // zero-filled

  // Arrays of the older struct are its size apart.
  WidgetV1 array[2] = {{sizeof(WidgetV1), 1}, {sizeof(WidgetV1), 2}};
  ASSERT_TRUE(refit::client::abi::ReadElement(reinterpret_cast<const Widget*>(array), 2, 1, "widgets", &w).ok());
  EXPECT_EQ(w.count, 2u);

  // Outputs: only the caller's fields are written.
  struct {
    WidgetV1 v1;
    uint32_t guard;
  } out{{sizeof(WidgetV1), 0}, 0xfeed};
  ASSERT_TRUE(refit::client::abi::WriteStruct(Widget{sizeof(Widget), 9, 5}, "widget", reinterpret_cast<Widget*>(&out.v1)).ok());
  EXPECT_EQ(out.v1.count, 9u);
  EXPECT_EQ(out.v1.struct_size, sizeof(WidgetV1));
  EXPECT_EQ(out.guard, 0xfeedu);

  // Below version 1: refused, naming the field.
  WidgetV1 tiny{4, 0};
  absl::Status st = refit::client::abi::ReadStruct(reinterpret_cast<const Widget*>(&tiny), "widget", &w);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("widget.struct_size is 4"));
}

TEST(CApiStructTest, VersionOneSizesAreFrozenAtTheLastVersionOneField) {
  // Today's structs hold exactly their version-1 fields; the bound is the end of the last one (so
  // trailing padding is not required), and a struct one field shorter than that is refused.
  EXPECT_EQ(refit::client::abi::kV1Size<refit_tensor>, offsetof(refit_tensor, device) + sizeof(int32_t));
  EXPECT_EQ(refit::client::abi::kV1Size<refit_manifest>, offsetof(refit_manifest, deadline_ms) + sizeof(uint32_t));
  EXPECT_LE(refit::client::abi::kV1Size<refit_engine_param>, sizeof(refit_engine_param));
}

}  // namespace
