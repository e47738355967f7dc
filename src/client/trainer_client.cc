#include "client/trainer_client.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "client/trainer_client_internal.h"

namespace refit::client {

absl::Status FromException(const kj::Exception& e) {
  std::string msg = e.getDescription().cStr();
  constexpr std::string_view kPrefix = "remote exception: ";
  if (msg.rfind(kPrefix, 0) == 0) msg = msg.substr(kPrefix.size());
  if (e.getType() == kj::Exception::Type::DISCONNECTED) {
    return absl::UnavailableError(absl::StrCat("refitd disconnected: ", msg, TlsDisconnectHint(msg)));
  }
  if (e.getType() == kj::Exception::Type::OVERLOADED) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

absl::Status Prefixed(const absl::Status& st, const std::string& prefix) {
  if (prefix.empty()) return st;
  return WithCause(absl::Status(st.code(), absl::StrCat(prefix, st.message())), CauseOf(st));
}

bool CommitSpins() {
  static const bool spins = BusyPollWanted("auto");
  return spins;
}

TrainerClient::TrainerClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainerClient::~TrainerClient() = default;

absl::StatusOr<std::unique_ptr<TrainerClient>> TrainerClient::Connect(const std::string& address) {
  absl::StatusOr<std::unique_ptr<Impl>> impl = OpenControl(address);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<TrainerClient>(new TrainerClient(std::move(*impl)));
}

absl::StatusOr<std::unique_ptr<RefitSession>> TrainerClient::Begin(const Manifest& manifest) {
  absl::StatusOr<std::unique_ptr<RefitSession::Impl>> s = OpenSession({impl_.get()}, impl_->data, false, &manifest, {});
  if (!s.ok()) return s.status();
  return std::make_unique<RefitSession>(std::move(*s));
}

absl::StatusOr<std::unique_ptr<RefitSession>> TrainerClient::Join(uint64_t session_id) {
  absl::StatusOr<std::unique_ptr<RefitSession::Impl>> s =
      OpenSession({impl_.get()}, impl_->data, false, nullptr, {session_id});
  if (!s.ok()) return s.status();
  return std::make_unique<RefitSession>(std::move(*s));
}

FanoutClient::FanoutClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FanoutClient::~FanoutClient() = default;

absl::StatusOr<std::unique_ptr<FanoutClient>> FanoutClient::Connect(const std::vector<std::string>& addresses) {
  if (addresses.empty()) return absl::InvalidArgumentError("fan-out: no refitd addresses");
  auto impl = std::make_unique<Impl>();
  for (const std::string& a : addresses) {
    absl::StatusOr<std::unique_ptr<TrainerClient>> c = TrainerClient::Connect(a);
    if (!c.ok()) return c.status();
    impl->daemons.push_back(std::move(*c));
  }
  return std::unique_ptr<FanoutClient>(new FanoutClient(std::move(impl)));
}

size_t FanoutClient::size() const { return impl_->daemons.size(); }
TrainerClient& FanoutClient::daemon(size_t i) { return *impl_->daemons.at(i); }

absl::StatusOr<std::unique_ptr<RefitSession>> FanoutClient::Begin(const Manifest& manifest) {
  std::vector<TrainerClient::Impl*> clients;
  for (auto& d : impl_->daemons) clients.push_back(d->impl_.get());
  absl::StatusOr<std::unique_ptr<RefitSession::Impl>> s = OpenSession(clients, impl_->data, true, &manifest, {});
  if (!s.ok()) return s.status();
  return std::make_unique<RefitSession>(std::move(*s));
}

absl::StatusOr<std::unique_ptr<RefitSession>> FanoutClient::Join(const std::vector<uint64_t>& session_ids) {
  if (session_ids.size() != impl_->daemons.size()) {
    return absl::InvalidArgumentError(absl::StrCat("fan-out join: ", session_ids.size(), " session ids for ",
                                                   impl_->daemons.size(), " daemons"));
  }
  std::vector<TrainerClient::Impl*> clients;
  for (auto& d : impl_->daemons) clients.push_back(d->impl_.get());
  absl::StatusOr<std::unique_ptr<RefitSession::Impl>> s = OpenSession(clients, impl_->data, true, nullptr, session_ids);
  if (!s.ok()) return s.status();
  return std::make_unique<RefitSession>(std::move(*s));
}

absl::StatusOr<DaemonStatus> TrainerClient::Status() {
  return Call([&]() {
    auto resp = impl_->daemon.statusRequest().send().wait(impl_->io.waitScope);
    auto r = resp.getStatus();
    DaemonStatus s;
    s.model = wire::Str(r.getModel());
    s.engine_registered = r.getEngineRegistered();
    s.engine_params = r.getEngineParams();
    s.engine_bytes = r.getEngineBytes();
    s.version = r.getVersion();
    s.tag = wire::Str(r.getTag());
    s.active_session = r.getActiveSession();
    s.staging_bytes = r.getStagingBytes();
    s.staging_limit_bytes = r.getStagingLimitBytes();
    s.ring_bytes = r.getRingBytes();
    s.ring_on_device = r.getRingOnDevice();
    s.committed = r.getCommitted();
    s.refused = r.getRefused();
    s.aborted = r.getAborted();
    s.data_endpoint = wire::Str(r.getDataEndpoint());
    s.daemon_version = wire::Str(r.getDaemonVersion());
    s.daemon_commit = wire::Str(r.getDaemonCommit());
    s.engine_dirty = r.getEngineDirty();
    s.engine_asleep = r.getEngineAsleep();
    s.awaiting_wake = r.getAwaitingWake();
    s.engine_responsive = !r.getEngineRegistered() || r.getEngineResponsive();
    s.verify_after_commit = r.getVerifyAfterCommit();
    s.verify_mismatches = r.getVerifyMismatches();
    for (auto k : r.getRanks()) {
      EngineRankInfo info;
      info.tp_rank = k.getTpRank();
      info.registered = k.getRegistered();
      info.ep_rank = k.getEpRank();
      info.device = k.getDevice();
      info.version = k.getVersion();
      info.tag = wire::Str(k.getTag());
      info.dirty = k.getDirty();
      info.left_dirty = k.getLeftDirty();
      info.responsive = k.getResponsive();
      info.params = k.getParams();
      info.bytes = k.getBytes();
      info.asleep = k.getAsleep();
      s.ranks.push_back(std::move(info));
    }
    s.last_report = wire::FromWire(r.getLastReport());
    if (r.hasGroup()) {
      auto g = r.getGroup();
      s.group.name = wire::Str(g.getName());
      s.group.members = g.getMembers();
      s.group.member = g.getMember();
      s.group.phase = wire::Str(g.getPhase());
      s.group.tag = wire::Str(g.getTag());
      s.group.pending_tag = wire::Str(g.getPendingTag());
      s.group.dirty = g.getDirty();
      s.group.reason = wire::Str(g.getReason());
      s.group.deadline_left_ms = g.getDeadlineLeftMs();
      s.group.commits = g.getGroupCommits();
      s.group.aborts = g.getGroupAborts();
      s.group.deadline_expiries = g.getDeadlineExpiries();
      s.group.group_version = wire::Str(g.getGroupVersion());
    }
    return s;
  });
}

absl::StatusOr<bool> TrainerClient::AbortActive(const std::string& reason) {
  return Call([&]() {
    auto req = impl_->daemon.abortActiveRequest();
    req.setReason(reason);
    return req.send().wait(impl_->io.waitScope).getAborted();
  });
}

absl::StatusOr<std::pair<uint64_t, std::vector<ParamChecksum>>> TrainerClient::Checksums() {
  return Call([&]() -> absl::StatusOr<std::pair<uint64_t, std::vector<ParamChecksum>>> {
    auto resp = impl_->daemon.checksumsRequest().send().wait(impl_->io.waitScope);
    if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
    std::vector<ParamChecksum> out;
    for (auto p : resp.getParams()) out.push_back({wire::Str(p.getName()), p.getChecksum(), p.getNbytes()});
    return std::make_pair(static_cast<uint64_t>(resp.getVersion()), std::move(out));
  });
}

absl::StatusOr<RefitReport> TrainerClient::CommitVersion(const std::string& tag) {
  impl_->last_commit_report.reset();
  return Call([&]() -> absl::StatusOr<RefitReport> {
    auto req = impl_->daemon.commitVersionRequest();
    req.setTag(wire::Text(tag));
    auto resp = req.send().wait(impl_->io.waitScope);
    return CommitAnswer(resp, &impl_->last_commit_report);
  });
}

absl::StatusOr<RefitReport> TrainerClient::Rollback() {
  impl_->last_commit_report.reset();
  return Call([&]() -> absl::StatusOr<RefitReport> {
    auto resp = impl_->daemon.rollbackRequest().send().wait(impl_->io.waitScope);
    return CommitAnswer(resp, &impl_->last_commit_report);
  });
}

std::optional<RefitReport> TrainerClient::last_commit_report() const { return impl_->last_commit_report; }

absl::StatusOr<VersionsList> TrainerClient::Versions() {
  return Call([&]() -> absl::StatusOr<VersionsList> {
    auto resp = impl_->daemon.versionsRequest().send().wait(impl_->io.waitScope);
    VersionsList out;
    out.hold_limit = resp.getHoldLimit();
    out.staging_limit_bytes = resp.getStagingLimitBytes();
    for (auto v : resp.getVersions()) {
      out.versions.push_back({wire::Str(v.getTag()), wire::Str(v.getState()), v.getVersion(), v.getBytes(),
                              v.getChecksum(), v.getSessionId()});
    }
    return out;
  });
}

RefitSession::RefitSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RefitSession::~RefitSession() {
  if (!impl_->done) (void)Abort("trainer closed the session without committing");
}

void RefitSession::SetWireTamper(std::function<void(uint32_t, std::vector<uint8_t>&)> tamper) {
  impl_->tamper = std::move(tamper);
}

uint64_t RefitSession::id() const {
  // A pipelined begin's id is the trainer's choice: once refitd answered, ranks handed it can
  // join (a refused begin's id joins nothing; its first push reports why).
  (void)impl_->CheckBegun();
  return impl_->members.front().id;
}
std::vector<uint64_t> RefitSession::ids() const {
  std::vector<uint64_t> out;
  for (const auto& m : impl_->members) out.push_back(m.id);
  return out;
}
uint64_t RefitSession::bucket_bytes() const { return impl_->bucket_bytes; }

absl::StatusOr<std::vector<RefitReport>> RefitSession::CommitAll() {
  impl_->reports.assign(impl_->members.size(), std::nullopt);
  absl::Status st = Flush();
  if (!st.ok()) {
    (void)impl_->WaitInFlight();
    impl_->data->Drop();
    return st;
  }
  impl_->done = true;
  // A pipelined begin refused: nothing to commit (a session with buckets knew it at their announce).
  if (absl::Status begun = impl_->CheckBegun(); !begun.ok()) return begun;
  // Every bucket is announced: the commit goes out now, while the last sends are still read (refitd's
  // commit waits for every announced bucket itself), and this trainer's memory is free again only
  // once those sends ended (below).
  std::vector<std::unique_ptr<capnp::RemotePromise<proto::Session::CommitResults>>> calls;
  for (auto& m : impl_->members) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      calls.push_back(std::make_unique<capnp::RemotePromise<proto::Session::CommitResults>>(m.session.commitRequest().send()));
    })) {
      calls.push_back(nullptr);
    }
  }
  impl_->wait().poll();  // writes the requests
  TracePoint("trainer.commit_sent");
  const absl::Time spin_until = CommitSpins() ? absl::Now() + kCommitSpinBound : absl::InfinitePast();
  SpinUntil([&] { return impl_->SendsReturned(); }, spin_until);
  absl::Status sent = impl_->WaitInFlight();
  // The last buckets' announces (own_seqs): one refitd refused ended the session.
  if (absl::Status announced = impl_->CheckAnnounced(); !announced.ok()) {
    if (!sent.ok()) impl_->data->Drop();
    return announced;
  }
  if (!sent.ok()) {
    // A send failed: the data plane is dropped, which fails refitd's session (and the commit
    // waiting for its buckets). The commit's answer then says why the session ended (often what
    // failed the send: refitd aborted it and dropped the connection).
    impl_->data->Drop();
  }
  std::vector<RefitReport> reports;
  absl::Status failed;
  std::vector<std::string> outcomes;
  for (size_t i = 0; i < impl_->members.size(); ++i) {
    absl::StatusOr<RefitReport> r = Call([&]() -> absl::StatusOr<RefitReport> {
      if (calls[i] != nullptr) {
        SpinUntil([&] { return calls[i]->poll(impl_->wait()); }, spin_until);
        auto resp = calls[i]->wait(impl_->wait());
        TracePoint("trainer.commit_answered");
        return CommitAnswer(resp, &impl_->reports[i]);
      }
      KJ_FAIL_REQUIRE("commit request could not be sent");
    });
    if (r.ok()) {
      reports.push_back(*r);
      outcomes.push_back(absl::StrCat(impl_->Who(i), "committed version ", r->version));
    } else {
      if (failed.ok()) failed = r.status();
      outcomes.push_back(absl::StrCat(impl_->Who(i), r.status().message()));
    }
  }
  // An answer lost with the connection says less than the failed send.
  if (!sent.ok() && absl::IsUnavailable(failed)) return sent;
  if (!failed.ok()) {
    // The session ended without committing; refitd may have dropped this trainer's data-plane
    // connection meanwhile (a deadline passed while the commit waited): the next session
    // connects afresh rather than send into a connection nobody reads.
    impl_->data->Drop();
    if (impl_->members.size() == 1) return failed;
    std::string all;
    for (const std::string& o : outcomes) absl::StrAppend(&all, all.empty() ? "" : "; ", o);
    return WithCause(absl::Status(failed.code(), absl::StrCat("fan-out commit incomplete: ", all)), CauseOf(failed));
  }
  return reports;
}

