#include "server/group_join.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kj/vector.h"
#include "server/group_peers.h"
#include "server/log.h"

namespace refit::server {

kj::Promise<bool> LearnGroupVersion(DaemonState* state, bool again) {
  const Config& config = state->config;
  if (config.group_addresses.empty() || state->node.group().phase() != GroupPhase::kJoining) return true;
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
      .then([state, answers, again] {
        std::vector<std::string> problems;
        const std::vector<GroupMember::PeerVersion> served =
            ServedVersions(*answers, state->config.group_name, problems);
        for (const std::string& p : problems)
          LogEvent(again ? LogLevel::kDebug : LogLevel::kWarn, "group_peer_unusable").Add("reason", p);
        state->node.GroupPeersReported(served);
        const GroupMember& group = state->node.group();
        LogEvent(again ? LogLevel::kDebug : LogLevel::kInfo, "group_peers")
            .Add("serving", served.size())
            .Add("asked", answers->size())
            .Add("group_version", group.group_version())
            .Add("phase", GroupPhaseName(group.phase()))
            .Add("reason", group.reason());
        return std::any_of(answers->begin(), answers->end(), [](const PeerAnswer& a) { return a.error.empty(); });
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
  return LearnGroupVersion(state).then([state](bool) { return HoldJoiningRanks(state); });
}

kj::Promise<void> JoinGroupAtStart(DaemonState* state, bool again) {
  return LearnGroupVersion(state, again).then([state](bool answered) {
    kj::Promise<void> held = HoldJoiningRanks(state);
    if (answered || state->node.group().phase() != GroupPhase::kJoining) return held;
    return held.then([state] { return state->timer.afterDelay(kGroupPeerRetryMs * kj::MILLISECONDS); }).then([state] {
      return JoinGroupAtStart(state, /*again=*/true);
    });
  });
}

}  // namespace refit::server
