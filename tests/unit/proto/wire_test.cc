// Statuses across the control plane: code, message and cause arrive as sent, and a cause this
// build does not know (a newer daemon's) says nothing more than the code.
#include "proto/wire.h"

#include "capnp/message.h"
#include "gtest/gtest.h"

namespace refit::wire {
namespace {

absl::Status RoundTrip(const absl::Status& sent) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<proto::Status>();
  ToWire(sent, b);
  return FromWire(b.asReader());
}

TEST(WireStatusTest, CodeMessageAndCauseArriveAsSent) {
  absl::Status got = RoundTrip(WithCause(absl::UnavailableError("busy: session 3 is active"), EndCause::kBusy));
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(got.message(), "busy: session 3 is active");
  EXPECT_EQ(CauseOf(got), EndCause::kBusy);
  EXPECT_EQ(CauseOf(RoundTrip(WithCause(absl::UnavailableError("x"), EndCause::kEngineDirty))),
            EndCause::kEngineDirty);
}

TEST(WireStatusTest, AStatusWithoutCauseArrivesWithout) {
  absl::Status got = RoundTrip(absl::InvalidArgumentError("tensor 'w': bad"));
  EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CauseOf(got), EndCause::kNone);
  EXPECT_TRUE(RoundTrip(absl::OkStatus()).ok());
}

TEST(WireStatusTest, AnUnknownCauseIsDropped) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<proto::Status>();
  b.setCode(proto::StatusCode::UNAVAILABLE);
  b.setMessage("from a newer daemon");
  b.setCause(static_cast<proto::EndCause>(200));
  absl::Status got = FromWire(b.asReader());
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CauseOf(got), EndCause::kNone);
}

}  // namespace
}  // namespace refit::wire
