// The C ABI over the C++ trainer client and engine agent. Each entry point validates its
// arguments, calls the C++ API inside Guard() (no exception crosses the ABI), and turns the
// absl::Status into a code plus the thread-local last-error message.
#include "client/c_api.h"

#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/abi_struct.h"
#include "client/engine_agent.h"
#include "client/trainer_client.h"
#include "common/checksum.h"
#include "common/dtype.h"

using refit::DType;
using refit::Shape;

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

struct refit_engine {
  std::unique_ptr<refit::client::EngineAgent> impl;
};

namespace {

thread_local std::string g_last_error;
thread_local std::string g_last_cause;  // refit_last_cause: "" when refitd gave none

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

// Fails off the owning thread; on it, first aborts the sessions orphaned by other threads.
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

// What a commit writes to its caller's report: refitd's report of how the refit ended, or, when
// the commit failed before refitd sent one, a report of outcome "none" whose cause is the
// failure's (refit_last_cause) and whose reason is its message. `storage` owns the strings.
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

// A new session handle owning `impl`, registered with its client.
refit_session* AdoptSession(refit_client* client, std::unique_ptr<refit::client::RefitSession> impl, bool joined) {
  auto s = std::make_unique<refit_session>();
  s->client = client;
  s->ids = impl->ids();  // not waiting for a pipelined begin's answer (refit_session_id does)
  s->id = s->ids.front();
  s->bucket_bytes = impl->bucket_bytes();
  s->joined = joined;
  s->impl = std::move(impl);
  absl::MutexLock l(&client->mu);
  client->sessions.insert(s.get());
  return s.release();
}

// The slice fields of a pushed tensor (ABI 3): none when full_rank is 0.
absl::StatusOr<refit::TensorSlice> SliceFields(const refit_tensor& t, const std::string& owner) {
  refit::TensorSlice slice;
  if (t.full_rank == 0) return slice;
  absl::StatusOr<Shape> full = ShapeField(t.full_shape, t.full_rank, absl::StrCat(owner, " full_shape"));
  if (!full.ok()) return full.status();
  if (t.slice_dim < 0) {
    return absl::InvalidArgumentError(absl::StrCat(owner, ": slice_dim is ", t.slice_dim, " (a slice needs 0 <= slice_dim < ",
                                                   t.full_rank, ")"));
  }
  slice.dim = t.slice_dim;
  slice.start = t.slice_start;
  slice.full_shape = std::move(*full);
  return slice;
}


// An engine's refit_engine_param array, by storage kind.
struct EngineParams {
  std::vector<refit::client::ShmParam> shm;
  std::vector<refit::client::CudaParam> cuda;
  std::vector<refit::client::DevicePtrParam> ptr;
};

absl::Status ReadEngineParams(const refit_engine_param* params, uint64_t num_params, EngineParams* out) {
  for (uint64_t i = 0; i < num_params; ++i) {
    refit_engine_param p;
    if (absl::Status st = ReadElement(params, num_params, i, "params", &p); !st.ok()) return st;
    if (p.name == nullptr) return absl::InvalidArgumentError(absl::StrCat("params[", i, "].name is NULL"));
    const std::string owner = Owner("engine parameter", p.name);
    absl::StatusOr<DType> dtype = ParseDTypeField(p.dtype, owner);
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<Shape> shape = ShapeField(p.shape, p.rank, owner);
    if (!shape.ok()) return shape.status();
    if (p.storage == REFIT_STORAGE_CUDA_IPC) {
      refit::client::CudaParam c{p.name, *dtype, std::move(*shape), {}, p.offset, p.cuda_device, nullptr};
      std::memcpy(c.ipc_handle.data(), p.cuda_ipc_handle, c.ipc_handle.size());
      out->cuda.push_back(std::move(c));
      continue;
    }
    if (p.storage == REFIT_STORAGE_CUDA_PTR) {
      if (p.cuda_ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(owner, ": cuda_ptr is NULL"));
      out->ptr.push_back({p.name, *dtype, std::move(*shape), p.cuda_ptr});
      continue;
    }
    if (p.storage != REFIT_STORAGE_SHM) {
      return absl::InvalidArgumentError(absl::StrCat(owner, ": unknown storage kind ", p.storage));
    }
    if (p.shm_name == nullptr || p.shm_name[0] == '\0') {
      return absl::InvalidArgumentError(absl::StrCat(owner, ": shm_name is empty"));
    }
    out->shm.push_back({p.name, *dtype, std::move(*shape), p.shm_name, p.offset});
  }
  return absl::OkStatus();
}

// refit_session_push and refit_session_push_in_place.
int PushTensor(const char* fn, refit_session* session, const refit_tensor* tensor, bool in_place) {
  return Guard(fn, [&]() -> absl::Status {
    if (absl::Status st = LiveSession(session); !st.ok()) return st;
    refit_tensor t;
    if (absl::Status st = ReadStruct(tensor, "tensor", &t); !st.ok()) return st;
    if (t.name == nullptr) return absl::InvalidArgumentError("tensor.name is NULL");
    const std::string owner = Owner("tensor", t.name);
    if (t.memory == REFIT_MEMORY_CUDA) {
      if (absl::Status st = refit::client::RefitSession::CheckDeviceMemory(t.data); !st.ok()) {
        return absl::Status(st.code(), absl::StrCat(owner, " is marked CUDA memory (device ", t.device, "): ", st.message()));
      }
    }
    if (t.memory != REFIT_MEMORY_HOST && t.memory != REFIT_MEMORY_CUDA) {
      return absl::InvalidArgumentError(absl::StrCat(owner, ": unknown memory kind ", t.memory));
    }
    absl::StatusOr<DType> dtype = ParseDTypeField(t.dtype, owner);
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<Shape> shape = ShapeField(t.shape, t.rank, owner);
    if (!shape.ok()) return shape.status();
    absl::StatusOr<uint64_t> n = refit::DenseBytes(*dtype, *shape);
    if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat(owner, ": ", n.status().message()));
    if (t.nbytes != 0 && t.nbytes != *n) {
      return absl::InvalidArgumentError(absl::StrCat(owner, " has ", t.nbytes, " bytes but ", refit::DTypeName(*dtype),
                                                     refit::ShapeString(*shape), " needs ", *n));
    }
    if (t.data == nullptr && *n > 0) return absl::InvalidArgumentError(absl::StrCat(owner, ": data is NULL"));
    absl::StatusOr<refit::TensorSlice> slice = SliceFields(t, owner);
    if (!slice.ok()) return slice.status();
    std::optional<float> amax;
    if (t.has_amax != 0) amax = t.amax;
    refit::client::TensorRef ref{t.name, *dtype, std::move(*shape), t.data, std::move(*slice), amax};
    return in_place ? session->impl->PushInPlace(ref) : session->impl->Push(ref);
  });
}

}  // namespace

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

