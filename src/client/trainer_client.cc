#include "client/trainer_client.h"
#include "client/trainer_convert.h"

#include "common/control_connect.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "capnp/rpc-twoparty.h"
#include "client/amax_meter.h"
#include "common/busy_poll.h"
#include "common/checksum.h"
#include "common/kept_threads.h"
#include "common/trace.h"
#include "kj/async-io.h"
#include "proto/refit.capnp.h"
#include "proto/wire.h"
#include "refit/convert.h"
#include "storage/memory.h"
#include "transport/builtin_transports.h"
#include "transport/registry.h"
#if REFIT_HAVE_CUDA
#include "transport/cuda_ipc/cuda_ipc_handles.h"
#endif

namespace refit::client {
namespace {

// A connection-level failure as an absl::Status. Failures refitd reports (refused, invalid,
// busy, no engine) arrive as typed statuses in the results, not as exceptions.
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

template <typename T>
struct Flat {
  using type = absl::StatusOr<T>;
};
template <typename T>
struct Flat<absl::StatusOr<T>> {
  using type = absl::StatusOr<T>;
};

// Runs a control-plane call; `f` returns a value, or a StatusOr carrying the call's own status.
template <typename F>
auto Call(F&& f) -> typename Flat<decltype(f())>::type {
  typename Flat<decltype(f())>::type out = absl::UnknownError("no result");
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { out = f(); })) { return FromException(*e); }
  return out;
}

// `st` with `prefix` before its message (naming a daemon of a fan-out), its code and cause kept.
absl::Status Prefixed(const absl::Status& st, const std::string& prefix) {
  if (prefix.empty()) return st;
  return WithCause(absl::Status(st.code(), absl::StrCat(prefix, st.message())), CauseOf(st));
}

// A commit's answer (Session.commit, Daemon.commitVersion, Daemon.rollback): its status, or the
// report of the refit it committed. The report of how it ended, whatever the outcome, goes to
// `*kept` when refitd sent one (it sends none for a commit it refused to start).
template <typename Results>
absl::StatusOr<RefitReport> CommitAnswer(Results& resp, std::optional<RefitReport>* kept) {
  if (resp.hasReport()) {
    RefitReport report = wire::FromWire(resp.getReport());
    if (report.outcome != Outcome::kNone) *kept = report;
  }
  if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
  return wire::FromWire(resp.getReport());
}

// KJ allows one event loop per thread: every client object made on a thread shares that thread's,
// which lives while any of them does.
struct ThreadIo {
  kj::AsyncIoContext io = kj::setupAsyncIo();
};

std::shared_ptr<ThreadIo> AcquireThreadIo() {
  thread_local std::weak_ptr<ThreadIo> current;
  std::shared_ptr<ThreadIo> io = current.lock();
  if (io == nullptr) {
    io = std::make_shared<ThreadIo>();
    current = io;
  }
  return io;
}

// Busy polling on the trainer's side (common/busy_poll.h; REFIT_BUSY_POLL, else on with 8 or
// more CPUs): a commit's wait for its last sends and its answer checks for them without sleeping,
// for at most kCommitSpinBound, so that the answer is taken when it comes instead of a sleeping
// thread's wake-up later (0.1-0.3 ms on a virtualized GPU host: docs/benchmarks.md run 32).
constexpr absl::Duration kCommitSpinBound = absl::Seconds(2);
bool CommitSpins() {
  static const bool spins = BusyPollWanted("auto");
  return spins;
}
// Spins until done() or `until`, whichever comes first.
template <typename F>
void SpinUntil(F&& done, absl::Time until) {
  while (absl::Now() < until && !done()) {
  }
}

// Runs sent in place (PushInPlace) that may be on their way at once. Three: while the daemon
// converts one and has the next queued behind it, the third already waits at the daemon, which
// takes it the moment a receive slot frees, without a round trip to this process.
constexpr int kRunLanes = 3;

// Where a session's buckets are packed and how they leave: one point-to-point sender
// (TrainerClient) or one group sender to every daemon (FanoutClient), of the transport that owns
// refitd's data endpoint. Buckets live where that transport's payloads live (its descriptor's
// payload_memory): in host memory, or on the caller's current CUDA device, packed by asynchronous
// copies into one of two buckets (bucket_bytes each) while the other one's bucket is being sent.
struct DataPlane {
  explicit DataPlane(transport::TransportRegistry registry) : transports(std::move(registry)) {}
  ~DataPlane() {
    for (std::unique_ptr<transport::Sender>& e : extra) e.reset();
    sender.reset();
    group.reset();
    if (memory != nullptr) (void)memory->Synchronize();  // before the buckets are freed
  }

  const transport::TransportRegistry transports;
  const transport::TransportDescriptor* transport = nullptr;  // of the connected endpoints
  std::unique_ptr<storage::Memory> memory;                    // where the buckets live
  int memory_device = -1;                                     // for device memory
  std::shared_ptr<uint8_t> bucket[2];
  uint64_t bucket_capacity = 0;
  int current = 0;  // the bucket Push packs into
  std::unique_ptr<transport::Sender> sender;
  std::unique_ptr<transport::GroupSender> group;
  std::vector<std::string> endpoints;  // what sender/group is connected to
  transport::ConnectConfig config;     // how they were connected
  // More connections to the same daemon for runs sent in place (PushInPlace), one per lane past
  // the first: a run is the trainer's own memory, not a bucket buffer waiting to be packed again,
  // so several can be on their way at once. Connected at the first run that needs each.
  std::unique_ptr<transport::Sender> extra[kRunLanes - 1];
  // The background sends (RefitSession::Impl::in_flight) run on threads kept for the data plane's
  // life: a refit of many buckets starts no thread per bucket.
  KeptThreads send_threads;

