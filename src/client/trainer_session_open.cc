#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "client/trainer_client_internal.h"

namespace refit::client {
namespace {

// The same tensor list: every field a manifest carries (a list with a supplied amax never is).
bool SameTensors(const std::vector<TensorDesc>& a, const std::vector<TensorDesc>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const TensorDesc& x = a[i];
    const TensorDesc& y = b[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.offset != y.offset || x.nbytes != y.nbytes ||
        x.slice.dim != y.slice.dim || x.slice.start != y.slice.start || x.slice.full_shape != y.slice.full_shape ||
        x.amax.has_value() || y.amax.has_value()) {
      return false;
    }
  }
  return true;
}

// Wire format checkpoint: daemon i's plan of what this trainer converts. Every daemon of a
// fan-out must plan the same conversions (one packed bucket feeds them all).
absl::Status UseWirePlan(RefitSession::Impl& s, size_t i, bool has, proto::WirePlan::Reader r) {
  WirePlan plan;
  if (has) {
    absl::StatusOr<WirePlan> p = wire::FromWire(r);
    if (!p.ok()) return p.status();
    plan = std::move(*p);
  }
  absl::StatusOr<TrainerConverter> c = TrainerConverter::Create(plan);
  if (!c.ok()) return c.status();
  if (i == 0) {
    s.convert = std::move(*c);
    return absl::OkStatus();
  }
  bool same = c->size() == s.convert.size();
  for (const WireTensor& w : plan.tensors) {
    const TrainerConverter::Entry* mine = s.convert.Find(w.name);
    same = same && mine != nullptr && formats::FormatName(mine->format) == w.format && mine->transpose == w.transpose &&
           mine->outputs.size() == w.outputs.size() && mine->amax_group == w.amax_group;
  }
  if (!same) {
    return absl::FailedPreconditionError(
        "fan-out with wire format checkpoint: the daemons plan the trainer's conversions differently (their specs "
        "differ); use wire format bf16");
  }
  return absl::OkStatus();
}

// A trainer environment switch: `name` set to "1" (on) or "0" (off), else `default_on`. Read at
// each begin (a process may change it between refits).
bool EnvSwitch(const char* name, bool default_on) {
  const char* v = std::getenv(name);
  if (v == nullptr) return default_on;
  return std::string_view(v) == "1";
}

// A begin that does not wait for its answer (one daemon; on unless `REFIT_PIPELINED_BEGIN=0`):
// when the manifest goes by key and the last begin of that key was answered with this rank's own
// bucket numbers from 0, no wire plan, and the data plane this client is connected to, the
// trainer chooses the session's id (Daemon.begin's sessionId) and takes the session as promised
// (Cap'n Proto promise pipelining): its announces go out at once and refitd takes them as soon as
// it has planned the session (the begin's pipeline). The answer is checked later
// (RefitSession::Impl::CheckBegun): a refusal fails the session's first push or its commit with
// the begin's error. False: nothing was sent.
bool PipelinedBegin(RefitSession::Impl& s, TrainerClient::Impl& c, DataPlane& data, const Manifest& manifest) {
  if (!EnvSwitch("REFIT_PIPELINED_BEGIN", true) || !c.answered.ok || c.manifest_key == 0 ||
      manifest.wire_format != c.answered.wire_format || data.sender == nullptr ||
      data.endpoints != std::vector<std::string>{c.answered.endpoint} ||
      !SameTensors(c.manifest_tensors, manifest.tensors)) {
    return false;
  }
  uint64_t id = 0;
  while (id == 0) id = c.session_ids() & 0xFFFFFFFFu;
  bool sent = false;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                 TracePoint("trainer.begin_sent");
                 auto req = c.daemon.beginRequest();
                 req.setManifestKey(c.manifest_key);
                 req.setSessionId(id);
                 wire::ToWire(manifest, req.initManifest(), /*with_tensors=*/false);
                 auto call = std::make_unique<capnp::RemotePromise<proto::Daemon::BeginResults>>(req.send());
                 RefitSession::Impl::Member& m = s.members.front();
                 m.session = call->getSession();
                 m.id = id;
                 m.own_seqs = true;
                 m.next_seq = 0;
                 m.parallel_checksum = c.answered.parallel_checksum;
                 s.pending_begin = std::move(call);
                 sent = true;
               })) {
    return false;  // sent nothing (the connection is broken: the usual begin reports it)
  }
  if (!sent) return false;
  s.wait().poll();  // writes the request
  s.bucket_bytes = c.answered.bucket_bytes;
  // The same data plane: connected already; this reserves the buckets as a begin does.
  s.begin_status = data.Connect({c.answered.endpoint}, false, s.bucket_bytes);
  return true;
}

