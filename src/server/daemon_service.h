// The refitd control-plane service: the Cap'n Proto `Daemon` capability and its sessions.
// Owns the model spec, the data-plane receiver, the bucket ring, the registered engine and the
// active session (one at a time). Runs on one KJ event loop thread; blocking work (waiting for
// buckets, the commit copy) runs on worker threads through RunBlocking.
#ifndef REFIT_SERVER_DAEMON_SERVICE_H_
#define REFIT_SERVER_DAEMON_SERVICE_H_

#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "common/failpoint.h"
#include "kj/async-io.h"
#include "kj/timer.h"
#include "proto/refit.capnp.h"
#include "refit/bucket_ring.h"
#include "refit/converter.h"
#include "refit/staging.h"
#include "refit/planner.h"
#include "refit/session.h"
#include "server/config.h"
#include "spec/model_spec.h"
#include "storage/engine_storage.h"
#include "transport/transport.h"

namespace refit::server {

// Observers for metrics and logs; every field optional.
struct DaemonHooks {
  std::function<void(const RefitReport&)> on_report;
  std::function<void(bool registered)> on_engine;
  std::function<void(uint64_t staging_bytes, bool active)> on_session;
};

// Shared daemon state; the capability objects refer to it.
class DaemonState {
 public:
  DaemonState(Config config, spec::ModelSpec spec, std::unique_ptr<transport::Receiver> receiver,
              std::unique_ptr<BucketRing> ring, kj::LowLevelAsyncIoProvider& io, kj::Timer& timer,
              DaemonHooks hooks);
  ~DaemonState();

  struct Engine {
    uint64_t id;
    std::unique_ptr<Planner> planner;
    std::unique_ptr<storage::EngineStorage> storage;
    std::unique_ptr<StagingPool> pool;        // staging buffers, kept across refits
    std::unique_ptr<Converter> converter;     // CPU, or GPU with `staging: device`
    proto::EngineControl::Client control;
    uint64_t bytes = 0;
    bool dirty = false;  // a commit failed mid-copy: the engine stays paused until a full refit lands
  };
  struct Active {
    std::unique_ptr<Session> session;
    absl::Time begun;
    bool committing = false;
    double plan_ms = 0;
  };

  const Config config;
  const spec::ModelSpec spec;
  std::unique_ptr<transport::Receiver> receiver;
  std::unique_ptr<BucketRing> ring;
  kj::LowLevelAsyncIoProvider& io;
  kj::Timer& timer;
  DaemonHooks hooks;

  // Test builds: failpoints armed from REFIT_FAILPOINTS (docs/reliability.md); null otherwise.
  std::unique_ptr<FailpointSet> failpoints;

  std::optional<Engine> engine;
  std::optional<Active> active;
  uint64_t version = 0;
  uint64_t next_engine_id = 1;
  uint64_t committed = 0, refused = 0, aborted = 0;
  uint64_t last_session_id = 0;
  std::random_device entropy;
  RefitReport last_report;

 private:
  struct ErrorHandler : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override;
  } error_handler_;

 public:
  kj::TaskSet tasks;

  // Ends the active session with `outcome`, records and logs its report.
  void EndSession(RefitReport report);
  void NotifySession();
  // A fresh session id: a random nonzero 32-bit nonce. Data-plane tags are (id << 32) | seq, and
  // ids are handed out only over the authenticated control plane, so a peer that reaches the data
  // port cannot address a live session's buckets without it.
  uint64_t NewSessionId();
};

// The bootstrap capability served to every connection.
proto::Daemon::Client MakeDaemon(DaemonState& state);

}  // namespace refit::server

#endif  // REFIT_SERVER_DAEMON_SERVICE_H_
