// The refitd control-plane service: the Cap'n Proto `Daemon`, `Session` and `Registration`
// capabilities, adapted onto the refit core's Node (src/refit/node.h), which owns the engine
// records, the session lifecycle and the commit protocol. Besides translating (wire types in,
// typed statuses with their causes and reports out, promises around the core's blocking steps),
// daemon_service.cc decides what the core leaves to the server:
//   - a registration's engine storage (POSIX shm, or CUDA IPC handles and CUDA virtual-memory
//     descriptors) and its staging and converter by the config's `staging:` (MakeStaging: host
//     staging and the CPU converter, or device staging and the GPU converter; host only for an
//     engine of several ranks);
//   - the engine's pause and resume over the control plane (RpcEngineControl: each call raced
//     against its timeout, a late call kept until the engine answers it);
//   - the last kKeptManifests tensor lists, so that a begin may name its manifest by key;
//   - staging: direct's early pause (for a manifest like the last one placed: sent as the begin
//     arrives, before its manifest is decoded), taken on the loop when answered in time, or
//     undone when the begin does not adopt it;
//   - each commit as a daemon task on a kept worker thread (BlockingThreads), its resume sent and
//     answered on the loop; a commit waiting for joined ranks, a kept version's commit or an early
//     pause's undo, and a wake waiting for a commit, woken by Changed;
//   - when the event loop busy polls (Heat, Expect, Hot; main.cc spins while Hot).
//
// Runs on one KJ event loop thread; blocking steps (a commit, a pause taken off the loop) run on
// kept worker threads and reach the engine's pause/resume through the loop's executor.
#ifndef REFIT_SERVER_DAEMON_SERVICE_H_
#define REFIT_SERVER_DAEMON_SERVICE_H_

#include <deque>
#include <memory>
#include <vector>

#include "common/failpoint.h"
#include "kj/async-io.h"
#include "kj/timer.h"
#include "proto/refit.capnp.h"
#include "refit/bucket_ring.h"
#include "refit/node.h"
#include "server/blocking.h"
#include "server/config.h"
#include "spec/model_spec.h"
#include "transport/transport.h"

namespace refit::server {

// Observers for metrics; every field optional. The node's log line is the server's own.
using DaemonHooks = NodeHooks;

// What the capability objects share.
class DaemonState {
 public:
  // `failpoints`: test builds, armed from REFIT_FAILPOINTS (docs/reliability.md); null otherwise.
  DaemonState(Config config, spec::ModelSpec spec, std::unique_ptr<transport::Receiver> receiver,
              std::unique_ptr<BucketRing> ring, kj::LowLevelAsyncIoProvider& io, kj::Timer& timer,
              DaemonHooks hooks, std::unique_ptr<FailpointSet> failpoints = nullptr);
  ~DaemonState();

  const Config config;
  const spec::ModelSpec spec;
  const std::unique_ptr<FailpointSet> failpoints;
  const std::unique_ptr<transport::Receiver> receiver;
  const std::unique_ptr<BucketRing> ring;
  kj::LowLevelAsyncIoProvider& io;
  kj::Timer& timer;
  Node node;
  // The last kKeptManifests tensor lists begins sent whole (most recent last), under their keys
  // (ManifestTensors in daemon_service.cc): a later begin names one by key instead of sending it
  // (Daemon.begin). Several, so that trainers of different lists (and a list sent again after
  // another) keep going by key. Event loop only.
  struct KeptManifest {
    uint64_t key = 0;
    std::shared_ptr<const std::vector<TensorDesc>> tensors;
  };
  static constexpr size_t kKeptManifests = 8;
  std::deque<KeptManifest> kept_manifests;
  // The kept list of `key` (made the most recent), or null.
  std::shared_ptr<const std::vector<TensorDesc>> KeptTensors(uint64_t key);
  void KeepTensors(uint64_t key, std::shared_ptr<const std::vector<TensorDesc>> tensors);

  // Shutting down: ends a session that is not committing, then waits (bounded by the engine
  // timeouts) for a commit in its window to finish. False if one is still running.
  bool Drain(kj::WaitScope& wait_scope);

  // Busy polling (main.cc): the event loop spins while a refit is in flight (Hot). Heat (a begin,
  // an announce or a commit arrived) fulfills OnHeat's promise: the loop spins for 5 ms even
  // before a session exists, and for a session or commit up to 1 s after the last heat. Expect
  // (an engine woke with nothing staged: its refit comes next in a colocated loop) makes it spin
  // until the next heat, for at most kExpectRefitFor. Event loop only.
  static constexpr absl::Duration kExpectRefitFor = absl::Seconds(1);
  void Heat();
  void Expect();
  kj::Promise<void> OnHeat();
  bool Hot() const;

  // What a call waiting on the node checks again (a rank detached, a session ended, an early
  // pause's undo or a commit finished): Changed fulfills every promise OnChange gave out since.
  // Waiters are a session's commit waiting for its joined ranks or for a kept version's commit,
  // and a wake waiting for a commit. A waiter still checks on a timer too (a session a deadline
  // ends). Event loop only.
  void Changed();
  kj::Promise<void> OnChange();

 private:
  kj::Own<kj::PromiseFulfiller<void>> heat_;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> change_waiters_;
  absl::Time heated_at_ = absl::InfinitePast();
  absl::Time expect_until_ = absl::InfinitePast();

  struct ErrorHandler : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override;
  } error_handler_;

 public:
  // The blocking steps' threads (the commit, a pause taken off the loop); joined after the tasks
  // below are gone, before the node.
  BlockingThreads blocking;
  kj::TaskSet tasks;  // declared last: its tasks refer to everything above
};

// The bootstrap capability served to every connection.
proto::Daemon::Client MakeDaemon(DaemonState& state);

}  // namespace refit::server

#endif  // REFIT_SERVER_DAEMON_SERVICE_H_
