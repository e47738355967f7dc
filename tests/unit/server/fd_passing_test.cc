// File descriptors over the control plane, with real sockets: an engine agent's CUDA
// virtual-memory parameter (here a memfd standing in for cuMemExportToShareableHandle's
// descriptor) reaches refitd's ControlListener over a Unix socket, where ReadEngineParams takes
// it; over TCP the agent, and refitd for a client that sends one anyway, refuse it naming the
// parameter; the connection limits hold on the descriptor-passing stream.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../refitd_process.h"
#include "capnp/rpc-twoparty.h"
#include "client/engine_agent.h"
#include "common/control_connect.h"
#include "common/fd_passing.h"
#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kj/async-io.h"
#include "proto/refit.capnp.h"
#include "proto/wire.h"
#include "server/control_listener.h"
#include "server/engine_params.h"

namespace refit::server {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "fd-passing-test-token";

// What the test daemon saw: each CUDA virtual-memory parameter's bytes, read through refitd's
// own descriptor, and how many distinct allocations (descriptors) came.
struct Seen {
  std::mutex mu;
  std::map<std::string, std::string> bytes;
  size_t allocations = 0;
  size_t pieces = 0;  // descriptors, over the allocations
};

// A Daemon whose registerEngine reads the parameters as refitd does and reads every
// virtual-memory parameter's bytes back from the descriptor it received.
// `n` bytes at `offset` of an allocation, across its pieces.
std::string ReadAt(const storage::VmmSource& source, uint64_t offset, uint64_t n) {
  std::string bytes;
  uint64_t piece_start = 0;
  for (const storage::VmmSourcePiece& piece : source.pieces) {
    const uint64_t piece_end = piece_start + piece.size;
    while (bytes.size() < n && offset + bytes.size() < piece_end) {
      const uint64_t at = offset + bytes.size() - piece_start;
      const uint64_t take = std::min<uint64_t>(n - bytes.size(), piece.size - at);
      std::string chunk(take, '\0');
      if (pread(piece.fd.get(), chunk.data(), take, static_cast<off_t>(at)) != static_cast<ssize_t>(take)) return "short read";
      bytes += chunk;
    }
    piece_start = piece_end;
  }
  return bytes;
}

class RecordingDaemon final : public proto::Daemon::Server {
 public:
  explicit RecordingDaemon(Seen& seen) : seen_(seen) {}

 protected:
  kj::Promise<void> registerEngine(RegisterEngineContext context) override {
    auto results = context.getResults();
    absl::StatusOr<EngineParamList> params = ReadEngineParams(context.getParams().getParams());
    if (!params.ok()) {
      wire::ToWire(params.status(), results.initStatus());
      return kj::READY_NOW;
    }
    std::lock_guard<std::mutex> lock(seen_.mu);
    std::map<const storage::VmmSource*, int> sources;
    for (const storage::CudaIpcParam& p : params->cuda) {
      if (p.vmm == nullptr) continue;
      if (sources.emplace(p.vmm.get(), 1).second) seen_.pieces += p.vmm->pieces.size();
      seen_.bytes[p.info.name] = ReadAt(*p.vmm, p.offset, p.info.nbytes);
    }
    seen_.allocations = sources.size();
    wire::ToWire(absl::OkStatus(), results.initStatus());
    results.setRegistration(kj::heap<proto::Registration::Server>());
    return kj::READY_NOW;
  }