  // Device buckets: packing is asynchronous, so a bucket is sent in the background while the
  // next one is packed into the other buffer. Host buckets are sent at once.
  bool overlapped() const { return memory->kind() == storage::MemoryKind::kDevice; }

  // After a failed send: the next session connects afresh.
  void Drop() {
    for (std::unique_ptr<transport::Sender>& e : extra) e.reset();
    sender.reset();
    group.reset();
    endpoints.clear();
  }

  // Runs in flight at once: kRunLanes for a point-to-point data plane that sends in place, else 1.
  int run_lanes() const {
    return group == nullptr && sender != nullptr && transport->sends_in_place ? kRunLanes : 1;
  }
  // Lane `lane`'s sender (lane >= 1, run_lanes()), connected on first use.
  absl::Status ConnectLane(int lane) {
    std::unique_ptr<transport::Sender>& e = extra[lane - 1];
    if (e != nullptr) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<transport::Sender>> s = transport->connect(endpoints.front(), config);
    if (!s.ok()) return s.status();
    e = std::move(*s);
    return absl::OkStatus();
  }

  // Connects the data plane named by refitd's endpoints (one transport on every daemon): a
  // point-to-point sender for one daemon, a group sender for a fan-out.
  absl::Status Connect(const std::vector<std::string>& want, bool fanout, uint64_t bucket_bytes);
  // On lane 0 (sender or group) or a run lane (extra).
  absl::Status Send(int lane, std::span<const uint64_t> tags, const void* payload, uint64_t bytes) {
    if (group != nullptr) return group->Send(tags, payload, bytes);
    return LaneSender(lane).Send(tags[0], payload, bytes);
  }
  // Starts a point-to-point send on the calling thread where the transport can (Sender::Post):
  // true, and Finish(lane) ends it; false: Send it.
  absl::StatusOr<bool> Post(int lane, std::span<const uint64_t> tags, const void* payload, uint64_t bytes) {
    if (group != nullptr) return false;
    return LaneSender(lane).Post(tags[0], payload, bytes);
  }
  absl::Status Finish(int lane) { return LaneSender(lane).Finish(); }

 private:
  transport::Sender& LaneSender(int lane) { return lane == 0 ? *sender : *extra[lane - 1]; }
  absl::Status UseMemory(const transport::TransportDescriptor& t, int device);
  absl::Status ReserveBuckets(uint64_t bucket_bytes);
};

absl::Status DataPlane::Connect(const std::vector<std::string>& want, bool fanout, uint64_t bucket_bytes) {
  const transport::TransportDescriptor* t = transports.FindByEndpoint(want.front());
  if (t == nullptr) {
    return absl::UnimplementedError(absl::StrCat("refitd offers the data plane '", want.front(),
                                                 "' but this client was built without its transport (built in: ",
                                                 transports.Names(), ")"));
  }
  for (const std::string& e : want) {
    if (transports.FindByEndpoint(e) != t) {
      return absl::InvalidArgumentError(absl::StrCat("fan-out needs one data plane on every daemon; got '",
                                                     want.front(), "' and '", e, "'"));
    }
  }
  const bool connected = fanout ? group != nullptr : sender != nullptr;
  if (!connected || endpoints != want) {
    Drop();
    config = transport::ConnectConfig{};
    if (t->payload_memory == storage::MemoryKind::kDevice) {
      absl::StatusOr<int> device = storage::CurrentDevice();
      if (!device.ok()) return absl::UnavailableError(absl::StrCat(t->name, " data plane: no CUDA device"));
      config.device = *device;
    }
    if (fanout) {
      absl::StatusOr<std::unique_ptr<transport::GroupSender>> g = transport::ConnectGroup(*t, want, config);
      if (!g.ok()) return g.status();
      group = std::move(*g);
    } else {
      absl::StatusOr<std::unique_ptr<transport::Sender>> s = t->connect(want.front(), config);
      if (!s.ok()) return s.status();
      sender = std::move(*s);
    }
    if (absl::Status st = UseMemory(*t, config.device); !st.ok()) return st;
    endpoints = want;
  }
  return ReserveBuckets(bucket_bytes);
}

absl::Status DataPlane::UseMemory(const transport::TransportDescriptor& t, int device) {
  const bool on_device = t.payload_memory == storage::MemoryKind::kDevice;
  if (memory != nullptr && memory->kind() == t.payload_memory && (!on_device || memory_device == device)) {
    transport = &t;
    return absl::OkStatus();
  }
  if (memory != nullptr) (void)memory->Synchronize();
  bucket[0].reset();
  bucket[1].reset();
  bucket_capacity = 0;
  current = 0;
  memory.reset();
  transport = nullptr;
  if (on_device) {
    absl::StatusOr<std::unique_ptr<storage::Memory>> m = t.bucket_memory(device);
    if (!m.ok()) return m.status();
    memory = std::move(*m);
  } else {
    // Plain host memory: the trainer's buckets need not be page-locked (refitd's ring is).
    memory = storage::NewHostMemory();
  }
  memory_device = device;
  transport = &t;
  return absl::OkStatus();
}

absl::Status DataPlane::ReserveBuckets(uint64_t bucket_bytes) {
  if (bucket_capacity >= bucket_bytes) return absl::OkStatus();
  if (absl::Status st = memory->Synchronize(); !st.ok()) return st;
  bucket[0].reset();
  bucket[1].reset();
  bucket_capacity = 0;
  current = 0;
  for (int i = 0; i < (overlapped() ? 2 : 1); ++i) {
    absl::StatusOr<std::shared_ptr<uint8_t>> b = memory->Allocate(bucket_bytes);
    if (!b.ok()) {
      bucket[0].reset();
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the ", bucket_bytes, "-byte buckets: ",
                                                       b.status().message()));
    }
    bucket[i] = std::move(*b);
  }
  bucket_capacity = bucket_bytes;
  return absl::OkStatus();
}

}  // namespace

