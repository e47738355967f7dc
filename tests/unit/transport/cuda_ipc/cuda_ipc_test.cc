// The CUDA IPC transport's own guarantees, beyond the conformance suite: each device buffer is
// exported once however many messages come from it, host sources share one bounce buffer, a Send
// returns only once the receiver's copy out of the buffer has completed, ReceiveOrLend lends the
// sender's bytes (nothing copied) and releases the sender only at GiveBack (also when its peer is
// disconnected meanwhile), Post starts a send on the calling thread and Finish waits for it, CUDA
// virtual memory goes as descriptors of its pieces and is lent in place, and endpoint strings.
// GPU cases skip, saying why, without a CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "../../cuda_device.h"
#include "../../cuda_vmm.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "transport/cuda_ipc/cuda_ipc_handles.h"
#include "transport/cuda_ipc/cuda_ipc_receiver.h"
#include "transport/cuda_ipc/cuda_ipc_sender.h"

namespace refit::transport {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

class CudaIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REFIT_SKIP_WITHOUT_GPU();
    auto r = CudaIpcReceiver::Listen(CudaIpcOptions{});
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
    auto s = CudaIpcSender::Connect(receiver_->Endpoint(), CudaIpcOptions{});
    ASSERT_TRUE(s.ok()) << s.status();
    sender_ = std::move(*s);
  }
  void TearDown() override {
    for (void* p : device_) cudaFree(p);
  }
  uint8_t* DeviceBuffer(uint64_t bytes, uint8_t fill) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    cudaMemset(p, fill, bytes);
    cudaDeviceSynchronize();
    device_.push_back(p);
    return static_cast<uint8_t*>(p);
  }
  std::unique_ptr<CudaIpcReceiver> receiver_;
  std::unique_ptr<CudaIpcSender> sender_;
  std::vector<void*> device_;
};

TEST_F(CudaIpcTest, EachDeviceBufferIsExportedOnceForAllItsMessages) {
  constexpr uint64_t kBytes = 4 << 20;
  uint8_t* bucket[2] = {DeviceBuffer(kBytes, 0x11), DeviceBuffer(kBytes, 0x22)};
  uint8_t* slot = DeviceBuffer(kBytes, 0);
  std::thread send([&] {
    for (uint64_t i = 0; i < 10; ++i) {
      // Whole buckets and parts at an offset: one export per allocation either way.
      const uint64_t offset = i % 3 == 0 ? 4096 : 0;
      ASSERT_TRUE(sender_->Send(i, bucket[i % 2] + offset, kBytes - offset).ok());
    }
  });
  std::vector<uint8_t> host(kBytes);
  for (uint64_t i = 0; i < 10; ++i) {
    const uint64_t offset = i % 3 == 0 ? 4096 : 0;
    auto got = receiver_->Receive(i, slot, kBytes, Soon());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, kBytes - offset);
    ASSERT_EQ(cudaMemcpy(host.data(), slot, *got, cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint64_t b = 0; b < *got; b += 4099) ASSERT_EQ(host[b], i % 2 == 0 ? 0x11 : 0x22) << "message " << i;
  }
  send.join();
  EXPECT_EQ(sender_->exports(), 2u);
}

