#include "refitctl/ops_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/trainer_client.h"
#include "common/checksum.h"
#include "common/control_connect.h"
#include "formats/safetensors.h"
#include "nlohmann/json.hpp"
#include "refitctl/common_flags.h"

ABSL_FLAG(std::string, model, "", "the model name of the manifest (default: the daemon's model)");
ABSL_FLAG(bool, partial, false, "a partial refit: the checkpoint holds only some of the model's tensors");
ABSL_FLAG(bool, stage_only, false,
          "hold: K: validate and keep the refit in staging under --tag instead of writing it (refitctl commit TAG "
          "writes it later)");
ABSL_FLAG(std::string, tag, "",
          "the trainer's version tag of this refit (e.g. step-1200): 1..128 bytes of A-Z a-z 0-9 . _ : + -");
ABSL_FLAG(bool, progress, false, "show progress on stderr (the default on a terminal, without --json)");
ABSL_FLAG(std::string, reason, "refitctl abort", "why the session is aborted (logged and reported)");
ABSL_FLAG(std::string, members, "",
          "status: the control addresses of every member of the daemon's engine group, comma-separated, in member "
          "order: one line (one JSON object) per member with its phase and version");
ABSL_FLAG(bool, strict, false, "also fail when engine parameters are missing from the checkpoint");

namespace refit::refitctl {
namespace {

using nlohmann::json;

int Error(absl::string_view msg, int code = kExitFailure) {
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << json{{"ok", false}, {"error", std::string(msg)}}.dump() << "\n";
  } else {
    std::cerr << "refitctl: " << msg << "\n";
  }
  return code;
}

json ReportJson(const RefitReport& r) {
  json bytes_by_format = json::object();
  for (const auto& [k, v] : r.bytes_out_by_format) bytes_by_format[k] = v;
  return json{{"session", r.session_id},
              {"version", r.version},
              {"outcome", OutcomeName(r.outcome)},
              {"cause", EndCauseName(r.cause)},
              {"reason", r.reason},
              {"bytes_in", r.bytes_in},
              {"bytes_out", r.bytes_out},
              {"buckets", r.buckets},
              {"tensors", r.tensors},
              {"receive_ms", r.times.receive_ms},
              {"convert_ms", r.times.convert_ms},
              {"validate_ms", r.times.validate_ms},
              {"commit_ms", r.times.commit_ms},
              {"pause_ms", r.times.pause_ms},
              {"total_ms", r.times.total_ms},
              {"plan_ms", r.times.plan_ms},
              {"finish_ms", r.times.finish_ms},
              {"prepare_ms", r.times.prepare_ms},
              {"verify_ms", r.times.verify_ms},
              {"tag", r.tag},
              {"bytes_in_place", r.bytes_in_place}};
}

std::string ReportLine(const RefitReport& r) {
  return absl::StrCat("session ", r.session_id, " ", OutcomeName(r.outcome), " version=", r.version,
                      r.tag.empty() ? "" : absl::StrCat(" tag=", r.tag), " bytes_in=", r.bytes_in,
                      " bytes_out=", r.bytes_out, " buckets=", r.buckets, " tensors=", r.tensors,
                      " receive=", r.times.receive_ms, "ms convert=", r.times.convert_ms,
                      "ms validate=", r.times.validate_ms, "ms commit=", r.times.commit_ms,
                      "ms pause=", r.times.pause_ms, "ms total=", r.times.total_ms, "ms",
                      r.reason.empty() ? "" : absl::StrCat(" reason: ", r.reason));
}

// The safetensors files of a checkpoint: the file itself, or every *.safetensors in a directory.
absl::StatusOr<std::vector<std::unique_ptr<formats::SafetensorsFile>>> OpenCheckpoint(const std::string& path) {
  std::vector<std::string> paths;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(path)) {
      if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
    }
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) return absl::NotFoundError(absl::StrCat("no *.safetensors in '", path, "'"));
  } else {
    paths.push_back(path);
  }
  std::vector<std::unique_ptr<formats::SafetensorsFile>> files;
  for (const std::string& p : paths) {
    absl::StatusOr<std::unique_ptr<formats::SafetensorsFile>> f = formats::SafetensorsFile::Open(p);
    if (!f.ok()) return absl::Status(f.status().code(), absl::StrCat(p, ": ", f.status().message()));
    files.push_back(std::move(*f));
  }
  return files;
}

}  // namespace