// Daemon i's part of the session from its begin or join answer (both carry the same fields):
// the session capability, its id, how buckets are numbered, the data endpoint (endpoints[i]),
// bucket size (bucket_bytes[i]) and the wire plan.
template <typename Answer>
absl::Status TakeMember(RefitSession::Impl& s, size_t i, uint64_t id, const Answer& resp,
                        std::vector<std::string>& endpoints, std::vector<uint64_t>& bucket_bytes) {
  s.members[i].session = resp.getSession();
  s.members[i].id = id;
  s.members[i].own_seqs = resp.getOwnSeqs();
  s.members[i].next_seq = resp.getSeqBase();
  s.members[i].parallel_checksum = resp.getParallelChecksum();
  bucket_bytes[i] = resp.getBucketBytes();
  endpoints[i] = resp.getDataEndpoint().cStr();
  return UseWirePlan(s, i, resp.hasWirePlan(), resp.getWirePlan());
}

// Sends the begin of `manifest` to every daemon (the requests go out together) and takes each
// answer: daemon i's session, its data endpoint (endpoints[i]) and bucket size (bucket_bytes[i]).
// The first error, naming its daemon.
absl::Status BeginOnAll(RefitSession::Impl& s, const std::vector<TrainerClient::Impl*>& clients,
                        const Manifest& manifest, std::vector<std::string>& endpoints,
                        std::vector<uint64_t>& bucket_bytes) {
  kj::WaitScope& wait = s.wait();
  absl::Status failed;
  TracePoint("trainer.begin_sent");
  // A daemon that kept this manifest's tensor list gets its key instead of the list.
  auto request = [&](TrainerClient::Impl* c, bool by_key) {
    auto req = c->daemon.beginRequest();
    if (by_key) req.setManifestKey(c->manifest_key);
    wire::ToWire(manifest, req.initManifest(), /*with_tensors=*/!by_key);
    return std::make_unique<capnp::RemotePromise<proto::Daemon::BeginResults>>(req.send());
  };
  std::vector<std::unique_ptr<capnp::RemotePromise<proto::Daemon::BeginResults>>> calls;
  std::vector<bool> by_key;
  for (TrainerClient::Impl* c : clients) {
    by_key.push_back(c->manifest_key != 0 && SameTensors(c->manifest_tensors, manifest.tensors));
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() { calls.push_back(request(c, by_key.back())); })) {
      calls.push_back(nullptr);
    }
  }
  for (size_t i = 0; i < clients.size(); ++i) {
    absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
      if (calls[i] != nullptr) {
        auto resp = calls[i]->wait(wait);
        if (resp.getNeedManifest() && by_key[i]) {
          // The daemon no longer has the list (it restarted, or another came): the whole
          // manifest, once (nothing else happened on that daemon).
          clients[i]->manifest_key = 0;
          by_key[i] = false;
          calls[i] = request(clients[i], false);
          resp = calls[i]->wait(wait);
        }
        TracePoint("trainer.begin_answered");
        if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
        if (!by_key[i]) {
          clients[i]->manifest_key = resp.getManifestKey();
          if (clients[i]->manifest_key != 0) clients[i]->manifest_tensors = manifest.tensors;
        }
        // What a pipelined begin by this key may expect next time (one daemon only).
        clients[i]->answered = {clients.size() == 1 && clients[i]->manifest_key != 0 && resp.getOwnSeqs() &&
                                    resp.getSeqBase() == 0 && resp.getWirePlan().getTensors().size() == 0,
                                resp.getDataEndpoint().cStr(), resp.getBucketBytes(), manifest.wire_format,
                                resp.getParallelChecksum()};
        if (absl::Status st = TakeMember(s, i, resp.getSessionId(), resp, endpoints, bucket_bytes); !st.ok()) {
          return st;
        }
        return true;
      }
      kj::throwFatalException(KJ_EXCEPTION(FAILED, "begin request could not be sent"));
    });
    if (!ok.ok() && failed.ok()) failed = Prefixed(ok.status(), s.Who(i));
  }
  return failed;
}

// Joins session ids[i] on daemon i, as BeginOnAll begins one.
absl::Status JoinOnAll(RefitSession::Impl& s, const std::vector<TrainerClient::Impl*>& clients,
                       const std::vector<uint64_t>& ids, std::vector<std::string>& endpoints,
                       std::vector<uint64_t>& bucket_bytes) {
  kj::WaitScope& wait = s.wait();
  absl::Status failed;
  for (size_t i = 0; i < clients.size(); ++i) {
    absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
      auto req = clients[i]->daemon.joinRequest();
      req.setSessionId(ids[i]);
      auto resp = req.send().wait(wait);
      if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
      if (absl::Status st = TakeMember(s, i, ids[i], resp, endpoints, bucket_bytes); !st.ok()) return st;
      return true;
    });
    if (!ok.ok() && failed.ok()) failed = Prefixed(ok.status(), s.Who(i));
  }
  return failed;
}