struct TrainerClient::Impl {
  std::shared_ptr<ThreadIo> thread_io = AcquireThreadIo();
  kj::AsyncIoContext& io = thread_io->io;
  std::string address;
  kj::Own<kj::AsyncIoStream> conn;
  kj::Own<capnp::TwoPartyClient> rpc;
  proto::Daemon::Client daemon = nullptr;
  DataPlane data{transport::BuiltinTransports()};
  // The daemon keeps the tensor list of the last manifest sent whole under manifest_key
  // (Daemon.begin; 0: none): a begin with the same list sends the key instead.
  uint64_t manifest_key = 0;
  std::vector<TensorDesc> manifest_tensors;
  // What the last begin (by key, its list kept) was answered besides its session: a later begin
  // by the same key that expects the same need not wait for its answer (pipelined: see
  // OpenSession). ok: such an answer came (own_seqs from seq base 0, nothing for the trainer to
  // convert).
  struct Answered {
    bool ok = false;
    std::string endpoint;
    uint64_t bucket_bytes = 0;
    WireFormat wire_format = WireFormat::kBf16;  // the begin's (its plan depends on it)
  } answered;
  std::mt19937_64 session_ids{std::random_device{}()};
  std::optional<RefitReport> last_commit_report;  // of the last CommitVersion or Rollback
};

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

}  // namespace

struct FanoutClient::Impl {
  std::vector<std::unique_ptr<TrainerClient>> daemons;
  DataPlane data{transport::BuiltinTransports()};
};

struct RefitSession::Impl {
  // One daemon's side of the session (a fan-out session has one per daemon).
  struct Member {
    TrainerClient::Impl* client;
    proto::Session::Client session = nullptr;
    uint64_t id = 0;
    // The daemon numbers this rank's buckets seq_base, seq_base + 1, ... (own_seqs; false from a
    // daemon older than that): this rank numbers them itself, and sends a bucket's bytes without
    // waiting for its announce's answer. next_seq: the next bucket's number.
    bool own_seqs = false;
    uint32_t next_seq = 0;
  };
  std::vector<Member> members;
  // How the session ended on each member, as its commit's answer reported it (none before, or
  // when no report came).
  std::vector<std::optional<RefitReport>> reports;
  // Announces answered later (own_seqs): checked at the next bucket and before commit or detach.
  struct PendingAnnounce {
    size_t member;
    uint32_t seq;
    std::unique_ptr<capnp::RemotePromise<proto::Session::AnnounceResults>> call;
  };
  std::vector<PendingAnnounce> pending_announces;
  // A pipelined begin (one daemon), not yet answered: the session and its id were taken as
  // promised. Checked before the first bucket's bytes go where they wait for it (CheckBegun) and
  // before every announce is checked.
  std::unique_ptr<capnp::RemotePromise<proto::Daemon::BeginResults>> pending_begin;
  absl::Status begin_status;  // its outcome, once answered
  // Waits for a pipelined begin's answer; its error (then every later call fails with it).
  absl::Status CheckBegun();
  // Waits for every announce still unanswered; the first error (naming its daemon), if any.
  // `block` false (the bytes may go first: early_sends): checks only those answered by now, and a
  // pipelined begin's answer only once it came, unless kUncheckedAnnounces are unanswered.
  absl::Status CheckAnnounced(bool block = true);
  static constexpr size_t kUncheckedAnnounces = 16;
  DataPlane* data = nullptr;
  kj::WaitScope& wait() { return members.front().client->io.waitScope; }
  // Names member i in errors of a fan-out session.
  std::string Who(size_t i) const {
    return members.size() == 1 ? std::string() : absl::StrCat("refitd at '", members[i].client->address, "': ");
  }
  uint64_t bucket_bytes = 0;
  uint64_t used = 0;  // bytes packed into the data plane's current bucket
  // Sends in the background (overlapped data planes), one per lane: lane 0 sends buckets (the
  // previous one while the next is packed) and runs; the other lanes, runs sent in place while
  // the daemon still reads the ones before (DataPlane::run_lanes()).
  struct InFlight {
    KeptThreads::Run run;
    std::shared_ptr<absl::Status> status;  // null: nothing in flight
  };
  InFlight in_flight[kRunLanes];
  int next_run_lane = 0;
  // A send still in flight reads the trainer's memory through the data plane: it ends first.
  ~Impl() { (void)WaitInFlight(); }
  absl::Status WaitLane(int lane) {
    InFlight& f = in_flight[lane];
    if (f.status == nullptr) return absl::OkStatus();
    f.run.Wait();
    absl::Status st = std::move(*f.status);
    f = InFlight();
    return st;
  }
  // Whether every send in flight has returned (WaitInFlight would not block).
  bool SendsReturned() const {
    return std::all_of(std::begin(in_flight), std::end(in_flight),
                       [](const InFlight& f) { return f.status == nullptr || f.run.Returned(); });
  }
  // Waits for every send in flight; the first error, if any.
  absl::Status WaitInFlight() {
    absl::Status st;
    for (int lane = 0; lane < kRunLanes; ++lane) {
      if (absl::Status sent = WaitLane(lane); st.ok()) st = sent;
    }
    return st;
  }
  BucketHeader header;
  bool member = false;  // joined another rank's session
  bool done = false;
  // Wire format checkpoint: what this trainer converts before packing (empty otherwise), and
  // host scratch for the outputs.
  TrainerConverter convert;
  std::vector<std::vector<uint8_t>> convert_scratch;
  // Packs `parts` into one bucket (trainer_convert.cc's outputs, or PushTogether's tensors).
  absl::Status PackTogether(RefitSession& session, std::span<const TensorRef> parts);
  std::function<void(uint32_t, std::vector<uint8_t>&)> tamper;
  std::unique_ptr<AmaxMeter> amax;  // MeasureAmax(true)
  // PushInPlace: a run of device tensors lying one after another in one allocation, sent from
  // where they are as one bucket (nothing packed). Offsets in run_header are from run_base.
  const uint8_t* run_base = nullptr;
  uint64_t run_used = 0;   // bytes from run_base to the end of the run's last tensor
  uint64_t run_limit = 0;  // bytes from run_base to the end of its allocation
  uint64_t in_place_bytes = 0;  // pushed_in_place_bytes()
  BucketHeader run_header;
  // Announces `h` (payload: `nbytes` at `payload`) on every daemon and sends it: in the background
  // on an overlapped data plane (after the previous send ended); `packed` (a bucket buffer): the
  // next one packs into the other buffer.
  absl::Status SendBucket(BucketHeader& h, const uint8_t* payload, uint64_t nbytes, bool packed);
  absl::Status FlushRun();
};

