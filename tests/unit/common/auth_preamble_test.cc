#include "common/auth_preamble.h"

#include "gtest/gtest.h"

namespace refit {
namespace {

TEST(AuthPreambleTest, RoundTrip) {
  std::string p = AuthPreamble("0123456789abcdef-token");
  ASSERT_EQ(p.size(), 8u + 22u);
  absl::StatusOr<uint32_t> n = ParseAuthHead(reinterpret_cast<const uint8_t*>(p.data()));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 22u);
  EXPECT_EQ(p.substr(8), "0123456789abcdef-token");
}

TEST(AuthPreambleTest, RefusesBadHeads) {
  const uint8_t capnp_first[8] = {0, 0, 0, 0, 5, 0, 0, 0};  // a Cap'n Proto segment table
  EXPECT_EQ(ParseAuthHead(capnp_first).status().code(), absl::StatusCode::kPermissionDenied);
  std::string tls_hello = "\x16\x03\x01\x02\x00\x01\x00\x01";  // a TLS ClientHello on a plain listener
  EXPECT_FALSE(ParseAuthHead(reinterpret_cast<const uint8_t*>(tls_hello.data())).ok());
  std::string huge = AuthPreamble(std::string(kMaxTokenBytes + 1, 'x'));
  EXPECT_FALSE(ParseAuthHead(reinterpret_cast<const uint8_t*>(huge.data())).ok());
}

TEST(AuthPreambleTest, EmptyTokenIsWellFormed) {
  // Clients without a token still send the preamble; refitd decides whether that suffices.
  std::string empty = AuthPreamble("");
  absl::StatusOr<uint32_t> n = ParseAuthHead(reinterpret_cast<const uint8_t*>(empty.data()));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u);
}

TEST(AuthPreambleTest, TokensEqual) {
  EXPECT_TRUE(TokensEqual("abc", "abc"));
  EXPECT_FALSE(TokensEqual("abc", "abd"));
  EXPECT_FALSE(TokensEqual("abc", "abcd"));
  EXPECT_FALSE(TokensEqual("", "a"));
  EXPECT_TRUE(TokensEqual("", ""));
}

TEST(AuthPreambleTest, TcpAddresses) {
  EXPECT_FALSE(IsTcpAddress("unix:/run/refitd/refitd.sock"));
  EXPECT_TRUE(IsTcpAddress("127.0.0.1:7400"));
  EXPECT_TRUE(IsTcpAddress("[::1]:7400"));
}

}  // namespace
}  // namespace refit
