#include "refit/types.h"

namespace refit {

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kNone: return "none";
    case Outcome::kCommitted: return "committed";
    case Outcome::kRefused: return "refused";
    case Outcome::kAborted: return "aborted";
    case Outcome::kFailed: return "failed";
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
  }
  return "internal";
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
  if (report.outcome == Outcome::kCommitted) return absl::OkStatus();
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
    case EndCause::kNone: code = absl::StatusCode::kAborted; break;
  }
  if (report.outcome == Outcome::kRefused) code = absl::StatusCode::kFailedPrecondition;
  return absl::Status(code, report.reason.empty() ? std::string(OutcomeName(report.outcome)) : report.reason);
}

}  // namespace refit
