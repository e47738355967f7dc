// The refitd control-plane service: the Cap'n Proto `Daemon` capability, the bootstrap served to
// every connection, adapted onto the refit core's Node (src/refit/node.h), which owns the engine
// records, the session lifecycle and the commit protocol. It translates: wire types in, typed
// statuses with their causes and reports out, promises around the core's blocking steps. What the
// core leaves to the server lives beside it:
//   - daemon_state.h: what the capabilities share, and when the event loop busy polls;
//   - session_service.h, registration_service.h: the `Session` and `Registration` capabilities;
//   - engine_setup.h: a registration's engine storage and its staging and converter by the
//     config's `staging:`;
//   - rpc_engine_control.h: the engine's pause and resume over the control plane;
//   - manifest_cache.h: the tensor lists kept so that a begin may name its manifest by key;
//   - early_pause.h: staging: direct's early pause;
//   - commit_task.h: each commit as a daemon task on a kept worker thread.
//
// Runs on one KJ event loop thread (daemon_state.h).
#ifndef REFIT_SERVER_DAEMON_SERVICE_H_
#define REFIT_SERVER_DAEMON_SERVICE_H_

#include "proto/refit.capnp.h"
#include "server/daemon_state.h"

namespace refit::server {

// The bootstrap capability served to every connection.
proto::Daemon::Client MakeDaemon(DaemonState& state);

}  // namespace refit::server

#endif  // REFIT_SERVER_DAEMON_SERVICE_H_