// ---- Trainer side ------------------------------------------------------------------------

int refit_client_connect(const char* address, refit_client** out) {
  return Guard("refit_client_connect", [&]() -> absl::Status {
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    *out = nullptr;
    if (address == nullptr) return absl::InvalidArgumentError("address is NULL");
    auto c = std::make_unique<refit_client>();
    c->owner = std::this_thread::get_id();
    absl::StatusOr<std::unique_ptr<refit::client::TrainerClient>> impl = refit::client::TrainerClient::Connect(address);
    if (!impl.ok()) return impl.status();
    c->impl = std::move(*impl);
    *out = c.release();
    return absl::OkStatus();
  });
}

int refit_client_connect_fanout(const char* const* addresses, uint64_t count, refit_client** out) {
  return Guard("refit_client_connect_fanout", [&]() -> absl::Status {
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    *out = nullptr;
    if (addresses == nullptr || count == 0) return absl::InvalidArgumentError("no addresses");
    std::vector<std::string> list;
    for (uint64_t i = 0; i < count; ++i) {
      if (addresses[i] == nullptr) return absl::InvalidArgumentError(absl::StrCat("address ", i, " is NULL"));
      list.push_back(addresses[i]);
    }
    auto c = std::make_unique<refit_client>();
    c->owner = std::this_thread::get_id();
    absl::StatusOr<std::unique_ptr<refit::client::FanoutClient>> impl = refit::client::FanoutClient::Connect(list);
    if (!impl.ok()) return impl.status();
    c->fanout = std::move(*impl);
    *out = c.release();
    return absl::OkStatus();
  });
}

