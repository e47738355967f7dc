// What the C ABI's sources share (c_api.cc: errors, argument checks, reports and the calls on no
// handle; c_api_client.cc: the trainer's client handle, its status and its commits of kept
// versions; c_api_session.cc: refit sessions; c_api_engine.cc: the engine agent): the handle
// structs behind c_api.h's opaque types and the helpers every entry point uses. Not part of the
// ABI: nothing here is exported (c_api.map).
//
// Threading: as c_api.h. A client and its sessions are used from the thread that connected; a
// session handle may be closed from any thread (refit_client::mu).
#ifndef REFIT_CLIENT_C_API_INTERNAL_H_
#define REFIT_CLIENT_C_API_INTERNAL_H_

#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/abi_struct.h"
#include "client/c_api.h"
#include "client/trainer_client.h"
#include "common/dtype.h"

struct refit_client {
  std::unique_ptr<refit::client::TrainerClient> impl;
  std::unique_ptr<refit::client::FanoutClient> fanout;  // instead of impl: several daemons
  // Status, checksums and operator calls go to this daemon (the first of a fan-out).
  refit::client::TrainerClient* control() { return fanout != nullptr ? &fanout->daemon(0) : impl.get(); }
  std::thread::id owner;
  // Session handles may be freed from any thread (a garbage collector's), hence the lock.
  absl::Mutex mu;
  std::set<refit_session*> sessions ABSL_GUARDED_BY(mu);
  // Sessions closed from another thread: their abort must run on this client's event loop, so
  // they wait here until the next call on the owning thread.
  std::vector<std::unique_ptr<refit::client::RefitSession>> orphans ABSL_GUARDED_BY(mu);
  // Storage behind the pointers handed out by refit_client_status / refit_client_checksums.
  std::string status_model, status_endpoint, status_tag;
  refit::client::GroupInfo status_group;
  std::vector<refit::client::ParamChecksum> checksums;
  // Behind refit_client_commit_version / rollback reports and refit_client_version_at.
  std::unique_ptr<refit_session> report_storage;
  refit::client::VersionsList versions;
};

struct refit_session {
  refit_client* client;  // null once the client was closed
  std::unique_ptr<refit::client::RefitSession> impl;
  uint64_t id = 0;
  std::vector<uint64_t> ids;  // one per daemon (fan-out)
  uint64_t bucket_bytes = 0;
  bool joined = false;  // joined another rank's session: detaches instead of committing
  bool ended = false;
  std::map<std::string, std::string> amax_groups;  // behind refit_session_amax_group's answers
  // Storage behind the pointers of the last refit_report.
  std::string outcome, reason, tag, cause;
  std::vector<std::string> format_name_storage;
  std::vector<const char*> format_names;
  std::vector<uint64_t> format_bytes;
};

namespace refit::client::c_api {

// Sets the thread's last error (refit_last_error, refit_last_cause) and returns its code.
int Fail(const absl::Status& st);
int Fail(int code, const std::string& message);

// Runs `f` (returning absl::Status); any exception becomes REFIT_INTERNAL with its message.
template <typename F>
int Guard(const char* fn, F&& f) {
  try {
    absl::Status st = f();
    return st.ok() ? REFIT_OK : Fail(st);
  } catch (const std::exception& e) {
    return Fail(REFIT_INTERNAL, absl::StrCat(fn, ": ", e.what()));
  } catch (...) {
    return Fail(REFIT_INTERNAL, absl::StrCat(fn, ": unknown exception"));
  }
}

// Struct sizes: client/abi_struct.h (any size from the frozen version-1 size up).
using refit::client::abi::kV1Size;
using refit::client::abi::ReadElement;
using refit::client::abi::ReadStruct;
using refit::client::abi::WriteStruct;

// A dtype or shape field of an ABI struct; errors name `owner`.
absl::StatusOr<DType> ParseDTypeField(const char* dtype, const std::string& owner);
absl::StatusOr<Shape> ShapeField(const int64_t* shape, uint32_t rank, const std::string& owner);

// "kind 'name'", for error messages.
std::string Owner(const char* kind, const char* name);

bool OnOwnerThread(const refit_client* c);

// Fails off the owning thread; on it, first aborts the sessions orphaned by other threads.
absl::Status CheckThread(refit_client* c);

// A session that may be used now: not NULL, its client open, not ended, on the owning thread.
absl::Status LiveSession(const refit_session* s);

// What a commit writes to its caller's report: refitd's report of how the refit ended, or, when
// the commit failed before refitd sent one, a report of outcome "none" whose cause is the
// failure's (refit_last_cause) and whose reason is its message. `storage` owns the strings.
absl::Status WriteCommitReport(const absl::StatusOr<refit::RefitReport>& committed,
                               const std::optional<refit::RefitReport>& ended, refit_session* storage,
                               refit_report* out);

}  // namespace refit::client::c_api

#endif  // REFIT_CLIENT_C_API_INTERNAL_H_