// A trainer that frees its buffer and sends from a new one: the freed one is forgotten when the
// new one is exported, so the receiver does not keep the freed memory mapped (and allocated).
TEST_F(CudaIpcTest, AFreedBufferIsForgottenWhenTheNextIsExported) {
  constexpr uint64_t kBytes = 1 << 20;
  uint8_t* slot = DeviceBuffer(kBytes, 0);
  std::vector<uint8_t> host(kBytes);
  for (uint64_t i = 0; i < 3; ++i) {
    void* weights = nullptr;
    ASSERT_EQ(cudaMalloc(&weights, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(weights, static_cast<int>(0x30 + i), kBytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::thread send([&] { ASSERT_TRUE(sender_->Send(i, weights, kBytes).ok()); });
    auto got = receiver_->Receive(i, slot, kBytes, Soon());
    send.join();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(cudaMemcpy(host.data(), slot, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host[kBytes / 2], 0x30 + i) << "message " << i;
    EXPECT_EQ(sender_->live_exports(), 1u) << "message " << i << ": the freed buffers were not forgotten";
    ASSERT_EQ(cudaFree(weights), cudaSuccess);
  }
  EXPECT_EQ(sender_->exports(), 3u);
}

TEST_F(CudaIpcTest, HostSourcesShareOneBounceBuffer) {
  std::vector<uint8_t> data(1 << 16, 0x5A);
  std::thread send([&] {
    for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(sender_->Send(i, data.data(), data.size()).ok());
  });
  std::vector<uint8_t> out(data.size());
  for (uint64_t i = 0; i < 5; ++i) {
    auto got = receiver_->Receive(i, out.data(), out.size(), Soon());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(out, data);
  }
  send.join();
  EXPECT_EQ(sender_->exports(), 1u);
}

// The producer is released only after the consumer has copied the bucket out: a bucket larger
// than the eager limit keeps Send blocked until its Receive has run.
TEST_F(CudaIpcTest, SendReturnsOnlyAfterTheReceiverCopiedTheBucket) {
  constexpr uint64_t kBytes = 8 << 20;  // > eager_bytes
  uint8_t* bucket = DeviceBuffer(kBytes, 0x33);
  uint8_t* slot = DeviceBuffer(kBytes, 0);
  std::atomic<bool> sent{false};
  std::thread send([&] {
    ASSERT_TRUE(sender_->Send(1, bucket, kBytes).ok());
    sent = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(sent) << "Send returned before any Receive was posted";
  auto got = receiver_->Receive(1, slot, kBytes, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  send.join();
  EXPECT_TRUE(sent);
  // Overwriting the bucket now cannot change what was received.
  cudaMemset(bucket, 0x44, kBytes);
  cudaDeviceSynchronize();
  std::vector<uint8_t> host(kBytes);
  ASSERT_EQ(cudaMemcpy(host.data(), slot, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 0x33);
  EXPECT_EQ(host.back(), 0x33);
}

TEST_F(CudaIpcTest, ReceiveOrLendLendsTheSendersBytesAndReleasesItOnlyAtGiveBack) {
  constexpr uint64_t kBytes = 8 << 20;
  uint8_t* bucket = DeviceBuffer(kBytes, 0x55);
  uint8_t* slot = DeviceBuffer(kBytes, 0);
  std::atomic<bool> sent{false};
  std::thread send([&] {
    ASSERT_TRUE(sender_->Send(7, bucket, kBytes).ok());
    sent = true;
  });
  auto got = receiver_->ReceiveOrLend(7, slot, kBytes, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NE(got->loan, 0u);
  EXPECT_EQ(got->bytes, kBytes);
  EXPECT_EQ(got->data, bucket);  // a sender in this process: its own address
  std::vector<uint8_t> host(kBytes);
  ASSERT_EQ(cudaMemcpy(host.data(), got->data, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 0x55);
  EXPECT_EQ(host.back(), 0x55);
  ASSERT_EQ(cudaMemcpy(host.data(), slot, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 0) << "a lent message was copied into the slot";
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(sent) << "the sender was released while its bytes were lent";
  receiver_->GiveBack(got->loan);
  send.join();
  EXPECT_TRUE(sent);
}

// Post starts the send on the calling thread: the receiver takes the message before anything
// waits for it, and Finish then returns once the copy completed. A host source, which needs the
// bounce buffer, is not posted (nothing sent) and goes by Send; messages after a posted one are
// matched with their own releases.
TEST_F(CudaIpcTest, PostStartsTheSendOnTheCallingThreadAndFinishWaitsForTheRelease) {
  constexpr uint64_t kBytes = 8 << 20;  // > eager_bytes
  uint8_t* bucket = DeviceBuffer(kBytes, 0x66);
  uint8_t* slot = DeviceBuffer(kBytes, 0);
  for (uint64_t i = 0; i < 3; ++i) {
    absl::StatusOr<bool> posted = sender_->Post(i, bucket, kBytes);
    ASSERT_TRUE(posted.ok()) << posted.status();
    ASSERT_TRUE(*posted) << "message " << i;
    // Nothing else runs: the frame went out in Post.
    auto got = receiver_->Receive(i, slot, kBytes, Soon());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, kBytes);
    ASSERT_TRUE(sender_->Finish().ok());
    std::vector<uint8_t> host(kBytes);
    ASSERT_EQ(cudaMemcpy(host.data(), slot, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host[kBytes / 3], 0x66) << "message " << i;
  }
  EXPECT_EQ(sender_->exports(), 1u);

  std::vector<uint8_t> data(1 << 16, 0x7B);
  absl::StatusOr<bool> posted = sender_->Post(9, data.data(), data.size());
  ASSERT_TRUE(posted.ok()) << posted.status();
  EXPECT_FALSE(*posted) << "a host source was posted (its bounce copy would block the caller)";
  std::thread send([&] { ASSERT_TRUE(sender_->Send(9, data.data(), data.size()).ok()); });
  std::vector<uint8_t> out(data.size());
  auto got = receiver_->Receive(9, out.data(), out.size(), Soon());
  send.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(out, data);

  // A posted message lent by the receiver: Finish waits for the give-back.
  ASSERT_TRUE(sender_->Post(10, bucket, kBytes).value_or(false));
  auto lent = receiver_->ReceiveOrLend(10, slot, kBytes, Soon());
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(lent->data, bucket);
  std::atomic<bool> finished{false};
  std::thread finish([&] {
    ASSERT_TRUE(sender_->Finish().ok());
    finished = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(finished) << "Finish returned while the bytes were lent";
  receiver_->GiveBack(lent->loan);
  finish.join();
  EXPECT_TRUE(finished);
}

// CUDA virtual memory in two pieces (as expandable segments grow): a message spanning both is
// exported once as a run of two descriptors, imported by the receiver and lent from there (not
// copied, not bounced); later messages inside the run reuse it. Memory made without the POSIX
// descriptor handle type cannot be exported: it is bounced, and still arrives.
TEST_F(CudaIpcTest, VirtualMemoryGoesAsDescriptorsOfItsPiecesAndIsLentInPlace) {
  testing::CudaVmm weights(4 << 20, 2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (!weights.ok()) GTEST_SKIP() << weights.why();
  const uint64_t piece = weights.piece();
  std::vector<uint8_t> pattern(weights.size());
  for (uint64_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 131 + i / 4096);
  ASSERT_EQ(cudaMemcpy(weights.data(), pattern.data(), pattern.size(), cudaMemcpyHostToDevice), cudaSuccess);
  uint8_t* slot = DeviceBuffer(weights.size(), 0);
  struct Case {
    uint64_t offset, bytes;
  };
  // Across the boundary of the pieces; inside the first; inside the second.
  const std::vector<Case> cases{{piece / 2, piece}, {4096, piece / 4}, {piece + 8192, piece / 2}};
  for (uint64_t i = 0; i < cases.size(); ++i) {
    const Case c = cases[i];
    std::thread send([&] { ASSERT_TRUE(sender_->Send(i, weights.data() + c.offset, c.bytes).ok()); });
    auto got = receiver_->ReceiveOrLend(i, slot, weights.size(), Soon());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NE(got->loan, 0u) << "message " << i << " was copied, not lent";
    EXPECT_NE(got->data, weights.data() + c.offset) << "message " << i << ": the sender's address, not an import";
    std::vector<uint8_t> host(c.bytes);
    ASSERT_EQ(cudaMemcpy(host.data(), got->data, c.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(std::equal(host.begin(), host.end(), pattern.begin() + static_cast<int64_t>(c.offset)))
        << "message " << i << ": the bytes differ from the sender's";
    receiver_->GiveBack(got->loan);
    send.join();
  }
  EXPECT_EQ(sender_->vmm_exports(), 1u);
  EXPECT_EQ(sender_->exports(), 1u);
  // Without the POSIX descriptor handle type: bounced (a cudaMalloc'd buffer, exported once).
  testing::CudaVmm plain(1 << 20, 1, CU_MEM_HANDLE_TYPE_NONE);
  if (!plain.ok()) GTEST_SKIP() << plain.why();
  ASSERT_EQ(cudaMemset(plain.data(), 0x5C, plain.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::thread send([&] { ASSERT_TRUE(sender_->Send(9, plain.data(), plain.size()).ok()); });
  auto got = receiver_->Receive(9, slot, weights.size(), Soon());
  send.join();
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<uint8_t> host(plain.size());
  ASSERT_EQ(cudaMemcpy(host.data(), slot, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 0x5C);
  EXPECT_EQ(host.back(), 0x5C);
  EXPECT_EQ(sender_->vmm_exports(), 1u);
  EXPECT_EQ(sender_->exports(), 2u);  // the bounce buffer
}

TEST_F(CudaIpcTest, ASenderDisconnectedWhileLentStaysBlockedUntilGiveBack) {
  constexpr uint64_t kBytes = 8 << 20;
  uint8_t* bucket = DeviceBuffer(kBytes, 0x66);
  uint8_t* slot = DeviceBuffer(kBytes, 0);
  std::atomic<bool> returned{false};
  absl::Status st;
  std::thread send([&] {
    st = sender_->Send(8, bucket, kBytes);
    returned = true;
  });
  auto got = receiver_->ReceiveOrLend(8, slot, kBytes, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_NE(got->loan, 0u);
  receiver_->DisconnectPeers();  // as an aborted session does
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(returned) << "the sender could reuse its buffer while refitd still reads it";
  receiver_->GiveBack(got->loan);
  send.join();
  EXPECT_FALSE(st.ok()) << "a dropped sender's Send fails (it reconnects for its next session)";
}

TEST(CudaIpcEndpointTest, FormatAndParse) {
  EXPECT_EQ(cuda_ipc::FormatEndpoint("@x"), "cuda_ipc:@x");
  auto s = cuda_ipc::ParseEndpoint("cuda_ipc:/run/refitd/ipc.sock");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "/run/refitd/ipc.sock");
  EXPECT_EQ(cuda_ipc::ParseEndpoint("cuda_ipc:").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_ipc::ParseEndpoint("ucx:tcp:1.2.3.4:5").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaIpcEndpointTest, ConnectToANameNobodyListensOnFails) {
  auto s = CudaIpcSender::Connect("cuda_ipc:@refitd-cuda-ipc-nobody-listens", CudaIpcOptions{});
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace refit::transport