void refit_client_close(refit_client* client) {
  if (client == nullptr) return;
  (void)Guard("refit_client_close", [&]() -> absl::Status {
    const bool owner = OnOwnerThread(client);
    absl::MutexLock l(&client->mu);
    for (refit_session* s : client->sessions) {
      if (owner) {
        s->impl.reset();  // aborts a session that has not ended
      } else {
        (void)s->impl.release();  // its event loop belongs to another thread: leaked, not touched
      }
      s->client = nullptr;
    }
    client->sessions.clear();
    if (owner) {
      client->orphans.clear();  // each aborts on destruction
    } else {
      (void)client->impl.release();  // its event loop belongs to another thread: leaked, not touched
      (void)client->fanout.release();
      for (auto& o : client->orphans) (void)o.release();
    }
    return absl::OkStatus();
  });
  delete client;
}

int refit_client_status(refit_client* client, refit_daemon_status* out) {
  return Guard("refit_client_status", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    absl::StatusOr<refit::client::DaemonStatus> s = client->control()->Status();
    if (!s.ok()) return s.status();
    client->status_model = s->model;
    client->status_endpoint = s->data_endpoint;
    client->status_tag = s->tag;
    refit_daemon_status v{};
    v.model = client->status_model.c_str();
    v.engine_registered = s->engine_registered ? 1 : 0;
    v.engine_params = s->engine_params;
    v.engine_bytes = s->engine_bytes;
    v.version = s->version;
    v.active_session = s->active_session;
    v.staging_bytes = s->staging_bytes;
    v.staging_limit_bytes = s->staging_limit_bytes;
    v.committed = s->committed;
    v.refused = s->refused;
    v.aborted = s->aborted;
    v.data_endpoint = client->status_endpoint.c_str();
    v.tag = client->status_tag.c_str();
    v.engine_dirty = s->engine_dirty ? 1 : 0;
    v.verify_after_commit = s->verify_after_commit ? 1 : 0;
    v.verify_mismatches = s->verify_mismatches;
    v.engine_asleep = s->engine_asleep ? 1 : 0;
    v.awaiting_wake = s->awaiting_wake;
    client->status_group = s->group;
    const refit::client::GroupInfo& g = client->status_group;
    v.group_name = g.name.c_str();
    v.group_members = g.members;
    v.group_member = g.member;
    v.group_phase = g.phase.c_str();
    v.group_tag = g.tag.c_str();
    v.group_pending_tag = g.pending_tag.c_str();
    v.group_dirty = g.dirty ? 1 : 0;
    v.group_reason = g.reason.c_str();
    v.group_version = g.group_version.c_str();
    v.group_commits = g.commits;
    v.group_aborts = g.aborts;
    return WriteStruct(v, "status", out);
  });
}

int refit_client_abort_active(refit_client* client, const char* reason, int32_t* out_aborted) {
  return Guard("refit_client_abort_active", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    absl::StatusOr<bool> aborted = client->control()->AbortActive(reason == nullptr ? "" : reason);
    if (!aborted.ok()) return aborted.status();
    if (out_aborted != nullptr) *out_aborted = *aborted ? 1 : 0;
    return absl::OkStatus();
  });
}

int refit_client_checksums(refit_client* client, uint64_t* out_version, uint64_t* out_count) {
  return Guard("refit_client_checksums", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (out_version == nullptr || out_count == nullptr) return absl::InvalidArgumentError("out_version or out_count is NULL");
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    auto sums = client->control()->Checksums();
    if (!sums.ok()) return sums.status();
    *out_version = sums->first;
    client->checksums = std::move(sums->second);
    *out_count = client->checksums.size();
    return absl::OkStatus();
  });
}

