// Late join of an engine group as daemon tasks (docs/architecture.md "Engine groups", "Late
// join"): at start, and when an engine (rank) registers while the member is joining, the member
// asks its peers (config group.addresses; server/group_peers.h) for the group's version, then
// keeps paused every engine rank that runs another version (Node::GroupJoinHolds): those ranks
// run nothing until the group's next version lands on this member through the group commit.
//
// Threading: event loop thread only; the peer query and the pauses run on worker threads.
#ifndef REFIT_SERVER_GROUP_JOIN_H_
#define REFIT_SERVER_GROUP_JOIN_H_

#include "kj/async.h"
#include "server/daemon_state.h"

namespace refit::server {

// How long one peer may take to answer its status (connect included).
inline constexpr int64_t kGroupPeerTimeoutMs = 2000;

// Joining with group.addresses configured: asks the peers and hands their answers to the node.
// Resolves at once otherwise.
kj::Promise<void> LearnGroupVersion(DaemonState* state);

// Pauses (and leaves paused) what Node::GroupJoinHolds names; resolves once every pause returned.
kj::Promise<void> HoldJoiningRanks(DaemonState* state);

// Both, in order: the start-up task and what a registration waits for before it is answered (so
// that an engine rank that runs another version than the group's is paused before it serves).
kj::Promise<void> JoinGroup(DaemonState* state);

}  // namespace refit::server

#endif  // REFIT_SERVER_GROUP_JOIN_H_
