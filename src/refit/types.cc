#include "refit/types.h"

#include <cstdio>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"
#include "absl/strings/str_cat.h"

namespace refit {

const char* WireFormatName(WireFormat f) { return f == WireFormat::kCheckpoint ? "checkpoint" : "bf16"; }

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kNone: return "none";
    case Outcome::kCommitted: return "committed";
    case Outcome::kRefused: return "refused";
    case Outcome::kAborted: return "aborted";
    case Outcome::kFailed: return "failed";
    case Outcome::kStaged: return "staged";
  }
  return "none";
}

const char* EndCauseName(EndCause cause) {
  switch (cause) {
    case EndCause::kNone: return "none";
    case EndCause::kClientAbort: return "client_abort";
    case EndCause::kDeadlineExceeded: return "deadline_exceeded";
    case EndCause::kDisconnected: return "disconnected";
    case EndCause::kInvalidInput: return "invalid_input";
    case EndCause::kIncomplete: return "incomplete";
    case EndCause::kOverloaded: return "overloaded";
    case EndCause::kEngineError: return "engine_error";
    case EndCause::kInternal: return "internal";
    case EndCause::kVerifyMismatch: return "verify_mismatch";
    case EndCause::kBusy: return "busy";
    case EndCause::kEngineDirty: return "engine_dirty";
  }
  return "internal";
}

namespace {
// The payload's type URL; its value is the cause's name (EndCauseName), so that a status printed
// anywhere shows it.
constexpr char kCauseUrl[] = "type.refit.dev/refit.EndCause";
constexpr EndCause kLastCause = EndCause::kEngineDirty;
}  // namespace

absl::Status WithCause(absl::Status status, EndCause cause) {
  if (status.ok()) return status;
  if (cause == EndCause::kNone) {
    status.ErasePayload(kCauseUrl);
  } else {
    status.SetPayload(kCauseUrl, absl::Cord(EndCauseName(cause)));
  }
  return status;
}

EndCause CauseOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kCauseUrl);
  if (!payload.has_value()) return EndCause::kNone;
  for (int c = 1; c <= static_cast<int>(kLastCause); ++c) {
    if (*payload == EndCauseName(static_cast<EndCause>(c))) return static_cast<EndCause>(c);
  }
  return EndCause::kNone;
}

EndCause CauseOfSessionFailure(const absl::Status& failure) {
  switch (failure.code()) {
    case absl::StatusCode::kOk: return EndCause::kNone;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kFailedPrecondition: return EndCause::kInvalidInput;
    case absl::StatusCode::kDeadlineExceeded: return EndCause::kDeadlineExceeded;
    case absl::StatusCode::kResourceExhausted: return EndCause::kOverloaded;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled: return EndCause::kDisconnected;
    case absl::StatusCode::kAborted: return EndCause::kClientAbort;
    default: return EndCause::kInternal;
  }
}

absl::Status ReportStatus(const RefitReport& report) {
  if (report.outcome == Outcome::kCommitted || report.outcome == Outcome::kStaged) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kAborted;
  switch (report.cause) {
    case EndCause::kIncomplete: code = absl::StatusCode::kFailedPrecondition; break;
    case EndCause::kInvalidInput: code = absl::StatusCode::kInvalidArgument; break;
    case EndCause::kClientAbort: code = absl::StatusCode::kAborted; break;
    case EndCause::kDeadlineExceeded: code = absl::StatusCode::kDeadlineExceeded; break;
    case EndCause::kDisconnected: code = absl::StatusCode::kUnavailable; break;
    case EndCause::kOverloaded: code = absl::StatusCode::kResourceExhausted; break;
    case EndCause::kEngineError: code = absl::StatusCode::kUnavailable; break;
    case EndCause::kInternal: code = absl::StatusCode::kInternal; break;
    case EndCause::kVerifyMismatch: code = absl::StatusCode::kDataLoss; break;
    case EndCause::kBusy: code = absl::StatusCode::kUnavailable; break;
    case EndCause::kEngineDirty: code = absl::StatusCode::kUnavailable; break;
    case EndCause::kNone: code = absl::StatusCode::kAborted; break;
  }
  if (report.outcome == Outcome::kRefused) code = absl::StatusCode::kFailedPrecondition;
  return WithCause(absl::Status(code, report.reason.empty() ? std::string(OutcomeName(report.outcome)) : report.reason),
                   report.cause);
}

absl::Status CheckTag(std::string_view tag) {
  if (tag.empty()) return absl::OkStatus();
  if (tag.size() > kMaxTagBytes) {
    return absl::InvalidArgumentError("tag of " + std::to_string(tag.size()) + " bytes (limit " +
                                      std::to_string(kMaxTagBytes) + ")");
  }
  for (size_t i = 0; i < tag.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(tag[i]);
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == ':' || c == '+' || c == '-';
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", c);
      return absl::InvalidArgumentError("tag holds byte " + std::string(hex) + " at offset " + std::to_string(i) +
                                        " (a tag is 1.." + std::to_string(kMaxTagBytes) +
                                        " bytes of A-Z a-z 0-9 . _ : + -)");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSliceGeometry(const std::string& name, const Shape& shape, const TensorSlice& sl) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': slice ", why));
  };
  if (sl.full_shape.size() != shape.size()) {
    return bad(absl::StrCat("of shape ", ShapeString(shape), " does not have the rank of the full shape ",
                            ShapeString(sl.full_shape)));
  }
  if (sl.dim < 0 || static_cast<size_t>(sl.dim) >= shape.size()) {
    return bad(absl::StrCat("dimension ", sl.dim, " is outside rank ", shape.size()));
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (static_cast<int>(i) != sl.dim && shape[i] != sl.full_shape[i]) {
      return bad(absl::StrCat("of shape ", ShapeString(shape), " differs from the full shape ",
                              ShapeString(sl.full_shape), " outside dimension ", sl.dim));
    }
  }
  const int64_t length = shape[static_cast<size_t>(sl.dim)];
  const int64_t full = sl.full_shape[static_cast<size_t>(sl.dim)];
  if (length <= 0) return bad("is empty");
  if (sl.start > static_cast<uint64_t>(full) || static_cast<uint64_t>(length) > static_cast<uint64_t>(full) - sl.start) {
    return bad(absl::StrCat("[", sl.start, ", ", sl.start + static_cast<uint64_t>(length), ") of dimension ", sl.dim,
                            " lies outside its ", full, " rows"));
  }
  return absl::OkStatus();
}

}  // namespace refit
