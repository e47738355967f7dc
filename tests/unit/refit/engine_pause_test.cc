// EnginePause, the one pause state machine (engine_pause.h), on a real shared-memory engine
// storage and an engine control scripted per test (node_fixture.h): what each way out of a pause
// sends the engine, and what it leaves the state in.
#include "refit/engine_pause.h"

#include "node_fixture.h"

namespace refit {
namespace node_test {

class EnginePauseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    region_name_ = absl::StrCat("/refit-pause-test-", getpid(), "-", counter_++);
    region_ = *storage::ShmRegion::Create(region_name_, kBytes * kParams);
    engine_ = std::make_shared<EngineRecord>();
    engine_->storage = ShmStorageIn(region_name_);
    auto control = std::make_unique<ScriptedControl>();
    control_ = control.get();
    engine_->control = std::move(control);
    engine_->version = 7;
    engine_->tag = "step-7";
  }
  EnginePause NewPause() { return EnginePause(engine_, absl::Milliseconds(20), absl::Milliseconds(20)); }

  static inline int counter_ = 0;
  std::string region_name_;
  std::unique_ptr<storage::ShmRegion> region_;
  std::shared_ptr<EngineRecord> engine_;
  ScriptedControl* control_ = nullptr;
};

TEST_F(EnginePauseTest, APauseThatAnswersIsPausedAndAResumeSendsTheNewVersion) {
  EnginePause pause = NewPause();
  EXPECT_EQ(pause.state(), EnginePause::State::kIdle);
  ASSERT_TRUE(pause.AuditMappings().ok());
  ASSERT_TRUE(pause.Pause().ok());
  EXPECT_EQ(pause.state(), EnginePause::State::kPaused);
  EXPECT_EQ(control_->audits, 1) << "the engine's own audit is read with its pause";
  EXPECT_TRUE(pause.Pause().ok()) << "a paused pause is not sent again";
  ASSERT_TRUE(pause.Resume(8, "step-8").ok());
  EXPECT_EQ(pause.state(), EnginePause::State::kResumed);
  EXPECT_THAT(control_->calls, ElementsAre("pause", "resume:8"));
  EXPECT_THAT(control_->tags, ElementsAre("step-8"));
}