int refit_client_checksum_at(refit_client* client, uint64_t index, refit_param_checksum* out) {
  return Guard("refit_client_checksum_at", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (index >= client->checksums.size()) {
      return absl::OutOfRangeError(absl::StrCat("checksum index ", index, " is past the ", client->checksums.size(),
                                                " parameters of the last refit_client_checksums call"));
    }
    const refit::client::ParamChecksum& p = client->checksums[index];
    refit_param_checksum v{};
    v.name = p.name.c_str();
    v.checksum = p.checksum;
    v.nbytes = p.nbytes;
    return WriteStruct(v, "checksum", out);
  });
}

namespace {

int KeptCommit(const char* fn, refit_client* client, refit_report* out,
               const std::function<absl::StatusOr<refit::RefitReport>(refit::client::TrainerClient&)>& commit) {
  return Guard(fn, [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    if (out != nullptr && out->struct_size < kV1Size<refit_report>) {
      return absl::InvalidArgumentError(absl::StrCat("report.struct_size is ", out->struct_size,
                                                     ", below the smallest supported size ", kV1Size<refit_report>));
    }
    absl::StatusOr<refit::RefitReport> report = commit(*client->control());
    if (client->report_storage == nullptr) client->report_storage = std::make_unique<refit_session>();
    return WriteCommitReport(report, client->control()->last_commit_report(), client->report_storage.get(), out);
  });
}

}  // namespace

int refit_client_commit_version(refit_client* client, const char* tag, refit_report* out) {
  if (tag == nullptr) tag = "";
  return KeptCommit("refit_client_commit_version", client, out,
                    [tag](refit::client::TrainerClient& c) { return c.CommitVersion(tag); });
}

int refit_client_rollback(refit_client* client, refit_report* out) {
  return KeptCommit("refit_client_rollback", client, out,
                    [](refit::client::TrainerClient& c) { return c.Rollback(); });
}

int refit_client_commit_group(refit_client* client, const char* tag, uint32_t member_deadline_ms, uint32_t timeout_ms,
                              const char** out_outcome) {
  return Guard("refit_client_commit_group", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (client->fanout == nullptr) {
      return absl::FailedPreconditionError(
          "an engine group's client connects to every member (refit_client_connect_fanout)");
    }
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    absl::StatusOr<refit::client::GroupCommitResult> g =
        client->fanout->CommitGroup(tag == nullptr ? "" : tag, member_deadline_ms, timeout_ms);
    if (!g.ok()) return g.status();
    if (out_outcome != nullptr) {
      *out_outcome = g->outcome == "committed" ? "committed" : g->outcome == "aborted" ? "aborted" : "dirty";
    }
    if (g->outcome == "committed") return absl::OkStatus();
    if (g->outcome == "aborted") return absl::AbortedError(absl::StrCat("group version aborted: ", g->error));
    return refit::WithCause(absl::FailedPreconditionError(absl::StrCat("engine group left dirty: ", g->error)),
                            refit::EndCause::kEngineDirty);
  });
}

int refit_client_abort_group(refit_client* client, const char* tag, const char* reason, uint32_t timeout_ms) {
  return Guard("refit_client_abort_group", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (client->fanout == nullptr) {
      return absl::FailedPreconditionError(
          "an engine group's client connects to every member (refit_client_connect_fanout)");
    }
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    return client->fanout->AbortGroup(tag == nullptr ? "" : tag, reason == nullptr ? "" : reason, timeout_ms);
  });
}

int refit_client_versions(refit_client* client, uint64_t* out_count, uint32_t* out_hold) {
  return Guard("refit_client_versions", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (out_count == nullptr) return absl::InvalidArgumentError("out_count is NULL");
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    absl::StatusOr<refit::client::VersionsList> list = client->control()->Versions();
    if (!list.ok()) return list.status();
    client->versions = std::move(*list);
    *out_count = client->versions.versions.size();
    if (out_hold != nullptr) *out_hold = client->versions.hold_limit;
    return absl::OkStatus();
  });
}

