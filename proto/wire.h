// Translation between Cap'n Proto control-plane messages and the core's value types.
// Reading untrusted messages: every dtype name is parsed and reported by field on error.
#ifndef REFIT_PROTO_WIRE_H_
#define REFIT_PROTO_WIRE_H_

#include "absl/status/statusor.h"
#include "proto/refit.capnp.h"
#include "refit/types.h"

namespace refit::wire {

absl::StatusOr<TensorDesc> FromWire(proto::TensorDesc::Reader r);
absl::StatusOr<Manifest> FromWire(proto::Manifest::Reader r);
absl::StatusOr<BucketHeader> FromWire(proto::BucketHeader::Reader r);
RefitReport FromWire(proto::RefitReport::Reader r);

void ToWire(const TensorDesc& d, proto::TensorDesc::Builder b);
void ToWire(const Manifest& m, proto::Manifest::Builder b);
void ToWire(const BucketHeader& h, proto::BucketHeader::Builder b);
void ToWire(const RefitReport& r, proto::RefitReport::Builder b);

}  // namespace refit::wire

#endif  // REFIT_PROTO_WIRE_H_