namespace {

json GroupJson(const client::GroupInfo& g) {
  if (g.name.empty()) return json(nullptr);
  return json{{"name", g.name},
              {"members", g.members},
              {"member", g.member},
              {"phase", g.phase},
              {"tag", g.tag},
              {"pending_tag", g.pending_tag},
              {"dirty", g.dirty},
              {"reason", g.reason},
              {"deadline_left_ms", g.deadline_left_ms},
              {"commits", g.commits},
              {"aborts", g.aborts},
              {"deadline_expiries", g.deadline_expiries},
              {"group_version", g.group_version}};
}

std::string GroupLine(const client::GroupInfo& g) {
  return absl::StrCat(g.name, " member ", g.member, " of ", g.members, ", ", g.phase,
                      g.pending_tag.empty() ? "" : absl::StrCat(" '", g.pending_tag, "'"),
                      g.phase == "copied" ? absl::StrCat(" (deadline in ", g.deadline_left_ms, " ms)") : "",
                      ", serves '", g.tag, "'", g.dirty ? absl::StrCat(", DIRTY: ", g.reason) : "",
                      g.phase == "joining" ? absl::StrCat(" (", g.reason, ")") : "");
}

// refitctl status --members A,B,...: every member of an engine group, one line (object) each.
int GroupMembersStatus(const std::string& members, bool json_output) {
  json out = json::array();
  bool all = true;
  std::string consistent_tag;
  bool consistent = true;
  size_t i = 0;
  for (absl::string_view a : absl::StrSplit(members, ',', absl::SkipEmpty())) {
    const std::string address(a);
    json m = {{"member_address", address}};
    std::string line = absl::StrCat("member ", i, "  ", address, ": ");
    absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(address);
    absl::StatusOr<client::DaemonStatus> s = c.ok() ? (*c)->Status() : absl::StatusOr<client::DaemonStatus>(c.status());
    if (!s.ok()) {
      all = false;
      consistent = false;
      m["reachable"] = false;
      m["error"] = std::string(s.status().message());
      absl::StrAppend(&line, "UNREACHABLE (", s.status().message(), ")");
    } else {
      m["reachable"] = true;
      m["version"] = s->version;
      m["tag"] = s->tag;
      m["engine_dirty"] = s->engine_dirty;
      m["group"] = GroupJson(s->group);
      absl::StrAppend(&line, "version ", s->version, s->tag.empty() ? "" : absl::StrCat(" (tag ", s->tag, ")"), "; ",
                      s->group.name.empty() ? "in no group" : GroupLine(s->group));
      if (i == 0) consistent_tag = s->group.tag;
      consistent = consistent && !s->group.dirty && s->group.phase == "idle" && s->group.tag == consistent_tag;
    }
    if (!json_output) std::cout << line << "\n";
    out.push_back(std::move(m));
    ++i;
  }
  if (json_output) {
    std::cout << json{{"ok", all}, {"members", out}, {"consistent", consistent}}.dump() << "\n";
  } else {
    std::cout << "group:    " << (consistent ? absl::StrCat("consistent at '", consistent_tag, "'") : "NOT consistent")
              << "\n";
  }
  return all ? kExitOk : kExitFailure;
}

}  // namespace