 private:
  Seen& seen_;
};

// A ControlListener on its own thread and event loop, on a Unix socket or on 127.0.0.1:0.
class Listener {
 public:
  Listener(bool unix_socket, Seen& seen, ConnectionLimits limits = {}) {
    std::promise<std::string> address;
    std::future<std::string> ready = address.get_future();
    thread_ = std::thread([this, unix_socket, &seen, limits, address = std::move(address)]() mutable {
      auto io = kj::setupAsyncIo();
      AccessPolicy policy;
      policy.allowed_uids = {static_cast<uint32_t>(getuid())};
      policy.token = kToken;
      ControlListener listener(kj::heap<RecordingDaemon>(seen), capnp::ReaderOptions(), policy,
                               io.provider->getTimer(), {}, limits);
      std::string where;
      if (unix_socket) {
        dir_ = std::filesystem::temp_directory_path() / ("refit-fd-test-" + std::to_string(getpid()));
        std::filesystem::create_directories(dir_);
        where = "unix:" + (dir_ / "refitd.sock").string();
        std::filesystem::remove(dir_ / "refitd.sock");
      } else {
        where = "127.0.0.1:0";
      }
      auto receiver = io.provider->getNetwork().parseAddress(where).wait(io.waitScope)->listen();
      if (!unix_socket) where = "127.0.0.1:" + std::to_string(receiver->getPort());
      auto stop = kj::newPromiseAndFulfiller<void>();
      {
        std::lock_guard<std::mutex> lock(mu_);
        executor_ = kj::getCurrentThreadExecutor().addRef();
        stop_ = kj::mv(stop.fulfiller);
      }
      address.set_value(where);
      listener.Listen(*receiver, unix_socket).exclusiveJoin(kj::mv(stop.promise)).wait(io.waitScope);
    });
    address_ = ready.get();
  }
  ~Listener() {
    kj::Own<const kj::Executor> executor;
    {
      std::lock_guard<std::mutex> lock(mu_);
      executor = executor_->addRef();
    }
    executor->executeSync([this] { stop_->fulfill(); });
    thread_.join();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  const std::string& address() const { return address_; }

 private:
  std::mutex mu_;
  kj::Own<const kj::Executor> executor_;
  kj::Own<kj::PromiseFulfiller<void>> stop_;
  std::filesystem::path dir_;
  std::string address_;
  std::thread thread_;
};

// An allocation of memfd pieces of `sizes` bytes, byte i of the whole = (i * 7 + seed) mod 251.
std::shared_ptr<client::VmmAllocation> PatternedRun(const std::vector<uint64_t>& sizes, int seed) {
  auto a = std::make_shared<client::VmmAllocation>();
  for (uint64_t size : sizes) {
    client::VmmPiece piece{UniqueFd(memfd_create("refit-fd-test", MFD_CLOEXEC)), size};
    std::string bytes(size, '\0');
    for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(((a->size + i) * 7 + seed) % 251);
    EXPECT_EQ(write(piece.fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(size));
    a->pieces.push_back(std::move(piece));
    a->size += size;
  }
  return a;
}

std::shared_ptr<client::VmmAllocation> PatternedAllocation(uint64_t size, int seed) { return PatternedRun({size}, seed); }

std::string Pattern(uint64_t offset, uint64_t n, int seed) {
  std::string bytes(n, '\0');
  for (uint64_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(((offset + i) * 7 + seed) % 251);
  return bytes;
}

client::CudaParam VmmParam(const std::string& name, std::shared_ptr<client::VmmAllocation> a, uint64_t offset,
                           int64_t floats) {
  client::CudaParam p{name, DType::kF32, {floats}, {}, offset, 0, nullptr};
  p.vmm = std::move(a);
  return p;
}

// An allocation of one memfd piece named `name` (so that its descriptors can be told apart).
std::shared_ptr<client::VmmAllocation> NamedAllocation(const std::string& name, uint64_t size) {
  auto a = std::make_shared<client::VmmAllocation>();
  client::VmmPiece piece{UniqueFd(memfd_create(name.c_str(), MFD_CLOEXEC)), size};
  EXPECT_EQ(ftruncate(piece.fd.get(), static_cast<off_t>(size)), 0);
  a->pieces.push_back(std::move(piece));
  a->size = size;
  return a;
}

// How many descriptors process `pid` holds of memfd `name`.
int DescriptorsOf(pid_t pid, const std::string& name) {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), link_ec).string();
    if (!link_ec && target.find("/memfd:" + name + " ") == 0) ++n;
  }
  return n;
}

// Whether `pred` holds within 5 s (the peer releases asynchronously).
template <typename F>
bool Eventually(F pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class FdPassingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"REFIT_TLS_CA", "REFIT_TLS_CERT", "REFIT_TLS_KEY", "REFIT_TLS_SERVER_NAME", "REFITD_TOKEN_FILE"}) {
      unsetenv(v);
    }
    setenv("REFITD_TOKEN", kToken, 1);
  }
};

