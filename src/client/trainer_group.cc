// FanoutClient's engine-group commit (docs/architecture.md "Engine groups"): the coordinator's
// side of the two phases' second half. Every call goes to every member at once (one event loop,
// one promise per member), each bounded by the phase's timeout.
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/trainer_client.h"
#include "client/trainer_client_internal.h"

namespace refit::client {
namespace {

constexpr uint32_t kDefaultGroupTimeoutMs = 10'000;

// Sends one call per member (`send(i)`: its answer's status) and waits for every answer, each
// bounded by `timeout`; a member that does not answer in time, or whose connection fails, has an
// error naming why.
template <typename Send>
std::vector<absl::Status> FanCall(std::vector<std::unique_ptr<TrainerClient>>& daemons, kj::AsyncIoContext& io,
                                  kj::Duration timeout, Send send) {
  std::vector<kj::Promise<absl::Status>> calls;
  for (size_t i = 0; i < daemons.size(); ++i) {
    kj::Promise<absl::Status> call = nullptr;
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() { call = send(i); })) {
      call = FromException(*e);
    }
    calls.push_back(io.provider->getTimer()
                        .timeoutAfter(timeout, kj::mv(call))
                        .catch_([timeout](kj::Exception&& e) -> absl::Status {
                          if (e.getType() == kj::Exception::Type::OVERLOADED &&
                              std::string(e.getDescription().cStr()).find("timed out") != std::string::npos) {
                            return absl::DeadlineExceededError(
                                absl::StrCat("no answer within ", timeout / kj::MILLISECONDS, " ms"));
                          }
                          return FromException(e);
                        }));
  }
  std::vector<absl::Status> out;
  for (auto& call : calls) {
    absl::Status st = absl::UnknownError("no answer");
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() { st = call.wait(io.waitScope); })) {
      st = FromException(*e);
    }
    out.push_back(std::move(st));
  }
  return out;
}

std::string MemberName(const TrainerClient::Impl& c) { return absl::StrCat("refitd at '", c.address, "'"); }

}  // namespace

absl::StatusOr<GroupCommitResult> FanoutClient::CommitGroup(const std::string& tag, uint32_t member_deadline_ms,
                                                            uint32_t timeout_ms,
                                                            const std::function<void()>& after_copied) {
  if (tag.empty()) return absl::InvalidArgumentError("group commit: a group version needs a tag");
  auto& daemons = impl_->daemons;
  kj::AsyncIoContext& io = daemons[0]->impl_->io;
  const kj::Duration timeout = (timeout_ms == 0 ? kDefaultGroupTimeoutMs : timeout_ms) * kj::MILLISECONDS;
  GroupCommitResult out;
  out.tag = tag;
  out.member_errors.assign(daemons.size(), "");
  std::vector<std::string> errors;
  auto note = [&](size_t i, const absl::Status& st, const char* phase) {
    if (st.ok()) return;
    out.member_errors[i] = std::string(st.message());
    errors.push_back(absl::StrCat(MemberName(*daemons[i]->impl_), " (", phase, "): ", st.message()));
  };

  // Commit: every member pauses its engine and copies; each answers "copied", still paused.
  std::vector<absl::Status> copied = FanCall(daemons, io, timeout, [&](size_t i) {
    auto req = daemons[i]->impl_->daemon.groupCommitRequest();
    req.setTag(wire::Text(tag));
    req.setDeadlineMs(member_deadline_ms);
    return req.send().then(
        [](capnp::Response<proto::Daemon::GroupCommitResults>&& r) { return wire::FromWire(r.getStatus()); });
  });
  bool all_copied = true;
  for (size_t i = 0; i < copied.size(); ++i) {
    note(i, copied[i], "commit");
    all_copied = all_copied && copied[i].ok();
  }

  if (all_copied) {
    // Every member holds the version, paused: every member resumes with it.
    if (after_copied) after_copied();
    std::vector<absl::Status> resumed = FanCall(daemons, io, timeout, [&](size_t i) {
      auto req = daemons[i]->impl_->daemon.groupResumeRequest();
      req.setTag(wire::Text(tag));
      return req.send().then(
          [](capnp::Response<proto::Daemon::GroupResumeResults>&& r) { return wire::FromWire(r.getStatus()); });
    });
    bool all_resumed = true;
    for (size_t i = 0; i < resumed.size(); ++i) {
      note(i, resumed[i], "resume");
      all_resumed = all_resumed && resumed[i].ok();
    }
    out.outcome = all_resumed ? "committed" : "dirty";
  } else {
    // Some member cannot hold the version in its engine: nobody serves it.
    const std::string reason = absl::StrCat("not every member copied it: ", absl::StrJoin(errors, "; "));
    std::vector<absl::Status> aborted = FanCall(daemons, io, timeout, [&](size_t i) {
      auto req = daemons[i]->impl_->daemon.groupAbortRequest();
      req.setTag(wire::Text(tag));
      req.setReason(wire::Text(reason));
      return req.send().then(
          [](capnp::Response<proto::Daemon::GroupAbortResults>&& r) { return wire::FromWire(r.getStatus()); });
    });
    bool restored = true;
    for (size_t i = 0; i < aborted.size(); ++i) {
      // A member that copied and could not restore leaves the group dirty; one that never copied
      // (lost, refused) holds what it held.
      if (!aborted[i].ok() && copied[i].ok()) restored = false;
      note(i, aborted[i], "abort");
    }
    out.outcome = restored ? "aborted" : "dirty";
  }
  out.error = absl::StrJoin(errors, "; ");
  return out;
}

absl::Status FanoutClient::AbortGroup(const std::string& tag, const std::string& reason, uint32_t timeout_ms) {
  auto& daemons = impl_->daemons;
  kj::AsyncIoContext& io = daemons[0]->impl_->io;
  const kj::Duration timeout = (timeout_ms == 0 ? kDefaultGroupTimeoutMs : timeout_ms) * kj::MILLISECONDS;
  std::vector<absl::Status> aborted = FanCall(daemons, io, timeout, [&](size_t i) {
    auto req = daemons[i]->impl_->daemon.groupAbortRequest();
    req.setTag(wire::Text(tag));
    req.setReason(wire::Text(reason));
    return req.send().then(
        [](capnp::Response<proto::Daemon::GroupAbortResults>&& r) { return wire::FromWire(r.getStatus()); });
  });
  std::vector<std::string> errors;
  for (size_t i = 0; i < aborted.size(); ++i) {
    if (!aborted[i].ok()) errors.push_back(absl::StrCat(MemberName(*daemons[i]->impl_), ": ", aborted[i].message()));
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("group abort of '", tag, "': ", absl::StrJoin(errors, "; ")));
}

}  // namespace refit::client
