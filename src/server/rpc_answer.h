// How the capability implementations (daemon_service.cc, session_service.cc,
// registration_service.cc) answer a call: every expected failure as a typed status in the call's
// results (proto/wire.h), with its cause. Event loop thread only.
#ifndef REFIT_SERVER_RPC_ANSWER_H_
#define REFIT_SERVER_RPC_ANSWER_H_

#include "absl/status/status.h"
#include "kj/async.h"
#include "proto/wire.h"

namespace refit::server {

// Every expected failure is answered as a typed status in the call's results; exceptions are
// left to the connection itself failing.
template <typename Context>
kj::Promise<void> Answer(Context& context, const absl::Status& status) {
  wire::ToWire(status, context.getResults().initStatus());
  return kj::READY_NOW;
}

}  // namespace refit::server

#endif  // REFIT_SERVER_RPC_ANSWER_H_
