#include "server/group_join.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kj/vector.h"
#include "server/group_peers.h"
#include "server/log.h"

namespace refit::server {

kj::Promise<void> LearnGroupVersion(DaemonState* state) {
  const Config& config = state->config;
  if (config.group_addresses.empty() || state->node.group().phase() != GroupPhase::kJoining) return kj::READY_NOW;
  auto answers = std::make_shared<std::vector<PeerAnswer>>();
  return state->blocking
      .Run([answers, addresses = config.group_addresses, self = config.group_member, token_file = config.token_file] {
        std::string token;
        if (!token_file.empty()) {
          // Checked at start-up (main.cc); read again, as a rotated file would be.
          absl::StatusOr<std::string> read = ReadTokenFile(token_file, "access.token_file");
          if (read.ok()) token = *read;
        }
        *answers = QueryGroupPeers(addresses, self, absl::Milliseconds(kGroupPeerTimeoutMs), token);
      })
      .then([state, answers] {
        std::vector<std::string> problems;
        const std::vector<GroupMember::PeerVersion> served =
            ServedVersions(*answers, state->config.group_name, problems);
        for (const std::string& p : problems) LogEvent(LogLevel::kWarn, "group_peer_unusable").Add("reason", p);
        state->node.GroupPeersReported(served);
        const GroupMember& group = state->node.group();
        LogEvent(LogLevel::kInfo, "group_peers")
            .Add("answered", served.size())
            .Add("asked", answers->size())
            .Add("group_version", group.group_version())
            .Add("phase", GroupPhaseName(group.phase()))
            .Add("reason", group.reason());
      });
}

kj::Promise<void> HoldJoiningRanks(DaemonState* state) {
  const bool joining = state->node.group().phase() == GroupPhase::kJoining;
  std::vector<Node::JoinHold> holds = state->node.GroupJoinHolds();
  if (joining && state->node.group().phase() == GroupPhase::kIdle) {
    state->Changed();
    LogEvent(LogLevel::kInfo, "group_joined")
        .Add("tag", state->node.group().tag())
        .Add("reason", "the engine holds the group's version");
  }
  kj::Vector<kj::Promise<void>> pauses;
  const absl::Duration timeout = absl::Milliseconds(state->config.pause_timeout_ms);
  for (Node::JoinHold& hold : holds) {
    auto result = std::make_shared<absl::Status>();
    pauses.add(state->blocking.Run([control = hold.control, timeout, result] { *result = control->Pause(timeout); })
                   .then([state, who = hold.who, result] {
                     LogEvent(result->ok() ? LogLevel::kWarn : LogLevel::kError, "group_join_hold")
                         .Add("engine", who)
                         .Add("paused", result->ok())
                         .Add("error", result->ok() ? "" : std::string(result->message()))
                         .Add("reason", state->node.group().reason());
                   }));
  }
  return kj::joinPromises(pauses.releaseAsArray());
}

kj::Promise<void> JoinGroup(DaemonState* state) {
  return LearnGroupVersion(state).then([state] { return HoldJoiningRanks(state); });
}

}  // namespace refit::server