namespace {

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
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    impl->rpc = kj::heap<capnp::TwoPartyClient>(*impl->conn);
    impl->daemon = impl->rpc->bootstrap().castAs<proto::Daemon>();
  })) {
    return absl::UnavailableError(absl::StrCat("cannot connect to refitd at '", address, "': ", e->getDescription().cStr()));
  }
  return impl;
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

// On a data plane with early sends (CUDA IPC), whether a pipelined begin's first buckets go before
// its answer (refitd holds them for the session: TagMatcher::Options::wait_for_sessions) or wait
// for it. On unless `REFIT_SEND_BEFORE_BEGIN=0` (docs/architecture.md "The pipelined begin").
bool SendsBeforeBegin() { return EnvSwitch("REFIT_SEND_BEFORE_BEGIN", true); }

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
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
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

// Begins (ids empty) or joins (ids[i] on daemon i) a session on every daemon; requests go out
// together. On failure the sessions already begun are aborted.
absl::StatusOr<std::unique_ptr<RefitSession::Impl>> OpenSession(const std::vector<TrainerClient::Impl*>& clients,
                                                                DataPlane& data, bool fanout, const Manifest* manifest,
                                                                const std::vector<uint64_t>& ids) {
  auto s = std::make_unique<RefitSession::Impl>();
  s->data = &data;
  s->member = manifest == nullptr;
  for (TrainerClient::Impl* c : clients) s->members.push_back({c});
  kj::WaitScope& wait = s->wait();
  std::vector<std::string> endpoints(clients.size());
  std::vector<uint64_t> bucket_bytes(clients.size());
  absl::Status failed;
  if (manifest != nullptr && clients.size() == 1 && PipelinedBegin(*s, *clients.front(), data, *manifest)) {
    return s;
  }
  if (manifest != nullptr) {
    TracePoint("trainer.begin_sent");
    // A daemon that kept this manifest's tensor list gets its key instead of the list.
    auto request = [&](TrainerClient::Impl* c, bool by_key) {
      auto req = c->daemon.beginRequest();
      if (by_key) req.setManifestKey(c->manifest_key);
      wire::ToWire(*manifest, req.initManifest(), /*with_tensors=*/!by_key);
      return std::make_unique<capnp::RemotePromise<proto::Daemon::BeginResults>>(req.send());
    };
    std::vector<std::unique_ptr<capnp::RemotePromise<proto::Daemon::BeginResults>>> calls;
    std::vector<bool> by_key;
    for (TrainerClient::Impl* c : clients) {
      by_key.push_back(c->manifest_key != 0 && SameTensors(c->manifest_tensors, manifest->tensors));
      KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { calls.push_back(request(c, by_key.back())); })) {
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
            if (clients[i]->manifest_key != 0) clients[i]->manifest_tensors = manifest->tensors;
          }
          // What a pipelined begin by this key may expect next time (one daemon only).
          clients[i]->answered = {clients.size() == 1 && clients[i]->manifest_key != 0 && resp.getOwnSeqs() &&
                                      resp.getSeqBase() == 0 && resp.getWirePlan().getTensors().size() == 0,
                                  resp.getDataEndpoint().cStr(), resp.getBucketBytes(), manifest->wire_format};
          s->members[i].session = resp.getSession();
          s->members[i].id = resp.getSessionId();
          s->members[i].own_seqs = resp.getOwnSeqs();
          s->members[i].next_seq = resp.getSeqBase();
          bucket_bytes[i] = resp.getBucketBytes();
          endpoints[i] = resp.getDataEndpoint().cStr();
          if (absl::Status st = UseWirePlan(*s, i, resp.hasWirePlan(), resp.getWirePlan()); !st.ok()) return st;
          return true;
        }
        KJ_FAIL_REQUIRE("begin request could not be sent");
      });
      if (!ok.ok() && failed.ok()) failed = Prefixed(ok.status(), s->Who(i));
    }
  } else {
    for (size_t i = 0; i < clients.size(); ++i) {
      absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
        auto req = clients[i]->daemon.joinRequest();
        req.setSessionId(ids[i]);
        auto resp = req.send().wait(wait);
        if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
        s->members[i].session = resp.getSession();
        s->members[i].id = ids[i];
        s->members[i].own_seqs = resp.getOwnSeqs();
        s->members[i].next_seq = resp.getSeqBase();
        bucket_bytes[i] = resp.getBucketBytes();
        endpoints[i] = resp.getDataEndpoint().cStr();
        if (absl::Status st = UseWirePlan(*s, i, resp.hasWirePlan(), resp.getWirePlan()); !st.ok()) return st;
        return true;
      });
      if (!ok.ok() && failed.ok()) failed = Prefixed(ok.status(), s->Who(i));
    }
  }
  if (failed.ok()) {
    s->bucket_bytes = *std::min_element(bucket_bytes.begin(), bucket_bytes.end());
    failed = data.Connect(endpoints, fanout, s->bucket_bytes);
    if (!failed.ok() && s->member) return failed;
  }
  if (!failed.ok()) {
    if (manifest != nullptr) {
      for (RefitSession::Impl::Member& m : s->members) {
        if (m.id == 0) continue;
        (void)Call([&]() {
          auto req = m.session.abortRequest();
          req.setReason(absl::StrCat("trainer could not open the session: ", failed.message()));
          req.send().wait(wait);
          return true;
        });
      }
    }
    return failed;
  }
  return s;
}

}  // namespace

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

