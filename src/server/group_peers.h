// Late join of an engine group (docs/architecture.md "Engine groups", "Late join"): a member that
// (re)starts, or whose engine rank registers while it is joining, asks the group's other members
// (config group.addresses) which version the group serves. Each peer's Daemon.status answers its
// group name, member index, phase and the group version it serves; a peer that is joining itself
// knows nothing and is left out. The answers go to Node::GroupPeersReported (GroupMember decides).
//
// Threading: QueryGroupPeers blocks (on threads of its own, each with its own KJ event loop): call
// it on a worker thread (BlockingThreads), never on the daemon's loop. ServedVersions is a pure function.
#ifndef REFIT_SERVER_GROUP_PEERS_H_
#define REFIT_SERVER_GROUP_PEERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "refit/group_member.h"

namespace refit::server {

// One peer's answer, or why there is none (`error` non-empty).
struct PeerAnswer {
  uint32_t member = 0;  // its index in group.addresses
  std::string address;
  std::string group;  // the group it says it is in ("" none)
  uint32_t said_member = 0;
  std::string phase;  // joining | idle | ...
  std::string tag;    // the group version it serves
  bool dirty = false;
  std::string error;
};

// Asks every address but `self` (this daemon's index), up to 64 peers at once (a thread and an
// event loop each): each one's connection steps, then its status call, each bounded by `timeout`,
// so that unreachable peers cost about one timeout together, not one each.
// The connections take the client environment (common/control_connect.h); without REFITD_TOKEN
// or REFITD_TOKEN_FILE there, `token` (this daemon's own access.token_file: the members of a
// group share it).
std::vector<PeerAnswer> QueryGroupPeers(const std::vector<std::string>& addresses, uint32_t self,
                                        absl::Duration timeout, const std::string& token);

// The versions the answering peers of group `name` serve (joining peers left out). A peer that
// answered from another group, or at another member index than its place in group.addresses, is
// a misconfiguration: left out, and named in `problems` (one line each), as are peers that did
// not answer.
std::vector<GroupMember::PeerVersion> ServedVersions(const std::vector<PeerAnswer>& answers, const std::string& name,
                                                     std::vector<std::string>& problems);

}  // namespace refit::server

#endif  // REFIT_SERVER_GROUP_PEERS_H_