int RunStatus(std::span<const std::string> args) {
  const bool json_output = absl::GetFlag(FLAGS_json);
  if (const std::string members = absl::GetFlag(FLAGS_members); !members.empty()) {
    return GroupMembersStatus(members, json_output);
  }
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(DaemonAddress());
  if (!c.ok()) return Error(c.status().message());
  absl::StatusOr<client::DaemonStatus> s = (*c)->Status();
  if (!s.ok()) return Error(s.status().message());
  json ranks = json::array();
  std::string rank_lines;
  for (const client::EngineRankInfo& k : s->ranks) {
    ranks.push_back(json{{"tp_rank", k.tp_rank},
                         {"registered", k.registered},
                         {"ep_rank", k.ep_rank},
                         {"device", k.device},
                         {"version", k.version},
                         {"tag", k.tag},
                         {"dirty", k.dirty},
                         {"left_dirty", k.left_dirty},
                         {"responsive", k.responsive},
                         {"params", k.params},
                         {"bytes", k.bytes},
                         {"asleep", k.asleep}});
    absl::StrAppend(
        &rank_lines, "  rank ", k.tp_rank, ":  ",
        k.registered
            ? absl::StrCat("version ", k.version, ", ", k.params, " parameters, ", k.bytes, " bytes",
                           k.device >= 0 ? absl::StrCat(", GPU ", k.device) : "", k.dirty ? ", DIRTY" : "",
                           k.asleep ? ", ASLEEP" : "", k.responsive ? "" : ", UNRESPONSIVE")
            : absl::StrCat("MISSING (not registered", k.left_dirty ? "; left dirty during a failed commit" : "", ")"),
        "\n");
  }
  if (json_output) {
    std::cout << json{{"ok", true},
                      {"model", s->model},
                      {"ranks", ranks},
                      {"engine_registered", s->engine_registered},
                      {"engine_params", s->engine_params},
                      {"engine_bytes", s->engine_bytes},
                      {"engine_dirty", s->engine_dirty},
                      {"engine_responsive", s->engine_responsive},
                      {"engine_asleep", s->engine_asleep},
                      {"awaiting_wake", s->awaiting_wake},
                      {"version", s->version},
                      {"tag", s->tag},
                      {"verify_after_commit", s->verify_after_commit},
                      {"verify_mismatches", s->verify_mismatches},
                      {"active_session", s->active_session},
                      {"staging_bytes", s->staging_bytes},
                      {"staging_limit_bytes", s->staging_limit_bytes},
                      {"ring_bytes", s->ring_bytes},
                      {"ring_on_device", s->ring_on_device},
                      {"committed", s->committed},
                      {"refused", s->refused},
                      {"aborted", s->aborted},
                      {"data_endpoint", s->data_endpoint},
                      {"group", GroupJson(s->group)},
                      {"last_refit",
                       s->last_report.outcome == Outcome::kNone ? json(nullptr) : ReportJson(s->last_report)}}
                     .dump()
              << "\n";
    return kExitOk;
  }
  std::cout << "model:    " << s->model << "\n"
            << "engine:   " << (s->engine_registered ? absl::StrCat(s->engine_params, " parameters, ", s->engine_bytes, " bytes",
                                                                    s->engine_dirty ? ", DIRTY (only a full refit clears it)" : "",
                                                                    s->engine_responsive ? "" : ", UNRESPONSIVE (a pause/resume timed out)",
                                                                    s->engine_asleep ? ", ASLEEP (weights released)" : "")
                                                     : s->ranks.empty() ? "not registered" : "waiting for every rank")
            << "\n"
            << rank_lines
            << "version:  " << s->version << (s->tag.empty() ? "" : absl::StrCat(" (tag ", s->tag, ")")) << "\n"
            << "verify:   "
            << (s->verify_after_commit ? absl::StrCat("after each commit, ", s->verify_mismatches, " mismatches") : "off")
            << "\n"
            << "session:  "
            << (s->awaiting_wake      ? absl::StrCat("#", s->awaiting_wake, " staged, commits when the engine wakes")
                : s->active_session ? absl::StrCat("#", s->active_session, " active")
                                    : "none")
            << "\n"
            << "staging:  " << s->staging_bytes << " of " << s->staging_limit_bytes << " bytes\n"
            << "ring:     " << s->ring_bytes << " bytes in " << (s->ring_on_device ? "GPU" : "host") << " memory\n"
            << "refits:   " << s->committed << " committed, " << s->refused << " refused, " << s->aborted << " aborted\n"
            << "data:     " << s->data_endpoint << "\n"
            << "last:     " << (s->last_report.outcome == Outcome::kNone ? "none" : ReportLine(s->last_report)) << "\n";
  if (!s->group.name.empty()) std::cout << "group:    " << GroupLine(s->group) << "\n";
  return kExitOk;
}

