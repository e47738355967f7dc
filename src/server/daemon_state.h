// What the refitd capability objects (daemon_service.cc, session_service.cc,
// registration_service.cc) share: the config, model spec, data-plane receiver and bucket ring, the
// refit core's Node (src/refit/node.h; engine records, session lifecycle, commit protocol), the
// manifests kept for begins by key, the daemon's tasks and the kept worker threads its blocking
// steps run on. Besides, DaemonState decides when the event loop busy polls (Heat, Expect, Hot;
// main.cc spins while Hot) and wakes what waits on the node (Changed: a commit waiting for joined
// ranks, a kept version's commit or an early pause's undo, and a wake waiting for a commit).
//
// Runs on one KJ event loop thread; blocking steps (a commit, a pause taken off the loop) run on
// kept worker threads and reach the engine's pause/resume through the loop's executor.
#ifndef REFIT_SERVER_DAEMON_STATE_H_
#define REFIT_SERVER_DAEMON_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/failpoint.h"
#include "kj/async-io.h"
#include "kj/timer.h"
#include "refit/bucket_ring.h"
#include "refit/node.h"
#include "server/blocking.h"
#include "server/config.h"
#include "server/manifest_cache.h"
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
              std::unique_ptr<BucketRing> ring, kj::LowLevelAsyncIoProvider& io, kj::Timer& timer, DaemonHooks hooks,
              std::unique_ptr<FailpointSet> failpoints = nullptr);
  ~DaemonState();

  const Config config;
  const spec::ModelSpec spec;
  const std::unique_ptr<FailpointSet> failpoints;
  const std::unique_ptr<transport::Receiver> receiver;
  const std::unique_ptr<BucketRing> ring;
  kj::LowLevelAsyncIoProvider& io;
  kj::Timer& timer;
  Node node;
  // The last tensor lists begins sent whole, under their keys: a later begin names one by key
  // instead of sending it (Daemon.begin). Event loop only.
  ManifestCache manifests;
  // Late join (group_join.h): a task asks the peers again every kGroupPeerRetryMs (none answered
  // the last ask). Event loop only.
  bool group_asking = false;
  // Late join: the pauses and resumes of HoldJoiningRanks not answered yet, counted by the
  // registration of the engine (rank) each is for. Event loop only.
  std::map<uint64_t, int> join_holds_in_flight;

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
  // pause's undo, a commit or a late join's pause finished): Changed fulfills every promise
  // OnChange gave out since. Waiters are a session's commit waiting for its joined ranks or for a
  // kept version's commit, a wake waiting for a commit, and a registration waiting for its
  // engine's late-join pause (group_join.h). A waiter still checks on a timer too (a session a
  // deadline ends). Event loop only.
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

}  // namespace refit::server

#endif  // REFIT_SERVER_DAEMON_STATE_H_