int refit_client_version_at(refit_client* client, uint64_t index, refit_staged_version* out) {
  return Guard("refit_client_version_at", [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    const auto& versions = client->versions.versions;
    if (index >= versions.size()) {
      return absl::OutOfRangeError(absl::StrCat("version index ", index, " is past the ", versions.size(),
                                                " versions of the last refit_client_versions call"));
    }
    const refit::client::StagedVersionInfo& v = versions[index];
    refit_staged_version o{};
    o.tag = v.tag.c_str();
    o.state = v.state.c_str();
    o.version = v.version;
    o.bytes = v.bytes;
    o.checksum = v.checksum;
    o.session_id = v.session_id;
    return WriteStruct(o, "version", out);
  });
}

int refit_session_begin(refit_client* client, const refit_manifest* manifest, refit_session** out) {
  return Guard("refit_session_begin", [&]() -> absl::Status {
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    *out = nullptr;
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    refit_manifest m;
    if (absl::Status st = ReadStruct(manifest, "manifest", &m); !st.ok()) return st;
    if (m.model == nullptr) return absl::InvalidArgumentError("manifest.model is NULL");
    refit::Manifest cm;
    cm.model = m.model;
    cm.partial = m.partial != 0;
    cm.deadline_ms = m.deadline_ms;
    if (m.tag != nullptr) cm.tag = m.tag;
    cm.stage_only = m.stage_only != 0;
    if (m.wire_format != nullptr && *m.wire_format != '\0') {
      const std::string w = m.wire_format;
      if (w == "checkpoint") {
        cm.wire_format = refit::WireFormat::kCheckpoint;
      } else if (w != "bf16") {
        return absl::InvalidArgumentError(absl::StrCat("manifest.wire_format '", w.substr(0, 64),
                                                       "': expected bf16 or checkpoint"));
      }
    }
    cm.tensors.reserve(m.num_tensors);
    for (uint64_t i = 0; i < m.num_tensors; ++i) {
      refit_tensor_desc d;
      if (absl::Status st = ReadElement(m.tensors, m.num_tensors, i, "manifest.tensors", &d); !st.ok()) return st;
      if (d.name == nullptr) return absl::InvalidArgumentError(absl::StrCat("manifest.tensors[", i, "].name is NULL"));
      const std::string owner = Owner("manifest tensor", d.name);
      absl::StatusOr<DType> t = ParseDTypeField(d.dtype, owner);
      if (!t.ok()) return t.status();
      absl::StatusOr<Shape> s = ShapeField(d.shape, d.rank, owner);
      if (!s.ok()) return s.status();
      absl::StatusOr<uint64_t> n = refit::DenseBytes(*t, *s);
      if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat(owner, ": ", n.status().message()));
      refit::TensorDesc desc;
      desc.name = d.name;
      desc.dtype = *t;
      desc.shape = std::move(*s);
      desc.nbytes = *n;
      cm.tensors.push_back(std::move(desc));
    }
    auto session = client->fanout != nullptr ? client->fanout->Begin(cm) : client->impl->Begin(cm);
    if (!session.ok()) return session.status();
    *out = AdoptSession(client, std::move(*session), /*joined=*/false);
    return absl::OkStatus();
  });
}

int refit_session_join(refit_client* client, const uint64_t* session_ids, uint64_t count, refit_session** out) {
  return Guard("refit_session_join", [&]() -> absl::Status {
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    *out = nullptr;
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    if (absl::Status st = CheckThread(client); !st.ok()) return st;
    if (session_ids == nullptr || count == 0) return absl::InvalidArgumentError("session_ids is NULL or count is 0");
    const uint64_t daemons = client->fanout != nullptr ? client->fanout->size() : 1;
    if (count != daemons) {
      return absl::InvalidArgumentError(absl::StrCat("join needs one session id per daemon of the client: got ", count,
                                                     " for ", daemons));
    }
    for (uint64_t i = 0; i < count; ++i) {
      if (session_ids[i] == 0) return absl::InvalidArgumentError(absl::StrCat("session_ids[", i, "] is 0"));
    }
    auto session = client->fanout != nullptr
                       ? client->fanout->Join(std::vector<uint64_t>(session_ids, session_ids + count))
                       : client->impl->Join(session_ids[0]);
    if (!session.ok()) return session.status();
    *out = AdoptSession(client, std::move(*session), /*joined=*/true);
    return absl::OkStatus();
  });
}