int RunRefit(std::span<const std::string> args) {
  const bool json_output = absl::GetFlag(FLAGS_json);
  absl::StatusOr<std::vector<std::unique_ptr<formats::SafetensorsFile>>> files = OpenCheckpoint(args[0]);
  if (!files.ok()) return Error(files.status().message());
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(DaemonAddress());
  if (!c.ok()) return Error(c.status().message());
  Manifest manifest;
  if (!absl::GetFlag(FLAGS_model).empty()) {
    manifest.model = absl::GetFlag(FLAGS_model);
  } else {
    absl::StatusOr<client::DaemonStatus> s = (*c)->Status();
    if (!s.ok()) return Error(s.status().message());
    manifest.model = s->model;
  }
  manifest.partial = absl::GetFlag(FLAGS_partial);
  manifest.tag = absl::GetFlag(FLAGS_tag);
  manifest.stage_only = absl::GetFlag(FLAGS_stage_only);
  uint64_t total = 0;
  for (const auto& file : *files) {
    for (const formats::SafetensorsEntry& e : file->view().tensors()) {
      manifest.tensors.push_back({e.name, e.dtype, e.shape, 0, e.end - e.begin});
      total += e.end - e.begin;
    }
  }
  absl::StatusOr<std::unique_ptr<client::RefitSession>> session = (*c)->Begin(manifest);
  if (!session.ok()) {
    return Error(session.status().message(),
                 session.status().code() == absl::StatusCode::kFailedPrecondition ? kExitRefused : kExitFailure);
  }
  const bool progress = absl::GetFlag(FLAGS_progress) || (!json_output && isatty(STDERR_FILENO));
  uint64_t sent = 0;
  size_t count = 0;
  for (const auto& file : *files) {
    for (const formats::SafetensorsEntry& e : file->view().tensors()) {
      absl::Status st = (*session)->Push({e.name, e.dtype, e.shape, file->view().Data(e).data()});
      if (!st.ok()) return Error(st.message());
      sent += e.end - e.begin;
      ++count;
      if (progress) {
        std::fprintf(stderr, "\rrefitctl: %zu/%zu tensors, %.1f/%.1f MB", count, manifest.tensors.size(), sent / 1e6,
                     total / 1e6);
      }
    }
  }
  if (progress) std::fprintf(stderr, "\n");
  absl::StatusOr<RefitReport> report = (*session)->Commit();
  if (!report.ok()) {
    return Error(report.status().message(),
                 report.status().code() == absl::StatusCode::kFailedPrecondition ? kExitRefused : kExitFailure);
  }
  if (json_output) {
    json j = ReportJson(*report);
    j["ok"] = true;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << ReportLine(*report) << "\n";
  }
  return kExitOk;
}

namespace {

// The report of a commit by tag or a rollback, printed like a refit's.
int PrintKeptCommit(const absl::StatusOr<RefitReport>& report) {
  if (!report.ok()) {
    const absl::StatusCode code = report.status().code();
    return Error(report.status().message(),
                 code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kNotFound ? kExitRefused
                                                                                                      : kExitFailure);
  }
  if (absl::GetFlag(FLAGS_json)) {
    json j = ReportJson(*report);
    j["ok"] = true;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << ReportLine(*report) << "\n";
  }
  return kExitOk;
}

}  // namespace

int RunCommitVersion(std::span<const std::string> args) {
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(DaemonAddress());
  if (!c.ok()) return Error(c.status().message());
  return PrintKeptCommit((*c)->CommitVersion(args[0]));
}

int RunRollback(std::span<const std::string> args) {
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(DaemonAddress());
  if (!c.ok()) return Error(c.status().message());
  return PrintKeptCommit((*c)->Rollback());
}

