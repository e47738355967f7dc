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
absl::StatusOr<WirePlan> FromWire(proto::WirePlan::Reader r);
RefitReport FromWire(proto::RefitReport::Reader r);
Outcome OutcomeFromWire(proto::Outcome o);
EndCause CauseFromWire(proto::EndCause c);

// Errors as values across the wire: the canonical code and the message, bytes intact.
absl::Status FromWire(proto::Status::Reader r);
void ToWire(const absl::Status& status, proto::Status::Builder b);

// A Text field as a std::string, every byte kept (cStr() would stop at a NUL).
inline std::string Str(capnp::Text::Reader t) { return std::string(t.begin(), t.size()); }
// A std::string as a Text value, every byte kept (the implicit conversion stops at a NUL).
inline capnp::Text::Reader Text(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

void ToWire(const TensorDesc& d, proto::TensorDesc::Builder b);
// `with_tensors` false: every field but the tensor list (a begin by manifest key).
void ToWire(const Manifest& m, proto::Manifest::Builder b, bool with_tensors = true);
void ToWire(const BucketHeader& h, proto::BucketHeader::Builder b);
void ToWire(const WirePlan& p, proto::WirePlan::Builder b);
void ToWire(const RefitReport& r, proto::RefitReport::Builder b);

}  // namespace refit::wire

#endif  // REFIT_PROTO_WIRE_H_