TEST_F(FdPassingTest, UnixSocketPassesOneDescriptorPerAllocation) {
  Seen seen;
  Listener listener(/*unix_socket=*/true, seen);
  auto first = PatternedAllocation(8192, 1);
  auto second = PatternedAllocation(4096, 2);
  std::vector<client::CudaParam> params = {VmmParam("a.weight", first, 0, 512), VmmParam("b.weight", first, 4096, 1024),
                                           VmmParam("c.weight", second, 1024, 256)};
  absl::StatusOr<std::unique_ptr<client::EngineAgent>> agent =
      client::EngineAgent::Start(listener.address(), std::move(params), {}, 0);
  ASSERT_TRUE(agent.ok()) << agent.status();
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_EQ(seen.allocations, 2u);
  EXPECT_EQ(seen.bytes["a.weight"], Pattern(0, 2048, 1));
  EXPECT_EQ(seen.bytes["b.weight"], Pattern(4096, 4096, 1));
  EXPECT_EQ(seen.bytes["c.weight"], Pattern(1024, 1024, 2));
}

TEST_F(FdPassingTest, AnAllocationOfSeveralPiecesPassesADescriptorPerPiece) {
  Seen seen;
  Listener listener(/*unix_socket=*/true, seen);
  auto run = PatternedRun({4096, 8192, 4096}, 9);  // a parameter across all three pieces, one inside the second
  std::vector<client::CudaParam> params = {VmmParam("spans.weight", run, 2048, 3072),
                                           VmmParam("inside.weight", run, 5000, 1000)};
  absl::StatusOr<std::unique_ptr<client::EngineAgent>> agent =
      client::EngineAgent::Start(listener.address(), std::move(params), {}, 0);
  ASSERT_TRUE(agent.ok()) << agent.status();
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_EQ(seen.allocations, 1u);
  EXPECT_EQ(seen.pieces, 3u);
  EXPECT_EQ(seen.bytes["spans.weight"], Pattern(2048, 3072 * 4, 9));
  EXPECT_EQ(seen.bytes["inside.weight"], Pattern(5000, 4000, 9));
}

TEST_F(FdPassingTest, AgentRefusesAVirtualMemoryParameterOverTcp) {
  Seen seen;
  Listener listener(/*unix_socket=*/false, seen);
  std::vector<client::CudaParam> params = {VmmParam("model.embed.weight", PatternedAllocation(4096, 3), 0, 1024)};
  absl::StatusOr<std::unique_ptr<client::EngineAgent>> agent =
      client::EngineAgent::Start(listener.address(), std::move(params), {}, 0);
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(agent.status().message()), HasSubstr("'model.embed.weight'"));
  EXPECT_THAT(std::string(agent.status().message()), HasSubstr("unix:"));
}

// A descriptor-carrying capability, as the agent sends one.
class MemfdCap final : public proto::SharedFd::Server {
 public:
  explicit MemfdCap(int fd) : fd_(fd) {}
  kj::Maybe<int> getFd() override { return fd_; }

 private:
  int fd_;
};

TEST_F(FdPassingTest, RefitdRefusesAVirtualMemoryParameterThatCameOverTcp) {
  Seen seen;
  Listener listener(/*unix_socket=*/false, seen);
  auto allocation = PatternedAllocation(4096, 4);
  auto io = kj::setupAsyncIo();
  absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
  ASSERT_TRUE(options.ok());
  absl::StatusOr<kj::Own<kj::AsyncIoStream>> conn =
      ConnectControl(io.provider->getNetwork(), io.waitScope, listener.address(), *options);
  ASSERT_TRUE(conn.ok()) << conn.status();
  capnp::TwoPartyClient rpc(**conn);
  auto req = rpc.bootstrap().castAs<proto::Daemon>().registerEngineRequest();
  auto p = req.initParams(1)[0];
  p.setName("lm_head.weight");
  p.setDtype("F32");
  p.initShape(1).set(0, 1024);
  p.setNbytes(4096);
  auto v = p.getStorage().initCudaVmm();
  v.setFd(kj::heap<MemfdCap>(allocation->pieces[0].fd.get()));
  v.setSize(4096);
  auto resp = req.send().wait(io.waitScope);
  absl::Status st = wire::FromWire(resp.getStatus());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("unix:"));
}