int RunVersions(std::span<const std::string> args) {
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(DaemonAddress());
  if (!c.ok()) return Error(c.status().message());
  absl::StatusOr<client::VersionsList> list = (*c)->Versions();
  if (!list.ok()) return Error(list.status().message());
  if (absl::GetFlag(FLAGS_json)) {
    json versions = json::array();
    for (const client::StagedVersionInfo& v : list->versions) {
      versions.push_back(json{{"tag", v.tag},
                              {"state", v.state},
                              {"version", v.version},
                              {"bytes", v.bytes},
                              {"checksum", ChecksumHex(v.checksum)},
                              {"session", v.session_id}});
    }
    std::cout << json{{"ok", true},
                      {"hold", list->hold_limit},
                      {"staging_limit_bytes", list->staging_limit_bytes},
                      {"versions", versions}}
                     .dump()
              << "\n";
    return kExitOk;
  }
  std::cout << "hold: " << list->hold_limit << ", staging limit " << list->staging_limit_bytes << " bytes\n";
  if (list->versions.empty()) std::cout << "no versions in staging\n";
  for (const client::StagedVersionInfo& v : list->versions) {
    std::cout << absl::StrCat(v.state, " ", v.tag.empty() ? "(untagged)" : v.tag,
                              v.version != 0 ? absl::StrCat(" version=", v.version) : "", " bytes=", v.bytes,
                              " checksum=", ChecksumHex(v.checksum), " session=", v.session_id)
              << "\n";
  }
  return kExitOk;
}

int RunAbort(std::span<const std::string> args) {
  const bool json_output = absl::GetFlag(FLAGS_json);
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(DaemonAddress());
  if (!c.ok()) return Error(c.status().message());
  const std::string reason = absl::GetFlag(FLAGS_reason);
  absl::StatusOr<bool> aborted = (*c)->AbortActive(reason);
  if (!aborted.ok()) return Error(aborted.status().message());
  if (json_output) {
    std::cout << json{{"ok", true}, {"aborted", *aborted}}.dump() << "\n";
  } else {
    std::cout << (*aborted ? "aborted the active session\n" : "no active session\n");
  }
  return *aborted ? kExitOk : kExitNothing;
}

int RunVerify(std::span<const std::string> args) {
  const bool json_output = absl::GetFlag(FLAGS_json);
  absl::StatusOr<std::vector<std::unique_ptr<formats::SafetensorsFile>>> files = OpenCheckpoint(args[0]);
  if (!files.ok()) return Error(files.status().message());
  std::map<std::string, uint64_t> expected;
  for (const auto& file : *files) {
    for (const formats::SafetensorsEntry& e : file->view().tensors()) {
      std::span<const uint8_t> d = file->view().Data(e);
      expected[e.name] = Checksum64(d.data(), d.size());
    }
  }
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(DaemonAddress());
  if (!c.ok()) return Error(c.status().message());
  auto sums = (*c)->Checksums();
  if (!sums.ok()) return Error(sums.status().message());
  std::vector<std::string> mismatched, unchecked, absent;
  size_t matched = 0;
  for (const client::ParamChecksum& p : sums->second) {
    auto it = expected.find(p.name);
    if (it == expected.end()) {
      unchecked.push_back(p.name);
    } else if (it->second != p.checksum) {
      mismatched.push_back(p.name);
    } else {
      ++matched;
    }
    if (it != expected.end()) expected.erase(it);
  }
  for (const auto& [name, sum] : expected) absent.push_back(name);
  const bool ok = mismatched.empty() && absent.empty() && (!absl::GetFlag(FLAGS_strict) || unchecked.empty());
  if (json_output) {
    std::cout << json{{"ok", ok},
                      {"version", sums->first},
                      {"matched", matched},
                      {"mismatched", mismatched},
                      {"not_in_engine", absent},
                      {"not_in_checkpoint", unchecked}}
                     .dump()
              << "\n";
  } else {
    std::cout << "version " << sums->first << ": " << matched << " parameters match";
    if (!mismatched.empty()) std::cout << ", " << mismatched.size() << " differ";
    if (!absent.empty()) std::cout << ", " << absent.size() << " tensors of the checkpoint are not engine parameters";
    if (!unchecked.empty()) std::cout << ", " << unchecked.size() << " engine parameters not in the checkpoint";
    std::cout << "\n";
    for (const std::string& n : mismatched) std::cout << "  differs: " << n << "\n";
    for (const std::string& n : absent) std::cout << "  not in engine: " << n << "\n";
  }
  return ok ? kExitOk : kExitRefused;
}

}  // namespace refit::refitctl
