// The C ABI's refit sessions (c_api.h, trainer side): begin and join, pushing tensors, flush,
// amax, commit, abort, detach and close. The client handle they belong to is in c_api_client.cc.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/c_api.h"
#include "client/c_api_internal.h"
#include "client/trainer_client.h"
#include "common/dtype.h"

using refit::DType;
using refit::Shape;
using refit::client::c_api::CheckThread;
using refit::client::c_api::Guard;
using refit::client::c_api::kV1Size;
using refit::client::c_api::LiveSession;
using refit::client::c_api::OnOwnerThread;
using refit::client::c_api::Owner;
using refit::client::c_api::ParseDTypeField;
using refit::client::c_api::ReadElement;
using refit::client::c_api::ReadStruct;
using refit::client::c_api::ShapeField;
using refit::client::c_api::WriteCommitReport;

namespace {

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
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ": slice_dim is ", t.slice_dim, " (a slice needs 0 <= slice_dim < ", t.full_rank, ")"));
  }
  slice.dim = t.slice_dim;
  slice.start = t.slice_start;
  slice.full_shape = std::move(*full);
  return slice;
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
        return absl::Status(st.code(),
                            absl::StrCat(owner, " is marked CUDA memory (device ", t.device, "): ", st.message()));
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
        return absl::InvalidArgumentError(
            absl::StrCat("manifest.wire_format '", w.substr(0, 64), "': expected bf16 or checkpoint"));
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
      return absl::InvalidArgumentError(
          absl::StrCat("join needs one session id per daemon of the client: got ", count, " for ", daemons));
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

}  // extern "C"
