// Test helpers for GPU tests: skip when no CUDA device is present, owning device and pinned host
// buffers.
// Thread-compatible.
#ifndef REFIT_TESTS_UNIT_KERNELS_DEVICE_TEST_UTIL_H_
#define REFIT_TESTS_UNIT_KERNELS_DEVICE_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../cuda_device.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace refit::kernels::testing {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, int poison = 0xA5) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_ + 16), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, poison, bytes_ + 16), cudaSuccess);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void Upload(const void* src, size_t n, size_t offset = 0) {
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, n, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<uint8_t> Download(size_t n, size_t offset = 0) const {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), static_cast<const char*>(ptr_) + offset, n, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Page-locked host memory (the descriptor tables of batched launches are copied from it).
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) { EXPECT_EQ(cudaMallocHost(&ptr_, bytes == 0 ? 1 : bytes), cudaSuccess); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { cudaFreeHost(ptr_); }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

}  // namespace refit::kernels::testing

#endif  // REFIT_TESTS_UNIT_KERNELS_DEVICE_TEST_UTIL_H_