// Wire format checkpoint: converts `t` as the plan says and packs its outputs into one bucket.
absl::Status PushConverted(RefitSession& session, RefitSession::Impl& impl, const TrainerConverter::Entry& e,
                           const TensorRef& t) {
  // NVFP4's global amax: the caller's (TensorRef::amax, reduced over the fused group or the ranks
  // holding the tensor's slices), else the tensor's own when that is all it spans.
  std::optional<float> global_amax;
  if (formats::NeedsGlobalAmax(e.format)) global_amax = t.amax;
  if (!global_amax && TrainerConverter::NeedsReducedAmax(e, t.slice.present())) {
    const std::string why =
        !e.amax_group.empty()
            ? absl::StrCat("it is a member of the fused NVFP4 group (", absl::StrJoin(e.amax_group, ", "),
                           "), which shares one global amax: set TensorRef::amax to the group's max|x| (over every "
                           "member and every rank's slices), or push the members together with PushGroup")
            : "it is a slice of an NVFP4 tensor, whose global amax spans every rank's slices: set TensorRef::amax to "
              "the whole tensor's max|x| (all_reduce MAX over the ranks holding it)";
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': wire format checkpoint: pushed without an amax; ",
                                                   why, "; or use wire format bf16"));
  }
  // A block-aligned slice converts on its own; its outputs are slices of the whole outputs.
  std::vector<TrainerConverter::SliceOutput> sliced;
  if (t.slice.present()) {
    absl::StatusOr<std::vector<TrainerConverter::SliceOutput>> s = impl.convert.SliceOutputs(e, t.dtype, t.shape, t.slice);
    if (!s.ok()) return s.status();
    sliced = std::move(*s);
  } else if (absl::Status st = impl.convert.CheckInput(e, t.dtype, t.shape); !st.ok()) {
    return st;
  }
  std::vector<uint64_t> bytes;
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    bytes.push_back(sliced.empty() ? e.outputs[i].bytes : *DenseBytes(sliced[i].dtype, sliced[i].shape));
  }
  const bool device = storage::CheckDeviceMemory(t.data).ok();
  std::vector<formats::MutableBytes> outs;
  std::vector<TensorRef> parts;
  std::vector<std::shared_ptr<uint8_t>> device_outs;
  if (device) {
    absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> converted = impl.convert.ConvertDevice(e, t.dtype, t.shape, t.data, global_amax);
    if (!converted.ok()) return converted.status();
    device_outs = std::move(*converted);
    for (size_t i = 0; i < e.outputs.size(); ++i) outs.push_back({device_outs[i].get(), bytes[i]});
  } else {
    impl.convert_scratch.resize(std::max(impl.convert_scratch.size(), e.outputs.size()));
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      impl.convert_scratch[i].resize(bytes[i]);
      outs.push_back({impl.convert_scratch[i].data(), bytes[i]});
    }
    if (absl::Status st = impl.convert.ConvertHost(e, t.dtype, t.shape, t.data, outs, global_amax); !st.ok()) return st;
  }
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    if (sliced.empty() || !sliced[i].slice.present()) {  // whole (an NVFP4 slice's global scale too)
      parts.push_back({t.name + e.outputs[i].suffix, e.outputs[i].dtype, e.outputs[i].shape, outs[i].data});
    } else {
      parts.push_back({t.name + e.outputs[i].suffix, sliced[i].dtype, sliced[i].shape, outs[i].data, sliced[i].slice});
    }
  }
  absl::Status packed = impl.PackTogether(session, parts);
  // The outputs are copied into the bucket before their buffers go (and before host scratch is reused).
  if (absl::Status st = impl.data->memory->Synchronize(); packed.ok()) packed = st;
  return packed;
}

namespace {

// What Push and PushInPlace check before anything is sent (refitd checks it again: refused here,
// the push fails alone instead of aborting the session): the slice's geometry, then the tensor's
// dense size, which must fit one bucket.
absl::Status CheckSlice(const TensorRef& t) {
  return t.slice.present() ? CheckSliceGeometry(t.name, t.shape, t.slice) : absl::OkStatus();
}

absl::StatusOr<uint64_t> BucketedBytes(const TensorRef& t, uint64_t bucket_bytes) {
  absl::StatusOr<uint64_t> nbytes = DenseBytes(t.dtype, t.shape);
  if (!nbytes.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", nbytes.status().message()));
  if (*nbytes > bucket_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' is ", *nbytes, " bytes, larger than the ",
                                                   bucket_bytes, "-byte bucket"));
  }
  return nbytes;
}

}  // namespace