// A descriptor the engine passed holds its CUDA memory for as long as any process keeps a copy:
// once registered, only the engine may hold one (or its release at a sleep frees nothing).
TEST_F(FdPassingTest, OnceRegisteredOnlyTheEngineHoldsTheDescriptor) {
  Seen seen;
  Listener listener(/*unix_socket=*/true, seen);
  const std::string name = "refit-fd-agent-" + std::to_string(getpid());
  auto allocation = NamedAllocation(name, 4096);
  ASSERT_EQ(DescriptorsOf(getpid(), name), 1);
  std::vector<client::CudaParam> params = {VmmParam("w", allocation, 0, 1024)};
  absl::StatusOr<std::unique_ptr<client::EngineAgent>> agent =
      client::EngineAgent::Start(listener.address(), std::move(params), {}, 0);
  ASSERT_TRUE(agent.ok()) << agent.status();
  {
    std::lock_guard<std::mutex> lock(seen.mu);
    ASSERT_EQ(seen.allocations, 1u);
  }
  // The daemon here keeps nothing; the agent must finish its call so the daemon's side of the
  // connection lets go of the request that carried the descriptor.
  EXPECT_TRUE(Eventually([&] { return DescriptorsOf(getpid(), name) == 1; }))
      << DescriptorsOf(getpid(), name) << " descriptors of the allocation in this process; the engine's own is 1";
}

// refitd lets go of the descriptors of a registration it refused as soon as it answers, even
// while the client still holds the answer (a refusal carries no capability, so Cap'n Proto ends
// the call at once; an accepted one is kept until the client finishes it: the test above).
TEST_F(FdPassingTest, RefitdKeepsNoDescriptorOfARegistrationItAnswered) {
  unsetenv("REFITD_TOKEN");  // the daemon below checks peer credentials
  refit::testing::RefitdProcess refitd(REFITD_BINARY);
  const std::string name = "refit-fd-refitd-" + std::to_string(getpid());
  auto allocation = NamedAllocation(name, 2 << 20);
  auto io = kj::setupAsyncIo();
  absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
  ASSERT_TRUE(options.ok());
  absl::StatusOr<kj::Own<kj::AsyncIoStream>> conn =
      ConnectControl(io.provider->getNetwork(), io.waitScope, refitd.address(), *options);
  ASSERT_TRUE(conn.ok()) << conn.status();
  kj::Maybe<kj::AsyncCapabilityStream&> caps = UnixCapabilityStream(**conn);
  ASSERT_TRUE(caps != nullptr);
  capnp::TwoPartyClient rpc(KJ_ASSERT_NONNULL(caps), kMaxFdsPerMessage);
  auto req = rpc.bootstrap().castAs<proto::Daemon>().registerEngineRequest();
  auto p = req.initParams(1)[0];
  p.setName("w");
  p.setDtype("F32");
  p.initShape(1).set(0, 1024);
  p.setNbytes(4096);
  auto v = p.getStorage().initCudaVmm();
  v.setFd(kj::heap<MemfdCap>(allocation->pieces[0].fd.get()));
  v.setSize(2 << 20);
  auto resp = req.send().wait(io.waitScope);  // held until the end: the call stays unfinished
  // Refused without a GPU (or with a memfd for CUDA memory); what matters is what refitd keeps.
  const absl::Status st = wire::FromWire(resp.getStatus());
  EXPECT_TRUE(Eventually([&] { return DescriptorsOf(refitd.pid(), name) == 0; }))
      << "refitd holds " << DescriptorsOf(refitd.pid(), name) << " descriptors of the allocation after answering ("
      << st << ")\n" << refitd.Log();
}

TEST_F(FdPassingTest, TheMessageLimitsHoldOnADescriptorPassingConnection) {
  Seen seen;
  ConnectionLimits limits;
  limits.connection_buffer_bytes = 4096;
  Listener listener(/*unix_socket=*/true, seen, limits);
  std::vector<client::CudaParam> params = {VmmParam(std::string(8192, 'x'), PatternedAllocation(4096, 5), 0, 1024)};
  absl::StatusOr<std::unique_ptr<client::EngineAgent>> agent =
      client::EngineAgent::Start(listener.address(), std::move(params), {}, 0);
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kUnavailable) << agent.status();
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_TRUE(seen.bytes.empty());
}

TEST_F(FdPassingTest, AnAgentRefusesMoreAllocationsThanOneMessageCarries) {
  Seen seen;
  Listener listener(/*unix_socket=*/true, seen);
  std::vector<client::CudaParam> params;
  for (uint32_t i = 0; i <= kMaxFdsPerMessage; ++i) {
    params.push_back(VmmParam("layer." + std::to_string(i), PatternedAllocation(4096, 6), 0, 16));
  }
  absl::StatusOr<std::unique_ptr<client::EngineAgent>> agent =
      client::EngineAgent::Start(listener.address(), std::move(params), {}, 0);
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(agent.status().message()), HasSubstr("'layer.64'"));
}

}  // namespace
}  // namespace refit::server
