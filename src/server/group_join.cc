#include "server/group_join.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/failpoint.h"
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
        const bool answered =
            std::any_of(answers->begin(), answers->end(), [](const PeerAnswer& a) { return a.error.empty(); });
        state->node.GroupPeersReported(served, answered);
        const GroupMember& group = state->node.group();
        LogEvent(again ? LogLevel::kDebug : LogLevel::kInfo, "group_peers")
            .Add("serving", served.size())
            .Add("asked", answers->size())
            .Add("group_version", group.group_version())
            .Add("phase", GroupPhaseName(group.phase()))
            .Add("reason", group.reason());
        return answered;
      });
}

namespace {

// Resolves once no pause or resume that HoldJoiningRanks sent to the registration `engine` (0:
// none) is in flight.
kj::Promise<void> JoinHoldsAnswered(DaemonState* state, uint64_t engine) {
  if (!state->join_holds_in_flight.contains(engine)) return kj::READY_NOW;
  return state->OnChange().then([state, engine] { return JoinHoldsAnswered(state, engine); });
}

}  // namespace

kj::Promise<void> HoldJoiningRanks(DaemonState* state, uint64_t engine) {
  const bool joining = state->node.group().phase() == GroupPhase::kJoining;
  std::vector<Node::JoinHold> holds = state->node.GroupJoinHolds();
  if (joining && state->node.group().phase() == GroupPhase::kIdle) {
    state->Changed();
    LogEvent(LogLevel::kInfo, "group_joined")
        .Add("tag", state->node.group().tag())
        .Add("reason", "the engine holds the group's version");
  }
  kj::Vector<kj::Promise<void>> calls;
  const absl::Duration timeout = absl::Milliseconds(state->config.pause_timeout_ms);
  for (Node::JoinHold& hold : holds) {
    auto result = std::make_shared<absl::Status>();
    const bool release = hold.release;
    kj::Promise<void> run = state->blocking.Run([hold, timeout, result, armed = state->failpoints.get()] {
      if (!hold.release) {
        *result = REFIT_FAILPOINT(armed, failpoints::kGroupJoinHold);
        if (!result->ok()) return;
      }
      *result = hold.release ? hold.control->Resume(hold.version, hold.tag, timeout) : hold.control->Pause(timeout);
    });
    ++state->join_holds_in_flight[hold.engine];
    // A daemon task: the call is logged and counted out even if the registration waiting for it
    // goes away.
    kj::ForkedPromise<void> call =
        run.catch_([result](kj::Exception&& e) { *result = absl::InternalError(e.getDescription().cStr()); })
            .then([state, who = hold.who, engine = hold.engine, release, result] {
              const LogLevel level = !result->ok() ? LogLevel::kError : release ? LogLevel::kInfo : LogLevel::kWarn;
              LogEvent(level, release ? "group_join_release" : "group_join_hold")
                  .Add("engine", who)
                  .Add(release ? "resumed" : "paused", result->ok())
                  .Add("error", result->ok() ? "" : std::string(result->message()))
                  .Add("reason", state->node.group().reason());
              if (--state->join_holds_in_flight[engine] == 0) state->join_holds_in_flight.erase(engine);
              state->Changed();
            })
            .fork();
    state->tasks.add(call.addBranch());
    calls.add(call.addBranch());
  }
  return kj::joinPromises(calls.releaseAsArray()).then([state, engine] { return JoinHoldsAnswered(state, engine); });
}

namespace {

bool WaitingForPeers(const DaemonState& state) {
  return !state.config.group_addresses.empty() && state.node.group().phase() == GroupPhase::kJoining;
}

}  // namespace

kj::Promise<void> JoinGroup(DaemonState* state, uint64_t engine) {
  return LearnGroupVersion(state).then([state, engine](bool answered) {
    kj::Promise<void> held = HoldJoiningRanks(state, engine);
    if (!answered && WaitingForPeers(*state) && !state->group_asking) {
      // No peer answered this registration's ask: ask again until one does, as at start, so that
      // what was held meanwhile (group.peers_unreachable: hold) learns the group's version.
      state->group_asking = true;
      state->tasks.add(state->timer.afterDelay(kGroupPeerRetryMs * kj::MILLISECONDS).then([state] {
        return JoinGroupAtStart(state, /*again=*/true);
      }));
    }
    return held;
  });
}

kj::Promise<void> JoinGroupAtStart(DaemonState* state, bool again) {
  state->group_asking = true;
  return LearnGroupVersion(state, again).then([state](bool answered) {
    kj::Promise<void> held = HoldJoiningRanks(state);
    if (answered || !WaitingForPeers(*state)) {
      state->group_asking = false;
      return held;
    }
    return held.then([state] { return state->timer.afterDelay(kGroupPeerRetryMs * kj::MILLISECONDS); }).then([state] {
      return JoinGroupAtStart(state, /*again=*/true);
    });
  });
}

}  // namespace refit::server
