// Late join of an engine group as daemon tasks (docs/architecture.md "Engine groups", "Late
// join"): at start, and when an engine (rank) registers while the member is joining, the member
// asks its peers (config group.addresses; server/group_peers.h) for the group's version, then
// keeps paused every engine rank that runs another version (Node::GroupJoinHolds): those ranks
// run nothing until the group's next version lands on this member through the group commit.
//
// Threading: event loop thread only; the peer query and the pauses run on worker threads.
#ifndef REFIT_SERVER_GROUP_JOIN_H_
#define REFIT_SERVER_GROUP_JOIN_H_

#include <cstdint>

#include "kj/async.h"
#include "server/daemon_state.h"

namespace refit::server {

// How long one peer may take for each step of its answer (connect, status call).
inline constexpr int64_t kGroupPeerTimeoutMs = 2000;
// At start-up, while no peer answers at all, how often they are asked again.
inline constexpr int64_t kGroupPeerRetryMs = 1000;

// Joining with group.addresses configured: asks the peers and hands their answers to the node.
// Resolves to whether any peer answered (or nothing was to be asked).
// `again`: a start-up retry, whose unusable peers are logged at debug level (once at warn).
kj::Promise<bool> LearnGroupVersion(DaemonState* state, bool again = false);

// Pauses (and leaves paused) what Node::GroupJoinHolds names; resolves once every pause returned,
// and, `engine` being a registration (not 0), once no pause or resume of that engine (rank) is in
// flight either: a concurrent call (the start-up task's ask, ended first) may have held it, in which
// case GroupJoinHolds names it no more.
kj::Promise<void> HoldJoiningRanks(DaemonState* state, uint64_t engine = 0);

// Both, in order: the start-up task and what the registration `engine` waits for before it is
// answered (so that an engine rank that runs another version than the group's is paused before it
// serves).
kj::Promise<void> JoinGroup(DaemonState* state, uint64_t engine = 0);

// The start-up task: JoinGroup, again every kGroupPeerRetryMs while the member is joining and no
// peer answered at all (they were unreachable when it started), so that it learns the group's
// version, and holds an engine that runs another, once one answers.
kj::Promise<void> JoinGroupAtStart(DaemonState* state, bool again = false);

}  // namespace refit::server

#endif  // REFIT_SERVER_GROUP_JOIN_H_
