// TransportRegistry: registration rules and lookups, with fake descriptors (no transport runs).
#include "transport/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/builtin_transports.h"

namespace refit::transport {
namespace {

using ::testing::HasSubstr;

TransportDescriptor Fake(std::string name, std::string scheme) {
  TransportDescriptor d;
  d.name = std::move(name);
  d.scheme = std::move(scheme);
  d.listen = [](const ListenConfig&) -> absl::StatusOr<std::unique_ptr<Receiver>> {
    return absl::UnimplementedError("fake");
  };
  d.connect = [](const std::string&, const ConnectConfig&) -> absl::StatusOr<std::unique_ptr<Sender>> {
    return absl::UnimplementedError("fake");
  };
  d.bucket_memory = [](int) -> absl::StatusOr<std::unique_ptr<storage::Memory>> { return storage::NewHostMemory(); };
  return d;
}

TEST(TransportRegistryTest, FindsByNameAndByEndpointScheme) {
  TransportRegistry r;
  ASSERT_TRUE(r.Add(Fake("alpha", "alpha:")).ok());
  ASSERT_TRUE(r.Add(Fake("beta", "beta:")).ok());
  EXPECT_EQ(r.Default().name, "alpha");
  ASSERT_NE(r.Find("beta"), nullptr);
  EXPECT_EQ(r.Find("gamma"), nullptr);
  ASSERT_NE(r.FindByEndpoint("beta:127.0.0.1:4000"), nullptr);
  EXPECT_EQ(r.FindByEndpoint("beta:127.0.0.1:4000")->name, "beta");
  EXPECT_EQ(r.FindByEndpoint("gamma:127.0.0.1:4000"), nullptr);
  EXPECT_EQ(r.Names(), "alpha, beta");
}

TEST(TransportRegistryTest, RefusesTakenNamesAndOverlappingSchemes) {
  TransportRegistry r;
  ASSERT_TRUE(r.Add(Fake("alpha", "alpha:")).ok());
  EXPECT_THAT(r.Add(Fake("alpha", "other:")).message(), HasSubstr("registered twice"));
  EXPECT_THAT(r.Add(Fake("alpha2", "alpha:x")).message(), HasSubstr("overlapping"));
}

TEST(TransportRegistryTest, RefusesMissingFactories) {
  TransportDescriptor d = Fake("alpha", "alpha:");
  d.bucket_memory = nullptr;
  TransportRegistry r;
  EXPECT_EQ(r.Add(d).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransportRegistryTest, DevicePayloadsMustCheckIntegrity) {
  TransportDescriptor d = Fake("gpu", "gpu:");
  d.payload_memory = storage::MemoryKind::kDevice;
  TransportRegistry r;
  EXPECT_THAT(r.Add(d).message(), HasSubstr("checks_integrity"));
  d.checks_integrity = true;
  EXPECT_TRUE(r.Add(d).ok());
}

TEST(TransportRegistryTest, ConfigKeysOfEveryTransport) {
  TransportDescriptor a = Fake("alpha", "alpha:");
  a.config_keys = {{"alpha_mode", "fast"}};
  TransportDescriptor b = Fake("beta", "beta:");
  b.config_keys = {{"beta_lanes", "2"}};
  TransportRegistry r;
  ASSERT_TRUE(r.Add(a).ok());
  ASSERT_TRUE(r.Add(b).ok());
  EXPECT_THAT(r.ConfigKeys(), ::testing::ElementsAre("alpha_mode", "beta_lanes"));
}

TEST(TransportRegistryTest, BuiltinTransportsStartWithTheHostDefault) {
  const TransportRegistry r = BuiltinTransports();
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r.Default().payload_memory, storage::MemoryKind::kHost);
  for (const TransportDescriptor& d : r.descriptors()) {
    EXPECT_EQ(r.FindByEndpoint(d.scheme), &d) << d.name;
  }
}

}  // namespace
}  // namespace refit::transport