int refit_session_detach(refit_session* session) {
  return Guard("refit_session_detach", [&]() -> absl::Status {
    if (absl::Status st = LiveSession(session); !st.ok()) return st;
    if (!session->joined) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session ", session->id, " was begun by this rank, which commits or aborts it; detach is for joined ranks"));
    }
    session->ended = true;
    return session->impl->Detach();
  });
}

int refit_session_ids(const refit_session* session, uint64_t* out_ids, uint64_t capacity, uint64_t* out_count) {
  return Guard("refit_session_ids", [&]() -> absl::Status {
    if (session == nullptr) return absl::InvalidArgumentError("session is NULL");
    if (out_count == nullptr) return absl::InvalidArgumentError("out_count is NULL");
    if (capacity > 0 && out_ids == nullptr) return absl::InvalidArgumentError("out_ids is NULL");
    if (session->impl != nullptr && !session->ended) (void)session->impl->id();  // as refit_session_id
    for (uint64_t i = 0; i < capacity && i < session->ids.size(); ++i) out_ids[i] = session->ids[i];
    *out_count = session->ids.size();
    return absl::OkStatus();
  });
}

uint64_t refit_session_id(const refit_session* session) {
  if (session == nullptr) return 0;
  // After a pipelined begin: once refitd answered (the id is handed to ranks that join).
  if (session->impl != nullptr && !session->ended) (void)session->impl->id();
  return session->id;
}

uint64_t refit_session_bucket_bytes(const refit_session* session) {
  return session == nullptr ? 0 : session->bucket_bytes;
}

int refit_session_push(refit_session* session, const refit_tensor* tensor) {
  return PushTensor("refit_session_push", session, tensor, /*in_place=*/false);
}

int refit_session_push_in_place(refit_session* session, const refit_tensor* tensor) {
  return PushTensor("refit_session_push_in_place", session, tensor, /*in_place=*/true);
}

int refit_session_flush(refit_session* session) {
  return Guard("refit_session_flush", [&]() -> absl::Status {
    if (absl::Status st = LiveSession(session); !st.ok()) return st;
    return session->impl->Flush();
  });
}

int refit_session_measure_amax(refit_session* session, int on) {
  return Guard("refit_session_measure_amax", [&]() -> absl::Status {
    if (absl::Status st = LiveSession(session); !st.ok()) return st;
    session->impl->MeasureAmax(on != 0);
    return absl::OkStatus();
  });
}

int refit_session_amax_group(refit_session* session, const char* name, const char** out) {
  return Guard("refit_session_amax_group", [&]() -> absl::Status {
    if (absl::Status st = LiveSession(session); !st.ok()) return st;
    if (name == nullptr || out == nullptr) return absl::InvalidArgumentError("name and out must not be NULL");
    std::string& joined = session->amax_groups[name];
    joined = absl::StrJoin(session->impl->AmaxGroup(name), "\n");
    *out = joined.c_str();
    return absl::OkStatus();
  });
}

int refit_session_commit(refit_session* session, refit_report* out) {
  return Guard("refit_session_commit", [&]() -> absl::Status {
    if (absl::Status st = LiveSession(session); !st.ok()) return st;
    if (session->joined) {
      return absl::FailedPreconditionError(absl::StrCat("session ", session->id,
                                                        " was joined by this rank, which detaches; the rank that "
                                                        "began it commits"));
    }
    if (out != nullptr && out->struct_size < kV1Size<refit_report>) {
      return absl::InvalidArgumentError(absl::StrCat("report.struct_size is ", out->struct_size,
                                                     ", below the smallest supported size ", kV1Size<refit_report>));
    }
    session->ended = true;
    absl::StatusOr<refit::RefitReport> report = session->impl->Commit();
    return WriteCommitReport(report, session->impl->report(), session, out);
  });
}