TEST_F(EnginePauseTest, ATimeoutQueuesTheHeldVersionsResumeUnlessTheEngineIsDirty) {
  control_->pause_hangs = true;
  EnginePause pause = NewPause();
  EXPECT_EQ(pause.Pause().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(pause.state(), EnginePause::State::kFailed);
  EXPECT_TRUE(pause.timed_out());
  EXPECT_THAT(control_->calls, ElementsAre("pause", "resume:7:sent"));
  EXPECT_THAT(control_->tags, ElementsAre("step-7"));

  // A dirty engine is paused since an interrupted commit: nothing may let it serve its bytes.
  control_->calls.clear();
  engine_->dirty = true;
  EnginePause dirty = NewPause();
  EXPECT_FALSE(dirty.Pause().ok());
  EXPECT_TRUE(dirty.timed_out());
  EXPECT_THAT(control_->calls, ElementsAre("pause"));
}

TEST_F(EnginePauseTest, AnEngineErrorIsAFailureWithNothingQueued) {
  control_->pause_status = absl::UnavailableError("engine gone");
  EnginePause pause = NewPause();
  EXPECT_EQ(pause.Pause().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pause.state(), EnginePause::State::kFailed);
  EXPECT_FALSE(pause.timed_out());
  EXPECT_THAT(control_->calls, ElementsAre("pause"));
}

TEST_F(EnginePauseTest, WhatTheEnginesAuditFindsStaleRefusesAndResumesUnlessDirty) {
  control_->audit_stale = {"w.1"};
  EnginePause pause = NewPause();
  EXPECT_TRUE(pause.Pause().ok());
  EXPECT_EQ(pause.state(), EnginePause::State::kRefused);
  EXPECT_THAT(pause.stale_error().message(), HasSubstr("w.1"));
  EXPECT_TRUE(pause.resume_status().ok());
  EXPECT_THAT(control_->calls, ElementsAre("pause", "resume:7"));

  control_->calls.clear();
  engine_->dirty = true;
  EnginePause dirty = NewPause();
  EXPECT_TRUE(dirty.Pause().ok());
  EXPECT_EQ(dirty.state(), EnginePause::State::kRefused);
  EXPECT_THAT(control_->calls, ElementsAre("pause")) << "a dirty engine stays paused";
}

TEST_F(EnginePauseTest, UndoResumesThePausedEngineAtWhatItHeldUnlessDirty) {
  EnginePause pause = NewPause();
  pause.Undo();
  EXPECT_THAT(control_->calls, ::testing::IsEmpty()) << "nothing to undo before a pause";
  ASSERT_TRUE(pause.Pause().ok());
  engine_->version = 99;  // what the pause began from counts, not what the record says now
  pause.Undo();
  EXPECT_THAT(control_->calls, ElementsAre("pause", "resume:7"));
  EXPECT_EQ(pause.state(), EnginePause::State::kResumed);
  pause.Undo();
  EXPECT_THAT(control_->calls, ElementsAre("pause", "resume:7")) << "undone once";

  control_->calls.clear();
  engine_->dirty = true;
  EnginePause dirty = NewPause();
  ASSERT_TRUE(dirty.Pause().ok());
  dirty.Undo();
  EXPECT_THAT(control_->calls, ElementsAre("pause"));

  control_->calls.clear();
  engine_->dirty = false;
  EnginePause sent = NewPause();
  ASSERT_TRUE(sent.Pause().ok());
  sent.Undo(/*await=*/false);
  EXPECT_THAT(control_->calls, ElementsAre("pause", "resume:99:sent"));
}

TEST_F(EnginePauseTest, TheRegistrationMustStillBeTheOneThePauseWasMadeFor) {
  EnginePause pause = NewPause();
  ++engine_->generation;  // the engine slept or woke since
  absl::Status audited = pause.AuditMappings();
  EXPECT_EQ(audited.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(audited.message(), HasSubstr("generation 1 -> 2"));
  EXPECT_FALSE(pause.Request()) << "nothing is sent for a stale registration";
  EXPECT_THAT(control_->calls, ::testing::IsEmpty());
  EXPECT_EQ(pause.state(), EnginePause::State::kIdle);
}

TEST_F(EnginePauseTest, AnEarlyRequestIsTakenByTheNextPauseNotSentAgain) {
  EnginePause pause = NewPause();
  ASSERT_TRUE(pause.Request());
  EXPECT_EQ(pause.state(), EnginePause::State::kRequested);
  EXPECT_FALSE(pause.Request()) << "one request";
  EXPECT_FALSE(pause.TakeAnswered()) << "the scripted control cannot answer on the loop";
  ASSERT_TRUE(pause.Pause().ok());
  EXPECT_EQ(pause.state(), EnginePause::State::kPaused);
  EXPECT_THAT(control_->calls, ElementsAre("pause"));
}

// DirectPause::Run: the begin's answer for each way its pause can end.
TEST_F(EnginePauseTest, ADirectPauseSaysWhyTheBeginFails) {
  DirectPause ok(NewPause());
  ok.Run();
  EXPECT_TRUE(ok.status().ok()) << ok.status();
  EXPECT_TRUE(ok.pause().paused());

  control_->pause_status = absl::InternalError("boom");
  DirectPause failed(NewPause());
  failed.Run();
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr("the engine did not pause: boom; its weights are untouched"));
  EXPECT_FALSE(failed.refused());

  control_->pause_status = absl::OkStatus();
  control_->audit_stale = {"w.0"};
  DirectPause stale(NewPause());
  stale.Run();
  EXPECT_TRUE(stale.refused());
  EXPECT_THAT(stale.status().message(), HasSubstr("nothing was written"));

  ++engine_->generation;
  control_->calls.clear();
  DirectPause gone(NewPause());
  --engine_->generation;  // made for generation 2, the engine is at 1 again: stale either way
  gone.Run();
  EXPECT_TRUE(gone.refused());
  EXPECT_THAT(gone.status().message(), HasSubstr("the engine is untouched"));
  EXPECT_THAT(control_->calls, ::testing::IsEmpty());
}

}  // namespace node_test
}  // namespace refit
