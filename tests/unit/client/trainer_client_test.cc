// The C++ trainer client against a real refitd child process, on how refits that do not commit
// reach the trainer: the commit's status carries refitd's cause (refit::CauseOf) and the session
// keeps refitd's report of how it ended (RefitSession::report), a refused, aborted or failed refit
// included; refused begins carry the cause that tells a busy daemon from a missing or dirty engine.
// The engine is an EngineAgent over a POSIX shm region this test maps itself.
#include "client/trainer_client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "../refitd_process.h"
#include "client/engine_agent.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::client {
namespace {

using ::testing::HasSubstr;

// A shm region the engine owns, unlinked and unmapped on destruction.
class Shm {
 public:
  explicit Shm(size_t bytes) : bytes_(bytes) {
    name_ = "/refit-trainer-client-test-" + std::to_string(getpid());
    int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~Shm() {
    munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  uint8_t* data_;
  size_t bytes_;
};

// refitd (model "toy") with `failpoints` armed (REFIT_FAILPOINTS, read by refitd at start).
class Refitd : public refit::testing::RefitdProcess {
 public:
  explicit Refitd(const std::string& failpoints = "") : RefitdProcess(Spawned(failpoints)) { unsetenv("REFIT_FAILPOINTS"); }

 private:
  static const char* Spawned(const std::string& failpoints) {
    if (failpoints.empty()) {
      unsetenv("REFIT_FAILPOINTS");
    } else {
      setenv("REFIT_FAILPOINTS", failpoints.c_str(), 1);
    }
    return REFITD_BINARY;
  }
};

// Two F32 parameters: "w" [4, 8] at offset 0 and "b" [8] at offset 256.
std::unique_ptr<EngineAgent> StartEngine(const std::string& address, const Shm& shm) {
  std::vector<ShmParam> params = {{"w", DType::kF32, {4, 8}, shm.name(), 0}, {"b", DType::kF32, {8}, shm.name(), 256}};
  absl::StatusOr<std::unique_ptr<EngineAgent>> engine = EngineAgent::Start(address, std::move(params), {}, 0);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

std::unique_ptr<TrainerClient> Connect(const std::string& address) {
  absl::StatusOr<std::unique_ptr<TrainerClient>> c = TrainerClient::Connect(address);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// A manifest of "w" and, unless `w_only`, "b".
Manifest ToyManifest(bool w_only = false, bool partial = false, uint32_t deadline_ms = 0) {
  Manifest m;
  m.model = "toy";
  m.tensors.push_back({"w", DType::kF32, {4, 8}});
  if (!w_only) m.tensors.push_back({"b", DType::kF32, {8}});
  m.partial = partial;
  m.deadline_ms = deadline_ms;
  return m;
}

const std::vector<float> kW(32, 1.5f), kB(8, -2.0f);

// Pushes "w" and, unless `w_only`, "b", then commits.
absl::StatusOr<RefitReport> PushAndCommit(RefitSession& s, bool w_only = false) {
  if (absl::Status st = s.Push({"w", DType::kF32, {4, 8}, kW.data()}); !st.ok()) return st;
  if (!w_only) {
    if (absl::Status st = s.Push({"b", DType::kF32, {8}, kB.data()}); !st.ok()) return st;
  }
  return s.Commit();
}

TEST(TrainerClientOutcomeTest, ACommittedRefitsReportIsTheSessionsToo) {
  Refitd daemon;
  Shm shm(512);
  std::unique_ptr<EngineAgent> engine = StartEngine(daemon.address(), shm);
  std::unique_ptr<TrainerClient> client = Connect(daemon.address());
  absl::StatusOr<std::unique_ptr<RefitSession>> s = client->Begin(ToyManifest());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE((*s)->report().has_value());  // not committed yet
  absl::StatusOr<RefitReport> r = PushAndCommit(**s);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*s)->report().has_value());
  EXPECT_EQ((*s)->report()->outcome, Outcome::kCommitted);
  EXPECT_EQ((*s)->report()->version, r->version);
  EXPECT_EQ((*s)->reports().size(), 1u);
}

TEST(TrainerClientOutcomeTest, ARefusedCommitReturnsItsReport) {
  Refitd daemon;
  Shm shm(512);
  std::unique_ptr<EngineAgent> engine = StartEngine(daemon.address(), shm);
  std::unique_ptr<TrainerClient> client = Connect(daemon.address());
  absl::StatusOr<std::unique_ptr<RefitSession>> s = client->Begin(ToyManifest());
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<RefitReport> r = PushAndCommit(**s, /*w_only=*/true);  // "b" never comes
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("'b'"));
  EXPECT_EQ(CauseOf(r.status()), EndCause::kIncomplete);
  std::optional<RefitReport> ended = (*s)->report();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->session_id, (*s)->id());
  EXPECT_EQ(ended->outcome, Outcome::kRefused);
  EXPECT_EQ(ended->cause, EndCause::kIncomplete);
  EXPECT_THAT(ended->reason, HasSubstr("'b'"));
  EXPECT_EQ(ended->tensors, 1u);
  EXPECT_EQ(engine->version(), 0u);
}

TEST(TrainerClientOutcomeTest, ABusyDaemonAndAMissingEngineAreTold) {
  Refitd daemon;
  std::unique_ptr<TrainerClient> first = Connect(daemon.address());
  absl::StatusOr<std::unique_ptr<RefitSession>> none = first->Begin(ToyManifest());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CauseOf(none.status()), EndCause::kEngineError);