absl::StatusOr<RefitReport> RefitSession::Commit() {
  absl::StatusOr<std::vector<RefitReport>> all = CommitAll();
  if (!all.ok()) return all.status();
  return all->front();
}

std::optional<RefitReport> RefitSession::report() const {
  for (const std::optional<RefitReport>& r : impl_->reports) {
    if (r.has_value() && r->outcome != Outcome::kCommitted && r->outcome != Outcome::kStaged) return r;
  }
  return impl_->reports.empty() ? std::nullopt : impl_->reports.front();
}

std::vector<std::optional<RefitReport>> RefitSession::reports() const {
  if (impl_->reports.empty()) return std::vector<std::optional<RefitReport>>(impl_->members.size());
  return impl_->reports;
}

absl::Status RefitSession::Detach() {
  absl::Status st = Flush();
  if (absl::Status last = impl_->WaitInFlight(); st.ok()) st = last;
  if (absl::Status announced = impl_->CheckAnnounced(); !announced.ok()) st = announced;
  if (!st.ok()) return st;
  impl_->done = true;
  for (size_t i = 0; i < impl_->members.size(); ++i) {
    absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
      auto resp = impl_->members[i].session.detachRequest().send().wait(impl_->wait());
      if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
      return true;
    });
    if (!ok.ok() && st.ok()) st = Prefixed(ok.status(), impl_->Who(i));
  }
  return st;
}

absl::Status RefitSession::Abort(const std::string& reason) {
  impl_->done = true;
  impl_->run_header.tensors.clear();  // a run not yet announced is not sent
  (void)impl_->WaitInFlight();
  impl_->pending_announces.clear();  // their answers no longer matter
  if (!impl_->CheckBegun().ok()) return absl::OkStatus();  // a pipelined begin refused: nothing began
  absl::Status st;
  for (size_t i = 0; i < impl_->members.size(); ++i) {
    absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
      auto req = impl_->members[i].session.abortRequest();
      req.setReason(reason);
      auto resp = req.send().wait(impl_->wait());
      if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
      return true;
    });
    if (!ok.ok() && st.ok()) st = Prefixed(ok.status(), impl_->Who(i));
  }
  return st;
}

}  // namespace refit::client
