// The engine's pause and resume over the control plane: the core's EngineControl
// (src/refit/engine_control.h) on the engine's Cap'n Proto `EngineControl` capability. Each call
// is raced against its timeout; a call that timed out is kept until the engine answers it, and the
// engine counts as unresponsive meanwhile.
//
// Made and destroyed on the event loop thread; Pause and Resume are called from a commit's worker
// thread (BlockingThreads) and run on the loop through its executor.
#ifndef REFIT_SERVER_RPC_ENGINE_CONTROL_H_
#define REFIT_SERVER_RPC_ENGINE_CONTROL_H_

#include <memory>

#include "kj/timer.h"
#include "proto/refit.capnp.h"
#include "refit/engine_control.h"

namespace refit::server {

// REQUIRES: called on the event loop thread (the one whose executor the calls run on).
std::unique_ptr<EngineControl> NewRpcEngineControl(proto::EngineControl::Client client, kj::Timer& timer);

}  // namespace refit::server

#endif  // REFIT_SERVER_RPC_ENGINE_CONTROL_H_