  Shm shm(512);
  std::unique_ptr<EngineAgent> engine = StartEngine(daemon.address(), shm);
  absl::StatusOr<std::unique_ptr<RefitSession>> open = first->Begin(ToyManifest());
  ASSERT_TRUE(open.ok()) << open.status();
  std::unique_ptr<TrainerClient> second = Connect(daemon.address());
  absl::StatusOr<std::unique_ptr<RefitSession>> busy = second->Begin(ToyManifest());
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(busy.status().message(), HasSubstr("busy"));
  EXPECT_EQ(CauseOf(busy.status()), EndCause::kBusy);
}

// The mid_commit failpoint fails the commit with the engine paused: it is left dirty. The
// commit's status says so (kEngineDirty), its report says how the session ended (failed, engine
// error); partial refits are then refused as kEngineDirty until a full refit lands.
TEST(TrainerClientOutcomeTest, ACommitThatLeftTheEngineDirtySaysSoAndReturnsItsReport) {
  Refitd daemon("mid_commit=error@1");
  Shm shm(512);
  std::unique_ptr<EngineAgent> engine = StartEngine(daemon.address(), shm);
  std::unique_ptr<TrainerClient> client = Connect(daemon.address());
  absl::StatusOr<std::unique_ptr<RefitSession>> s = client->Begin(ToyManifest());
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<RefitReport> r = PushAndCommit(**s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CauseOf(r.status()), EndCause::kEngineDirty);
  std::optional<RefitReport> ended = (*s)->report();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->session_id, (*s)->id());
  EXPECT_EQ(ended->outcome, Outcome::kFailed);
  EXPECT_EQ(ended->cause, EndCause::kEngineError);
  EXPECT_THAT(ended->reason, HasSubstr("dirty"));
  EXPECT_EQ(ended->bytes_in, 160u);
  EXPECT_GT(ended->times.total_ms, 0.0);

  absl::StatusOr<std::unique_ptr<RefitSession>> partial = client->Begin(ToyManifest(true, /*partial=*/true));
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CauseOf(partial.status()), EndCause::kEngineDirty);

  absl::StatusOr<std::unique_ptr<RefitSession>> full = client->Begin(ToyManifest());
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<RefitReport> landed = PushAndCommit(**full);
  ASSERT_TRUE(landed.ok()) << landed.status();
  absl::StatusOr<DaemonStatus> status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_FALSE(status->engine_dirty);
}

// A session that stalls past its deadline is aborted before its commit: the commit says so
// (DeadlineExceeded) and returns the report of how it ended.
TEST(TrainerClientOutcomeTest, ACommitAfterTheDeadlineReturnsTheAbortedSessionsReport) {
  Refitd daemon;
  Shm shm(512);
  std::unique_ptr<EngineAgent> engine = StartEngine(daemon.address(), shm);
  std::unique_ptr<TrainerClient> client = Connect(daemon.address());
  absl::StatusOr<std::unique_ptr<RefitSession>> s = client->Begin(ToyManifest(false, false, /*deadline_ms=*/200));
  ASSERT_TRUE(s.ok()) << s.status();
  const uint64_t id = (*s)->id();
  // Waits for refitd to end the session (its deadline) rather than for a guessed time.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    absl::StatusOr<DaemonStatus> st = client->Status();
    ASSERT_TRUE(st.ok()) << st.status();
    if (st->active_session != id) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  absl::StatusOr<RefitReport> r = (*s)->Commit();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(CauseOf(r.status()), EndCause::kDeadlineExceeded);
  std::optional<RefitReport> ended = (*s)->report();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->session_id, id);
  EXPECT_EQ(ended->outcome, Outcome::kAborted);
  EXPECT_EQ(ended->cause, EndCause::kDeadlineExceeded);
}

TEST(TrainerClientOutcomeTest, AKeptCommitRefusedToStartHasNoReport) {
  Refitd daemon;  // hold: 0, no versions kept
  Shm shm(512);
  std::unique_ptr<EngineAgent> engine = StartEngine(daemon.address(), shm);
  std::unique_ptr<TrainerClient> client = Connect(daemon.address());
  absl::StatusOr<RefitReport> r = client->CommitVersion("step-1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(client->last_commit_report().has_value());
}

}  // namespace
}  // namespace refit::client
