// What the trainer client's sources share (trainer_client.cc: the clients, control calls and
// commits; trainer_session_open.cc: opening a session; trainer_push.cc: packing buckets and
// sending them; trainer_data_plane.cc: the data plane): the Impl types behind the public classes
// of trainer_client.h and their helpers. Not part of the client's API.
//
// Threading: as trainer_client.h (one thread per client and its sessions); the data plane's
// background sends run on its kept threads.
#ifndef REFIT_CLIENT_TRAINER_CLIENT_INTERNAL_H_
#define REFIT_CLIENT_TRAINER_CLIENT_INTERNAL_H_

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
#include "client/trainer_client.h"
#include "client/trainer_convert.h"
#include "common/busy_poll.h"
#include "common/checksum.h"
#include "common/control_connect.h"
#include "common/kept_threads.h"
#include "common/trace.h"
#include "kj/async-io.h"
#include "proto/refit.capnp.h"
#include "proto/wire.h"
#include "refit/convert.h"
#include "storage/memory.h"
#include "transport/builtin_transports.h"
#include "transport/registry.h"

namespace refit::client {

// A connection-level failure as an absl::Status. Failures refitd reports (refused, invalid,
// busy, no engine) arrive as typed statuses in the results, not as exceptions.
absl::Status FromException(const kj::Exception& e);

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
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() { out = f(); })) {
    return FromException(*e);
  }
  return out;
}

// `st` with `prefix` before its message (naming a daemon of a fan-out), its code and cause kept.
absl::Status Prefixed(const absl::Status& st, const std::string& prefix);

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

std::shared_ptr<ThreadIo> AcquireThreadIo();

// Busy polling on the trainer's side (common/busy_poll.h; REFIT_BUSY_POLL, else on with 8 or
// more CPUs): a commit's wait for its last sends and its answer checks for them without sleeping,
// for at most kCommitSpinBound, so that the answer is taken when it comes instead of a sleeping
// thread's wake-up later (0.1-0.3 ms on a virtualized GPU host: docs/benchmarks.md run 32).
constexpr absl::Duration kCommitSpinBound = absl::Seconds(2);
bool CommitSpins();
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
  // Two buckets: one is sent in the background while the next is packed into the other (device
  // buckets by asynchronous copies; host buckets' copies and checksum overlap the send,
  // docs/operations.md "Host copies"). One send at a time per lane.
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

  // After a failed send: the next session connects afresh.
  void Drop() {
    for (std::unique_ptr<transport::Sender>& e : extra) e.reset();
    sender.reset();
    group.reset();
    endpoints.clear();
  }

  // Runs in flight at once: kRunLanes for a point-to-point data plane that sends in place, else 1.
  int run_lanes() const { return group == nullptr && sender != nullptr && transport->sends_in_place ? kRunLanes : 1; }
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
    bool parallel_checksum = false;
  } answered;
  std::mt19937_64 session_ids{std::random_device{}()};
  std::optional<RefitReport> last_commit_report;  // of the last CommitVersion or Rollback
};

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
    // The daemon verifies ParallelChecksum64 (Daemon.begin's parallelChecksum; false from a daemon
    // older than that): buckets sent to it, and to every other member as well, carry that kind.
    bool parallel_checksum = false;
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
  // Sends in the background, one per lane: lane 0 sends buckets (the
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
  uint64_t run_used = 0;        // bytes from run_base to the end of the run's last tensor
  uint64_t run_limit = 0;       // bytes from run_base to the end of its allocation
  uint64_t in_place_bytes = 0;  // pushed_in_place_bytes()
  BucketHeader run_header;
  // Announces `h` (payload: `nbytes` at `payload`) on every daemon and sends it in the background
  // (after the previous send ended); `packed` (a bucket buffer): the next one packs into the
  // other buffer.
  absl::Status SendBucket(BucketHeader& h, const uint8_t* payload, uint64_t nbytes, bool packed);
  // SendBucket's steps. Announce sends `h`'s announce to every daemon and fills `tags` (daemon i's
  // tag for the bucket's bytes); its bucket number on the first daemon, or the first error.
  // AnnounceOwnSeqs: the daemons number this rank's buckets themselves (own_seqs), the answers are
  // checked later; AwaitAnnouncedSeqs: an older daemon numbers the bucket in its answer.
  using AnnounceCall = std::unique_ptr<capnp::RemotePromise<proto::Session::AnnounceResults>>;
  absl::StatusOr<uint32_t> Announce(BucketHeader& h, std::vector<uint64_t>& tags);
  absl::StatusOr<uint32_t> AnnounceOwnSeqs(std::vector<AnnounceCall>& calls, std::vector<uint64_t>& tags);
  absl::StatusOr<uint32_t> AwaitAnnouncedSeqs(std::vector<AnnounceCall>& calls, std::vector<uint64_t>& tags);
  // The send of the announced bucket: on a lane's kept thread, after the
  // send before it on that lane ended.
  absl::Status SendInBackground(std::vector<uint64_t> tags, uint32_t first_seq, const uint8_t* payload, uint64_t nbytes,
                                bool packed);
  absl::Status FlushRun();
};

// On a data plane with early sends (CUDA IPC), whether a pipelined begin's first buckets go before
// its answer (trainer_session_open.cc).
bool SendsBeforeBegin();

// Connects the control plane of one daemon (common/control_connect.h: Unix socket, TCP, TLS).
absl::StatusOr<std::unique_ptr<TrainerClient::Impl>> OpenControl(const std::string& address);

// Begins (ids empty) or joins (ids[i] on daemon i) a session on every daemon; requests go out
// together. On failure the sessions already begun are aborted.
absl::StatusOr<std::unique_ptr<RefitSession::Impl>> OpenSession(const std::vector<TrainerClient::Impl*>& clients,
                                                                DataPlane& data, bool fanout, const Manifest* manifest,
                                                                const std::vector<uint64_t>& ids);

}  // namespace refit::client

#endif  // REFIT_CLIENT_TRAINER_CLIENT_INTERNAL_H_
