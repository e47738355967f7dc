// Statuses across the control plane: code, message and cause arrive as sent, and a cause this
// build does not know (a newer daemon's) says nothing more than the code. A bucket header's
// checksum and its kind arrive as sent; a header of a trainer older than the kind reads as
// Checksum64.
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

TEST(WireBucketHeaderTest, ChecksumAndKindArriveAsSent) {
  for (ChecksumKind kind : {ChecksumKind::kChecksum64, ChecksumKind::kParallel64}) {
    BucketHeader h;
    h.seq = 7;
    h.nbytes = 4096;
    h.checksum = 0x0123456789ABCDEFull;
    h.checksum_kind = kind;
    h.tensors.push_back({"w", DType::kBF16, {2048}, 0, 4096});
    capnp::MallocMessageBuilder message;
    ToWire(h, message.initRoot<proto::BucketHeader>());
    absl::StatusOr<BucketHeader> got = FromWire(message.getRoot<proto::BucketHeader>().asReader());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->checksum, h.checksum);
    EXPECT_EQ(got->checksum_kind, kind);
    EXPECT_EQ(got->nbytes, 4096u);
  }
  // An older trainer's header has no kind: its checksum is a Checksum64.
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<proto::BucketHeader>();
  b.setNbytes(8);
  b.setChecksum(1);
  absl::StatusOr<BucketHeader> got = FromWire(b.asReader());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->checksum_kind, ChecksumKind::kChecksum64);
}

}  // namespace
}  // namespace refit::wire