int refit_session_abort(refit_session* session, const char* reason) {
  return Guard("refit_session_abort", [&]() -> absl::Status {
    if (absl::Status st = LiveSession(session); !st.ok()) return st;
    session->ended = true;
    return session->impl->Abort(reason == nullptr ? "" : reason);
  });
}

void refit_session_close(refit_session* session) {
  if (session == nullptr) return;
  (void)Guard("refit_session_close", [&]() -> absl::Status {
    refit_client* client = session->client;
    if (client != nullptr) {
      // The C++ session aborts in its destructor, on the client's event loop: on its thread only.
      absl::MutexLock l(&client->mu);
      client->sessions.erase(session);
      if (OnOwnerThread(client)) {
        session->impl.reset();
      } else {
        client->orphans.push_back(std::move(session->impl));
      }
    }
    return absl::OkStatus();
  });
  delete session;
}

// ---- Engine side -------------------------------------------------------------------------

int refit_engine_start(const refit_engine_options* options, const refit_engine_param* params, uint64_t num_params,
                       refit_engine** out) {
  return Guard("refit_engine_start", [&]() -> absl::Status {
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    *out = nullptr;
    refit_engine_options o;
    if (absl::Status st = ReadStruct(options, "options", &o); !st.ok()) return st;
    if (o.address == nullptr) return absl::InvalidArgumentError("options.address is NULL");
    EngineParams parsed;
    if (absl::Status st = ReadEngineParams(params, num_params, &parsed); !st.ok()) return st;
    std::vector<refit::client::ShmParam>& shm = parsed.shm;
    std::vector<refit::client::CudaParam>& cuda = parsed.cuda;
    refit::client::EngineCallbacks callbacks;
    if (o.pause != nullptr) callbacks.pause = [fn = o.pause, user = o.user]() { fn(user); };
    if (o.resume != nullptr) callbacks.resume = [fn = o.resume, user = o.user](uint64_t v) { fn(user, v); };
    if (o.resume_tagged != nullptr) {
      callbacks.resume_tagged = [fn = o.resume_tagged, user = o.user](uint64_t v, const std::string& tag) {
        fn(user, v, tag.c_str());
      };
    }
    if (o.audit != nullptr) {
      callbacks.audit = [fn = o.audit, user = o.user]() {
        std::vector<char> buf(1 << 16);
        const uint64_t n = fn(user, buf.data(), buf.size());
        buf.back() = '\0';
        std::vector<std::string> names;
        if (n == 0) return names;
        std::string all(buf.data());
        for (size_t start = 0; start <= all.size();) {
          size_t end = all.find('\n', start);
          if (end == std::string::npos) end = all.size();
          if (end > start) names.push_back(all.substr(start, end - start));
          start = end + 1;
        }
        if (names.empty()) names.push_back("(unnamed)");
        return names;
      };
    }
    refit::client::EngineRank rank;
    rank.tp_rank = o.tp_rank;
    rank.tp_size = o.tp_size;
    rank.ep_rank = o.ep_rank;
    rank.ep_size = o.ep_size;
    rank.device = cuda.empty() && parsed.ptr.empty() ? -1 : o.device;
    rank.model = o.model != nullptr ? o.model : "";
    if (rank.tp_size < 0 || rank.ep_size < 0 || rank.tp_rank < 0 || rank.ep_rank < 0) {
      return absl::InvalidArgumentError("options: tp_rank, tp_size, ep_rank and ep_size must not be negative");
    }
    std::string tag = o.tag != nullptr ? o.tag : "";
    const int kinds = !shm.empty() + !cuda.empty() + !parsed.ptr.empty();
    if (kinds > 1) {
      return absl::InvalidArgumentError(
          "an engine registers all parameters in shared memory or all in CUDA memory (all by IPC handle or all in place)");
    }
    auto agent = !cuda.empty()         ? refit::client::EngineAgent::Start(o.address, std::move(cuda), std::move(callbacks),
                                                                   o.version, false, std::move(tag), std::move(rank))
                 : !parsed.ptr.empty() ? refit::client::EngineAgent::Start(o.address, std::move(parsed.ptr),
                                                                           std::move(callbacks), o.version, false,
                                                                           std::move(tag), std::move(rank))
                                       : refit::client::EngineAgent::Start(o.address, std::move(shm), std::move(callbacks),
                                                                           o.version, false, std::move(tag), std::move(rank));
    if (!agent.ok()) return agent.status();
    auto e = std::make_unique<refit_engine>();
    e->impl = std::move(*agent);
    *out = e.release();
    return absl::OkStatus();
  });
}