absl::Status RefitSession::Push(const TensorRef& t) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  if (absl::Status st = CheckSlice(t); !st.ok()) return st;
  if (!impl_->convert.empty() && (t.dtype == DType::kBF16 || t.dtype == DType::kF32)) {
    if (const TrainerConverter::Entry* e = impl_->convert.Find(t.name); e != nullptr) return PushConverted(*this, *impl_, *e, t);
  }
  absl::StatusOr<uint64_t> nbytes = BucketedBytes(t, impl_->bucket_bytes);
  if (!nbytes.ok()) return nbytes.status();
  DataPlane* data = impl_->data;
  // Keep 16-byte alignment of every tensor inside the bucket.
  uint64_t offset = (impl_->used + 15) & ~uint64_t{15};
  if (offset + *nbytes > impl_->bucket_bytes) {
    absl::Status st = Flush();
    if (!st.ok()) return st;
    offset = 0;
  }
  TensorDesc desc{t.name, t.dtype, t.shape, offset, *nbytes, t.slice, t.amax};
  if (!t.amax && impl_->amax != nullptr) {
    if (absl::Status st = impl_->amax->Measure(desc, t.data, impl_->header.tensors.size()); !st.ok()) return st;
  }
  // Host or device source; into device buckets the copy is asynchronous and completes before the
  // bucket is sent.
  uint8_t* bucket = data->bucket[data->current].get();
  if (absl::Status st = data->memory->CopyInAsync(bucket + offset, t.data, *nbytes); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': copy into the bucket failed: ", st.message()));
  }
  impl_->used = offset + *nbytes;
  impl_->header.tensors.push_back(std::move(desc));
  return absl::OkStatus();
}

absl::Status RefitSession::PushInPlace(const TensorRef& t) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  Impl& r = *impl_;
  const bool converts = !r.convert.empty() && (t.dtype == DType::kBF16 || t.dtype == DType::kF32) &&
                        r.convert.Find(t.name) != nullptr;
  if (!r.data->overlapped() || !r.data->transport->sends_in_place || r.amax != nullptr || converts) return Push(t);
#if REFIT_HAVE_CUDA
  if (absl::Status st = CheckSlice(t); !st.ok()) return st;
  absl::StatusOr<uint64_t> nbytes = BucketedBytes(t, r.bucket_bytes);
  if (!nbytes.ok()) return nbytes.status();
  constexpr uint64_t kMaxGap = 256;  // padding between a contiguous buffer's parameters
  const uint64_t addr = reinterpret_cast<uint64_t>(t.data);
  const uint64_t base = reinterpret_cast<uint64_t>(r.run_base);
  // Inside the run's allocation (its range is known: no driver query per tensor), right after the
  // run's last tensor, within the bucket size.
  const bool joins = r.run_base != nullptr && addr % 16 == 0 && addr >= base + r.run_used &&
                     addr - (base + r.run_used) <= kMaxGap && addr + *nbytes - base <= std::min(r.run_limit, r.bucket_bytes);
  if (!joins) {
    absl::StatusOr<transport::cuda_ipc::Allocation> a = transport::cuda_ipc::QueryAllocation(t.data);
    if (!a.ok() || !a->device || addr % 16 != 0 || addr < a->base || addr - a->base >= a->size) {
      return Push(t);  // not device memory: packed
    }
    // The bytes from the tensor to the end of its allocation; in CUDA virtual memory (expandable
    // segments map theirs piece by piece), to the end of the pieces mapped one after another.
    uint64_t extent = a->base + a->size - addr;
    if (!a->ipc_capable) extent = std::max(extent, transport::cuda_ipc::VmmMappedBytes(t.data, r.bucket_bytes));
    if (*nbytes > extent) return Push(t);  // not within one allocation: packed
    if (absl::Status st = r.FlushRun(); !st.ok()) return st;
    r.run_base = static_cast<const uint8_t*>(t.data);
    r.run_used = 0;
    r.run_limit = extent;
  }
  const uint64_t offset = addr - reinterpret_cast<uint64_t>(r.run_base);
  r.run_header.tensors.push_back({t.name, t.dtype, t.shape, offset, *nbytes, t.slice, t.amax});
  r.run_used = offset + *nbytes;
  r.in_place_bytes += *nbytes;
  return absl::OkStatus();
#else
  return Push(t);
#endif
}

uint64_t RefitSession::pushed_in_place_bytes() const { return impl_->in_place_bytes; }

void RefitSession::MeasureAmax(bool on) {
  if (!on) {
    impl_->amax.reset();
  } else if (impl_->amax == nullptr) {
    impl_->amax = std::make_unique<AmaxMeter>();
  }
}

absl::Status RefitSession::PushTogether(std::span<const TensorRef> parts) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  return impl_->PackTogether(*this, parts);
}

