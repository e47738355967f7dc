// The Cap'n Proto `Registration` capability a registered engine (or engine rank) holds: its
// version, sleep and wake (a wake maps the engine's memory again and commits what was staged for
// it meanwhile). Dropping it unregisters the engine.
//
// Event loop thread only.
#ifndef REFIT_SERVER_REGISTRATION_SERVICE_H_
#define REFIT_SERVER_REGISTRATION_SERVICE_H_

#include <cstdint>

#include "proto/refit.capnp.h"
#include "server/daemon_state.h"

namespace refit::server {

// The registration of the engine (or engine rank) `engine_id`, which the node registered.
proto::Registration::Client MakeRegistration(DaemonState& state, uint64_t engine_id);

}  // namespace refit::server

#endif  // REFIT_SERVER_REGISTRATION_SERVICE_H_
