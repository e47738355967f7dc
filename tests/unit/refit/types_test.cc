// A failure's cause travels with its status (WithCause / CauseOf), and a session's report gives
// its status its code and cause (ReportStatus).
#include "refit/types.h"

#include "gtest/gtest.h"

namespace refit {
namespace {

TEST(StatusCauseTest, ACauseRidesWithTheStatusAndKeepsCodeAndMessage) {
  absl::Status busy = WithCause(absl::UnavailableError("busy: session 7 is active"), EndCause::kBusy);
  EXPECT_EQ(CauseOf(busy), EndCause::kBusy);
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(busy.message(), "busy: session 7 is active");
  // Another cause replaces it; kNone removes it.
  EXPECT_EQ(CauseOf(WithCause(busy, EndCause::kEngineDirty)), EndCause::kEngineDirty);
  EXPECT_EQ(CauseOf(WithCause(busy, EndCause::kNone)), EndCause::kNone);
}

TEST(StatusCauseTest, AStatusWithoutACauseAndAnOkStatusHaveNone) {
  EXPECT_EQ(CauseOf(absl::UnavailableError("no engine")), EndCause::kNone);
  absl::Status ok = WithCause(absl::OkStatus(), EndCause::kBusy);
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(CauseOf(ok), EndCause::kNone);
}

TEST(StatusCauseTest, EveryCauseHasItsOwnName) {
  EXPECT_STREQ(EndCauseName(EndCause::kBusy), "busy");
  EXPECT_STREQ(EndCauseName(EndCause::kEngineDirty), "engine_dirty");
  for (int c = 1; c <= static_cast<int>(EndCause::kEngineDirty); ++c) {
    const auto cause = static_cast<EndCause>(c);
    EXPECT_EQ(CauseOf(WithCause(absl::InternalError("x"), cause)), cause) << EndCauseName(cause);
  }
}

TEST(ReportStatusTest, TheStatusOfAnEndedSessionCarriesItsCause) {
  RefitReport r;
  r.outcome = Outcome::kFailed;
  r.cause = EndCause::kEngineError;
  r.reason = "commit failed, engine left paused and dirty";
  absl::Status failed = ReportStatus(r);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed.message(), r.reason);
  EXPECT_EQ(CauseOf(failed), EndCause::kEngineError);

  r.outcome = Outcome::kRefused;
  r.cause = EndCause::kIncomplete;
  EXPECT_EQ(ReportStatus(r).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CauseOf(ReportStatus(r)), EndCause::kIncomplete);

  r.outcome = Outcome::kAborted;
  r.cause = EndCause::kDeadlineExceeded;
  EXPECT_EQ(ReportStatus(r).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(CauseOf(ReportStatus(r)), EndCause::kDeadlineExceeded);

  r.outcome = Outcome::kCommitted;
  r.cause = EndCause::kNone;
  EXPECT_TRUE(ReportStatus(r).ok());
}

}  // namespace
}  // namespace refit
