// The trainer's amax measurement (AmaxMeter, single-pass NVFP4): host tensors with the CPU
// reference, device tensors with refitd's amax kernel on the trainer's GPU (skips without one),
// and the amax's trip through the wire's TensorDesc.
#include "client/amax_meter.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "capnp/message.h"
#include "formats/format.h"
#include "gtest/gtest.h"
#include "proto/wire.h"

#if REFIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "../cuda_device.h"
#endif

namespace refit::client {
namespace {

std::vector<uint16_t> Bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    out.push_back(static_cast<uint16_t>(b >> 16));
  }
  return out;
}

TensorDesc Desc(DType dtype, int64_t n) {
  TensorDesc d;
  d.name = "w";
  d.dtype = dtype;
  d.shape = {n};
  d.nbytes = static_cast<uint64_t>(n) * DTypeSize(dtype);
  return d;
}

TEST(AmaxMeter, HostBf16TensorsGetTheReferenceAmax) {
  AmaxMeter meter;
  std::vector<uint16_t> x = Bf16({0.5f, -3.25f, 1.0f, 2.0f});
  std::vector<TensorDesc> bucket = {Desc(DType::kBF16, 4)};
  ASSERT_TRUE(meter.Measure(bucket[0], x.data(), 0).ok());
  ASSERT_TRUE(meter.Collect(bucket).ok());
  ASSERT_TRUE(bucket[0].amax.has_value());
  EXPECT_EQ(*bucket[0].amax, 3.25f);
}

TEST(AmaxMeter, OtherDtypesAndNonFiniteInputGetNone) {
  AmaxMeter meter;
  std::vector<float> f = {1.0f, 2.0f};
  std::vector<uint16_t> nan = Bf16({1.0f, std::nanf("")});
  std::vector<TensorDesc> bucket = {Desc(DType::kF32, 2), Desc(DType::kBF16, 2)};
  ASSERT_TRUE(meter.Measure(bucket[0], f.data(), 0).ok());
  ASSERT_TRUE(meter.Measure(bucket[1], nan.data(), 1).ok());
  ASSERT_TRUE(meter.Collect(bucket).ok());
  EXPECT_FALSE(bucket[0].amax.has_value());
  EXPECT_FALSE(bucket[1].amax.has_value());
}

TEST(AmaxMeter, TheAmaxTravelsInTheWiresTensorDesc) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<proto::TensorDesc>();
  TensorDesc d = Desc(DType::kBF16, 4);
  wire::ToWire(d, b);
  EXPECT_FALSE(wire::FromWire(b.asReader())->amax.has_value());
  d.amax = 0.0f;  // a supplied 0 is an amax, not its absence
  wire::ToWire(d, b);
  ASSERT_TRUE(wire::FromWire(b.asReader())->amax.has_value());
  EXPECT_EQ(*wire::FromWire(b.asReader())->amax, 0.0f);
  d.amax = 7.5f;
  wire::ToWire(d, b);
  EXPECT_EQ(*wire::FromWire(b.asReader())->amax, 7.5f);
}

#if REFIT_HAVE_CUDA
TEST(AmaxMeter, DeviceTensorsGetTheKernelsAmaxOncePerBucket) {
  REFIT_SKIP_WITHOUT_GPU();
  std::vector<float> values;
  for (int i = 0; i < 4096; ++i) values.push_back(std::sin(static_cast<float>(i)) * (i == 977 ? 9.0f : 1.0f));
  std::vector<uint16_t> x = Bf16(values);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, x.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  const float want = *formats::Amax({DType::kBF16, {4096}, x.data()}, {}, "w");
  AmaxMeter meter;
  // More device tensors than the first float block holds, mixed with a host tensor.
  std::vector<TensorDesc> bucket;
  for (int i = 0; i < 300; ++i) bucket.push_back(Desc(DType::kBF16, 4096));
  for (size_t i = 0; i < bucket.size(); ++i) {
    ASSERT_TRUE(meter.Measure(bucket[i], i == 5 ? static_cast<const void*>(x.data()) : dev, i).ok());
  }
  ASSERT_TRUE(meter.Collect(bucket).ok());
  for (const TensorDesc& d : bucket) {
    ASSERT_TRUE(d.amax.has_value());
    EXPECT_EQ(*d.amax, want);
  }
  cudaFree(dev);
}
#endif

}  // namespace
}  // namespace refit::client
