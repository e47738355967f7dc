// The C ABI over the C++ trainer client and engine agent. Each entry point validates its
// arguments, calls the C++ API inside Guard() (no exception crosses the ABI), and turns the
// absl::Status into a code plus the thread-local last-error message.
//
// This file: the helpers the entry points share (c_api_internal.h) and the calls on no handle
// (ABI version, last error, code names, dense bytes, checksum). The trainer's client handle is in
// c_api_client.cc, refit sessions in c_api_session.cc, the engine agent in c_api_engine.cc.
#include "client/c_api.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/c_api_internal.h"
#include "common/checksum.h"
#include "common/dtype.h"

using refit::DType;
using refit::Shape;

namespace {

thread_local std::string g_last_error;
thread_local std::string g_last_cause;  // refit_last_cause: "" when refitd gave none

}  // namespace

namespace refit::client::c_api {

int Fail(const absl::Status& st) {
  g_last_error = std::string(st.message());
  const refit::EndCause cause = refit::CauseOf(st);
  g_last_cause = cause == refit::EndCause::kNone ? "" : refit::EndCauseName(cause);
  return st.ok() ? REFIT_INTERNAL : static_cast<int>(st.code());
}
int Fail(int code, const std::string& message) {
  g_last_error = message;
  g_last_cause.clear();
  return code;
}

absl::StatusOr<DType> ParseDTypeField(const char* dtype, const std::string& owner) {
  if (dtype == nullptr) return absl::InvalidArgumentError(absl::StrCat(owner, ": dtype is NULL"));
  absl::StatusOr<DType> t = refit::ParseDType(dtype);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(owner, ": ", t.status().message()));
  return t;
}

absl::StatusOr<Shape> ShapeField(const int64_t* shape, uint32_t rank, const std::string& owner) {
  if (rank > 0 && shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(owner, ": shape is NULL but rank is ", rank));
  }
  Shape s(shape, shape + rank);
  for (uint32_t d = 0; d < rank; ++d) {
    if (s[d] < 0) return absl::InvalidArgumentError(absl::StrCat(owner, ": dimension ", d, " is ", s[d]));
  }
  return s;
}

std::string Owner(const char* kind, const char* name) {
  return absl::StrCat(kind, " '", name == nullptr ? "" : name, "'");
}

bool OnOwnerThread(const refit_client* c) { return std::this_thread::get_id() == c->owner; }

absl::Status CheckThread(refit_client* c) {
  if (!OnOwnerThread(c)) {
    return absl::FailedPreconditionError(
        "a refit client and its sessions must be used from the thread that connected");
  }
  std::vector<std::unique_ptr<refit::client::RefitSession>> orphans;
  {
    absl::MutexLock l(&c->mu);
    orphans.swap(c->orphans);
  }
  orphans.clear();  // each aborts on destruction
  return absl::OkStatus();
}

absl::Status LiveSession(const refit_session* s) {
  if (s == nullptr) return absl::InvalidArgumentError("session is NULL");
  if (s->client == nullptr) return absl::FailedPreconditionError("the session's client was closed");
  if (s->ended) return absl::FailedPreconditionError(absl::StrCat("session ", s->id, " already ended"));
  return CheckThread(s->client);
}

namespace {

void FillReport(const refit::RefitReport& r, refit_session* s, refit_report* out) {
  s->outcome = std::string(OutcomeName(r.outcome));
  s->reason = r.reason;
  s->tag = r.tag;
  s->cause = std::string(refit::EndCauseName(r.cause));
  s->format_name_storage.clear();
  s->format_bytes.clear();
  for (const auto& [name, bytes] : r.bytes_out_by_format) {
    s->format_name_storage.push_back(name);
    s->format_bytes.push_back(bytes);
  }
  s->format_names.clear();
  for (const std::string& n : s->format_name_storage) s->format_names.push_back(n.c_str());
  out->session_id = r.session_id;
  out->version = r.version;
  out->outcome = s->outcome.c_str();
  out->reason = s->reason.c_str();
  out->bytes_in = r.bytes_in;
  out->bytes_out = r.bytes_out;
  out->buckets = r.buckets;
  out->tensors = r.tensors;
  out->receive_ms = r.times.receive_ms;
  out->convert_ms = r.times.convert_ms;
  out->validate_ms = r.times.validate_ms;
  out->commit_ms = r.times.commit_ms;
  out->pause_ms = r.times.pause_ms;
  out->total_ms = r.times.total_ms;
  out->num_formats = static_cast<uint32_t>(s->format_names.size());
  out->format_names = s->format_names.data();
  out->format_bytes = s->format_bytes.data();
  out->tag = s->tag.c_str();
  out->cause = s->cause.c_str();
  out->verify_ms = r.times.verify_ms;
  out->bytes_in_place = r.bytes_in_place;
  out->bytes_pushed_in_place = s->impl != nullptr ? s->impl->pushed_in_place_bytes() : 0;
}

}  // namespace

absl::Status WriteCommitReport(const absl::StatusOr<refit::RefitReport>& committed,
                               const std::optional<refit::RefitReport>& ended, refit_session* storage,
                               refit_report* out) {
  if (out == nullptr) return committed.status();
  refit::RefitReport r;
  if (committed.ok()) {
    r = *committed;
  } else if (ended.has_value()) {
    r = *ended;
  } else {
    r.cause = refit::CauseOf(committed.status());
    r.reason = std::string(committed.status().message());
  }
  refit_report v{};
  FillReport(r, storage, &v);
  if (absl::Status written = WriteStruct(v, "report", out); !written.ok()) return written;
  return committed.status();
}

}  // namespace refit::client::c_api

using refit::client::c_api::Guard;
using refit::client::c_api::ParseDTypeField;
using refit::client::c_api::ShapeField;

extern "C" {

uint32_t refit_abi_version(void) { return REFIT_ABI_VERSION; }

const char* refit_last_error(void) { return g_last_error.c_str(); }

const char* refit_last_cause(void) { return g_last_cause.c_str(); }

const char* refit_code_name(int code) {
  switch (code) {
    case REFIT_OK: return "OK";
    case REFIT_CANCELLED: return "CANCELLED";
    case REFIT_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case REFIT_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case REFIT_NOT_FOUND: return "NOT_FOUND";
    case REFIT_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case REFIT_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case REFIT_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case REFIT_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case REFIT_ABORTED: return "ABORTED";
    case REFIT_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case REFIT_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case REFIT_INTERNAL: return "INTERNAL";
    case REFIT_UNAVAILABLE: return "UNAVAILABLE";
    case REFIT_DATA_LOSS: return "DATA_LOSS";
    case REFIT_UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

int refit_dense_bytes(const char* dtype, const int64_t* shape, uint32_t rank, uint64_t* out_bytes) {
  return Guard("refit_dense_bytes", [&]() -> absl::Status {
    if (out_bytes == nullptr) return absl::InvalidArgumentError("out_bytes is NULL");
    absl::StatusOr<DType> t = ParseDTypeField(dtype, "tensor");
    if (!t.ok()) return t.status();
    absl::StatusOr<Shape> s = ShapeField(shape, rank, "tensor");
    if (!s.ok()) return s.status();
    absl::StatusOr<uint64_t> n = refit::DenseBytes(*t, *s);
    if (!n.ok()) return n.status();
    *out_bytes = *n;
    return absl::OkStatus();
  });
}

uint64_t refit_checksum64(const void* data, uint64_t bytes, uint64_t seed) {
  return refit::Checksum64(data, static_cast<size_t>(bytes), seed);
}

}  // extern "C"