uint64_t refit_engine_version(const refit_engine* engine) { return engine == nullptr ? 0 : engine->impl->version(); }
int refit_engine_tag(const refit_engine* engine, char* out, uint64_t out_size) {
  return Guard("refit_engine_tag", [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine is NULL");
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    const std::string tag = engine->impl->tag();
    if (out_size < tag.size() + 1) {
      return absl::OutOfRangeError(absl::StrCat("the tag needs ", tag.size() + 1, " bytes; out_size is ", out_size));
    }
    std::memcpy(out, tag.c_str(), tag.size() + 1);
    return absl::OkStatus();
  });
}

int32_t refit_engine_paused(const refit_engine* engine) { return engine != nullptr && engine->impl->paused() ? 1 : 0; }
int32_t refit_engine_dirty(const refit_engine* engine) { return engine != nullptr && engine->impl->dirty() ? 1 : 0; }
int32_t refit_engine_connected(const refit_engine* engine) {
  return engine != nullptr && engine->impl->connected() ? 1 : 0;
}

int refit_engine_sleep(refit_engine* engine) {
  return Guard("refit_engine_sleep", [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine is NULL");
    return engine->impl->Sleep();
  });
}

int refit_engine_wake(refit_engine* engine, const refit_engine_param* params, uint64_t num_params,
                      int32_t* committed) {
  return Guard("refit_engine_wake", [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine is NULL");
    if (committed != nullptr) *committed = 0;
    absl::StatusOr<bool> woke = absl::InternalError("unreachable");
    if (params == nullptr || num_params == 0) {
      woke = engine->impl->Wake();
    } else {
      EngineParams parsed;
      if (absl::Status st = ReadEngineParams(params, num_params, &parsed); !st.ok()) return st;
      const int kinds = !parsed.shm.empty() + !parsed.cuda.empty() + !parsed.ptr.empty();
      if (kinds > 1) {
        return absl::InvalidArgumentError(
            "an engine registers all parameters in shared memory or all in CUDA memory (all by IPC handle or all in place)");
      }
      woke = !parsed.cuda.empty()  ? engine->impl->Wake(std::move(parsed.cuda))
             : !parsed.ptr.empty() ? engine->impl->Wake(std::move(parsed.ptr))
                                   : engine->impl->Wake(std::move(parsed.shm));
    }
    if (!woke.ok()) return woke.status();
    if (committed != nullptr) *committed = *woke ? 1 : 0;
    return absl::OkStatus();
  });
}

int32_t refit_engine_asleep(const refit_engine* engine) { return engine != nullptr && engine->impl->asleep() ? 1 : 0; }

uint64_t refit_engine_allocations(const refit_engine* engine) {
  return engine == nullptr ? 0 : engine->impl->allocations();
}

void refit_engine_stop(refit_engine* engine) {
  if (engine == nullptr) return;
  (void)Guard("refit_engine_stop", [&]() -> absl::Status {
    engine->impl.reset();
    return absl::OkStatus();
  });
  delete engine;
}

}  // extern "C"