absl::Status RefitSession::PushGroup(std::span<const TensorRef> members) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  // The global amax of each fused NVFP4 group whose members are all here (host tensors).
  absl::flat_hash_map<std::string, const TensorRef*> by_name;
  for (const TensorRef& t : members) by_name[t.name] = &t;
  absl::flat_hash_map<std::string, float> own;  // member -> max|x|
  std::vector<TensorRef> pushes(members.begin(), members.end());
  for (TensorRef& t : pushes) {
    const TrainerConverter::Entry* e = impl_->convert.Find(t.name);
    if (e == nullptr || t.amax || !formats::NeedsGlobalAmax(e->format) || e->amax_group.empty() || t.slice.present()) {
      continue;
    }
    float group = 0.0f;
    for (const std::string& m : e->amax_group) {
      auto it = by_name.find(m);
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "': wire format checkpoint: PushGroup needs every member of its fused NVFP4 group (",
            absl::StrJoin(e->amax_group, ", "), ") to compute their shared amax; '", m, "' is not among them"));
      }
      auto [a, fresh] = own.try_emplace(m, 0.0f);
      if (fresh) {
        const TensorRef& r = *it->second;
        if (r.slice.present() || storage::CheckDeviceMemory(r.data).ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor '", t.name, "': wire format checkpoint: PushGroup computes a fused group's amax from whole "
              "host tensors; '", m, "' is a slice or device memory: set TensorRef::amax to the group's max|x|"));
        }
        absl::StatusOr<float> m_amax = TensorAmax(formats::ConstTensor{r.dtype, r.shape, r.data}, impl_->convert.options(), m);
        if (!m_amax.ok()) return m_amax.status();
        a->second = *m_amax;
      }
      group = std::isnan(a->second) || a->second > group ? a->second : group;
    }
    t.amax = group;
  }
  for (const TensorRef& t : pushes) {
    if (absl::Status st = Push(t); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::vector<std::string> RefitSession::AmaxGroup(const std::string& name) const {
  const TrainerConverter::Entry* e = impl_->convert.Find(name);
  if (e == nullptr || !formats::NeedsGlobalAmax(e->format)) return {};
  return e->amax_group.empty() ? std::vector<std::string>{name} : e->amax_group;
}

size_t RefitSession::trainer_converted_tensors() const { return impl_->convert.size(); }

absl::Status RefitSession::Impl::PackTogether(RefitSession& session, std::span<const TensorRef> parts) {
  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  for (const TensorRef& t : parts) {
    if (t.slice.present()) {
      if (absl::Status st = CheckSliceGeometry(t.name, t.shape, t.slice); !st.ok()) return st;
    }
    absl::StatusOr<uint64_t> n = DenseBytes(t.dtype, t.shape);
    if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", n.status().message()));
    sizes.push_back(*n);
    total = ((total + 15) & ~uint64_t{15}) + *n;
  }
  if (parts.empty()) return absl::OkStatus();
  if (total > bucket_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", parts[0].name, "' and the ", parts.size() - 1,
                                                   " sent with it are ", total, " bytes, more than the ", bucket_bytes,
                                                   "-byte bucket"));
  }
  if (((used + 15) & ~uint64_t{15}) + total > bucket_bytes) {
    if (absl::Status st = session.Flush(); !st.ok()) return st;
  }
  uint8_t* bucket = data->bucket[data->current].get();
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorRef& t = parts[i];
    const uint64_t offset = (used + 15) & ~uint64_t{15};
    if (absl::Status st = data->memory->CopyInAsync(bucket + offset, t.data, sizes[i]); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': copy into the bucket failed: ", st.message()));
    }
    used = offset + sizes[i];
    header.tensors.push_back({t.name, t.dtype, t.shape, offset, sizes[i], t.slice});
  }
  return absl::OkStatus();
}

absl::Status RefitSession::CheckDeviceMemory(const void* p) { return storage::CheckDeviceMemory(p); }

absl::Status RefitSession::Flush() {
  if (absl::Status st = impl_->FlushRun(); !st.ok()) return st;
  if (impl_->header.tensors.empty()) return absl::OkStatus();
  BucketHeader& h = impl_->header;
  DataPlane* data = impl_->data;
  if (absl::Status st = data->memory->Synchronize(); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("packing the bucket: ", st.message()));
  }
  if (impl_->amax != nullptr) {
    if (absl::Status st = impl_->amax->Collect(h.tensors); !st.ok()) return st;
  }
  absl::Status sent = impl_->SendBucket(h, data->bucket[data->current].get(), impl_->used, /*packed=*/true);
  impl_->used = 0;
  h.tensors.clear();
  return sent;
}

absl::Status RefitSession::Impl::FlushRun() {
  if (run_header.tensors.empty()) return absl::OkStatus();
  absl::Status sent = SendBucket(run_header, run_base, run_used, /*packed=*/false);
  run_header.tensors.clear();
  run_base = nullptr;
  run_used = run_limit = 0;
  return sent;
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
        resp.getWirePlan().getTensors().size() != 0 ||
        resp.getBucketBytes() != bucket_bytes || c.answered.endpoint != resp.getDataEndpoint().cStr()) {
      c.answered.ok = false;
      return absl::InternalError(
          "refitd answered the begin unlike the one before it (session id, bucket numbers, bucket size, data plane or "
          "wire plan), which this trainer had taken as promised; begin again");
    }
    return true;
  });
  if (!ok.ok() && begin_status.ok()) begin_status = ok.status();
  return begin_status;
}

absl::Status RefitSession::Impl::CheckAnnounced(bool block) {
  block = block || pending_announces.size() >= kUncheckedAnnounces;
  if (!block && pending_begin != nullptr && !pending_begin->poll(wait())) return absl::OkStatus();
  if (absl::Status begun = CheckBegun(); !begun.ok()) {
    pending_announces.clear();  // refused with the begin
    return begun;
  }
  absl::Status failed;
  size_t checked = 0;
  for (PendingAnnounce& p : pending_announces) {
    if (!block && !p.call->poll(wait())) break;  // this one and those after it: later
    ++checked;
    absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
      auto resp = p.call->wait(wait());
      if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
      if (resp.getSeq() != p.seq) {
        return absl::InternalError(absl::StrCat("refitd numbered bucket ", p.seq, " as ", resp.getSeq()));
      }
      return true;
    });
    if (!ok.ok() && failed.ok()) {
      failed = Prefixed(ok.status(), Who(p.member));
    }
  }
  pending_announces.erase(pending_announces.begin(), pending_announces.begin() + checked);
  return failed;
}