// Aborts the sessions a begin that `failed` opened on some daemons.
void AbortBegun(RefitSession::Impl& s, const absl::Status& failed) {
  kj::WaitScope& wait = s.wait();
  for (RefitSession::Impl::Member& m : s.members) {
    if (m.id == 0) continue;
    (void)Call([&]() {
      auto req = m.session.abortRequest();
      req.setReason(absl::StrCat("trainer could not open the session: ", failed.message()));
      req.send().wait(wait);
      return true;
    });
  }
}

}  // namespace

// Connects the control plane of one daemon (common/control_connect.h: Unix socket, TCP, TLS).
absl::StatusOr<std::unique_ptr<TrainerClient::Impl>> OpenControl(const std::string& address) {
  auto impl = std::make_unique<TrainerClient::Impl>();
  impl->address = address;
  absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
  if (!options.ok()) return options.status();
  absl::StatusOr<kj::Own<kj::AsyncIoStream>> conn =
      ConnectControl(impl->io.provider->getNetwork(), impl->io.waitScope, address, *options);
  if (!conn.ok()) {
    return absl::Status(conn.status().code(),
                        absl::StrCat("cannot connect to refitd at '", address, "': ", conn.status().message()));
  }
  impl->conn = kj::mv(*conn);
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                 impl->rpc = kj::heap<capnp::TwoPartyClient>(*impl->conn);
                 impl->daemon = impl->rpc->bootstrap().castAs<proto::Daemon>();
               })) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to refitd at '", address, "': ", e->getDescription().cStr()));
  }
  return impl;
}

// On a data plane with early sends (CUDA IPC), whether a pipelined begin's first buckets go before
// its answer (refitd holds them for the session: TagMatcher::Options::wait_for_sessions) or wait
// for it. On unless `REFIT_SEND_BEFORE_BEGIN=0` (docs/architecture.md "The pipelined begin").
bool SendsBeforeBegin() { return EnvSwitch("REFIT_SEND_BEFORE_BEGIN", true); }

// Begins (ids empty) or joins (ids[i] on daemon i) a session on every daemon; requests go out
// together. On failure the sessions already begun are aborted.
absl::StatusOr<std::unique_ptr<RefitSession::Impl>> OpenSession(const std::vector<TrainerClient::Impl*>& clients,
                                                                DataPlane& data, bool fanout, const Manifest* manifest,
                                                                const std::vector<uint64_t>& ids) {
  auto s = std::make_unique<RefitSession::Impl>();
  s->data = &data;
  s->member = manifest == nullptr;
  for (TrainerClient::Impl* c : clients) s->members.push_back({c});
  std::vector<std::string> endpoints(clients.size());
  std::vector<uint64_t> bucket_bytes(clients.size());
  if (manifest != nullptr && clients.size() == 1 && PipelinedBegin(*s, *clients.front(), data, *manifest)) {
    return s;
  }
  absl::Status failed = manifest != nullptr ? BeginOnAll(*s, clients, *manifest, endpoints, bucket_bytes)
                                            : JoinOnAll(*s, clients, ids, endpoints, bucket_bytes);
  if (failed.ok()) {
    s->bucket_bytes = *std::min_element(bucket_bytes.begin(), bucket_bytes.end());
    failed = data.Connect(endpoints, fanout, s->bucket_bytes);
    if (!failed.ok() && s->member) return failed;
  }
  if (!failed.ok()) {
    if (manifest != nullptr) AbortBegun(*s, failed);
    return failed;
  }
  return s;
}

absl::Status RefitSession::Impl::CheckBegun() {
  if (pending_begin == nullptr) return begin_status;
  std::unique_ptr<capnp::RemotePromise<proto::Daemon::BeginResults>> call = std::move(pending_begin);
  TrainerClient::Impl& c = *members.front().client;
  const uint64_t id = members.front().id;
  absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
    auto resp = call->wait(wait());
    TracePoint("trainer.begin_answered");
    if (resp.getNeedManifest()) {
      // refitd no longer keeps the list (it restarted, or many other lists came since): the next
      // begin sends it whole.
      c.manifest_key = 0;
      c.answered.ok = false;
      return absl::FailedPreconditionError(
          "refitd no longer keeps this trainer's manifest (it restarted, or many other manifests came since); "
          "the refit was not begun: begin it again");
    }
    if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
    if (resp.getSessionId() != id || !resp.getOwnSeqs() || resp.getSeqBase() != 0 ||
        resp.getWirePlan().getTensors().size() != 0 || resp.getBucketBytes() != bucket_bytes ||
        c.answered.endpoint != resp.getDataEndpoint().cStr() ||
        resp.getParallelChecksum() != c.answered.parallel_checksum) {
      c.answered.ok = false;
      return absl::InternalError(
          "refitd answered the begin unlike the one before it (session id, bucket numbers, bucket size, data plane, "
          "wire plan or checksum kind), which this trainer had taken as promised; begin again");
    }
    return true;
  });
  if (!ok.ok() && begin_status.ok()) begin_status = ok.status();
  return begin_status;
}

}  // namespace refit::client
