// The C ABI's trainer client handle (c_api.h, trainer side): connecting to one daemon or to
// several (a fan-out), closing, the daemon's status and parameter checksums, aborting the active
// session, and the commits of versions kept in staging (by tag, rollback, an engine group's).
// Refit sessions are in c_api_session.cc.
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/c_api.h"
#include "client/c_api_internal.h"
#include "client/trainer_client.h"

using refit::client::c_api::CheckThread;
using refit::client::c_api::Guard;
using refit::client::c_api::kV1Size;
using refit::client::c_api::OnOwnerThread;
using refit::client::c_api::WriteCommitReport;
using refit::client::c_api::WriteStruct;

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

extern "C" {

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
    if (out_version == nullptr || out_count == nullptr) {
      return absl::InvalidArgumentError("out_version or out_count is NULL");
    }
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
int refit_client_commit_version(refit_client* client, const char* tag, refit_report* out) {
  if (tag == nullptr) tag = "";
  return KeptCommit("refit_client_commit_version", client, out,
                    [tag](refit::client::TrainerClient& c) { return c.CommitVersion(tag); });
}

int refit_client_rollback(refit_client* client, refit_report* out) {
  return KeptCommit("refit_client_rollback", client, out, [](refit::client::TrainerClient& c) { return c.Rollback(); });
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

}  // extern "C"