absl::Status RefitSession::Impl::SendBucket(BucketHeader& h, const uint8_t* payload, uint64_t nbytes, bool packed) {
  TracePoint("trainer.bucket_ready");
  // The announces of earlier buckets (answered by now, as a rule) before this one's; after a
  // pipelined begin whose buckets go before its answer (early_sends, SendsBeforeBegin), only once
  // that answer came, and then those answered by now.
  const bool before_answer = data->transport->early_sends && pending_begin != nullptr && SendsBeforeBegin();
  if (absl::Status st = CheckAnnounced(/*block=*/!before_answer); !st.ok()) return st;
  h.nbytes = nbytes;
  // A transport that checks integrity itself gets no checksum (its payloads may be on the device,
  // where reading them back would cost a copy); registry.h guarantees host payloads otherwise.
  h.checksum = data->transport->checks_integrity ? 0 : Checksum64(payload, h.nbytes);
  // Announce on every daemon (the requests go out together). A daemon that numbers this rank's
  // buckets in a range of its own gets the number here; an older one numbers the bucket itself.
  const bool own_seqs = std::all_of(members.begin(), members.end(), [](const Member& m) { return m.own_seqs; });
  std::vector<uint64_t> tags(members.size());
  std::vector<std::unique_ptr<capnp::RemotePromise<proto::Session::AnnounceResults>>> calls;
  for (auto& m : members) {
    h.seq = own_seqs ? m.next_seq : kAssignBucketSeq;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      auto req = m.session.announceRequest();
      wire::ToWire(h, req.initHeader());
      calls.push_back(std::make_unique<capnp::RemotePromise<proto::Session::AnnounceResults>>(req.send()));
    })) {
      calls.push_back(nullptr);
    }
  }
  uint32_t first_seq = 0;
  if (own_seqs) {
    // The numbers are known: the answers are checked later (CheckAnnounced), at once unless the
    // bytes may go first (early_sends: refitd holds a message that arrives before its announce is
    // read, and drops it if the session ends). The requests are written before the bytes go.
    for (size_t i = 0; i < members.size(); ++i) {
      if (calls[i] == nullptr) return absl::UnavailableError(absl::StrCat(Who(i), "announce request could not be sent"));
      tags[i] = (members[i].id << 32) | members[i].next_seq;
      pending_announces.push_back({i, members[i].next_seq, std::move(calls[i])});
      ++members[i].next_seq;
    }
    first_seq = static_cast<uint32_t>(tags[0]);
    if (data->transport->early_sends) {
      // The bytes go now, or, after a pipelined begin not yet answered, once it is (unless sent
      // before it: SendsBeforeBegin).
      if (pending_begin != nullptr && !SendsBeforeBegin()) {
        if (absl::Status st = CheckBegun(); !st.ok()) return st;
      }
      wait().poll();
    } else if (absl::Status st = CheckAnnounced(); !st.ok()) {
      return st;
    }
  } else {
    absl::Status announced;
    for (size_t i = 0; i < members.size(); ++i) {
      absl::StatusOr<uint32_t> seq = Call([&]() -> absl::StatusOr<uint32_t> {
        if (calls[i] != nullptr) {
          auto resp = calls[i]->wait(wait());
          if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
          return resp.getSeq();
        }
        KJ_FAIL_REQUIRE("announce request could not be sent");
      });
      if (!seq.ok()) {
        if (announced.ok()) announced = Prefixed(seq.status(), Who(i));
        continue;
      }
      if (i == 0) first_seq = *seq;
      tags[i] = (members[i].id << 32) | *seq;
    }
    if (!announced.ok()) return announced;
  }
  TracePoint("trainer.bucket_announced", first_seq);
  std::vector<uint8_t> tampered;
  if (tamper && data->memory->kind() == storage::MemoryKind::kHost) {
    tampered.assign(payload, payload + h.nbytes);
    tamper(first_seq, tampered);
    payload = tampered.data();
  }
  absl::Status sent;
  if (data->overlapped()) {
    // Send in the background while the next bucket is packed (into the other buffer) or found.
    // A run sent in place takes the next lane after the run before it, whose bytes the daemon may
    // still be reading: nothing of the trainer's is reused until every send ended.
    int lane = 0;
    if (!packed && data->run_lanes() > 1) {
      lane = next_run_lane;
      next_run_lane = (lane + 1) % data->run_lanes();
      sent = WaitLane(lane);
      if (sent.ok() && lane > 0) sent = data->ConnectLane(lane);
    } else {
      sent = WaitInFlight();
    }
    // The send starts here where the transport can (DataPlane::Post): refitd may read the bucket
    // before the thread that waits for its release has woken.
    const uint64_t n = h.nbytes;
    bool posted = false;
    if (sent.ok()) {
      absl::StatusOr<bool> p = data->Post(lane, tags, payload, n);
      if (p.ok() && *p) TracePoint("trainer.bucket_sent", first_seq);
      if (p.ok()) posted = *p;
      sent = p.status();
    }
    if (sent.ok()) {
      DataPlane* plane = data;
      auto status = std::make_shared<absl::Status>();
      try {
        in_flight[lane].run = data->send_threads.Start([plane, lane, posted, tags = std::move(tags), payload, n, status] {
          if (posted) {
            *status = plane->Finish(lane);
            return;
          }
          TracePoint("trainer.bucket_sent", tags[0] & 0xFFFFFFFFu);
          *status = plane->Send(lane, tags, payload, n);
        });
      } catch (...) {
        // No thread to wait for the release: this one does, so that the sender's next message
        // does not take this one's release for its own.
        if (posted) (void)data->Finish(lane);
        throw;
      }
      in_flight[lane].status = std::move(status);
      if (packed) data->current ^= 1;
    }
  } else {
    sent = data->Send(0, tags, payload, h.nbytes);
  }
  if (!sent.ok()) {
    // refitd dropped the data-plane connection (the session was aborted) or it failed: the next
    // session connects afresh (once the other lane's send, if any, has ended). An announce
    // refitd refused (what ended the session) says why better than the send.
    (void)WaitInFlight();
    data->Drop();
    if (absl::Status announced = CheckAnnounced(); !announced.ok()) return announced;
  }
  return sent;
}

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
    // waiting for its buckets); this reports the send.
    impl_->data->Drop();
    return sent;
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
