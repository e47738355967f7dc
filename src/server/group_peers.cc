#include "server/group_peers.h"

#include <algorithm>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "common/control_connect.h"
#include "kj/async-io.h"
#include "proto/wire.h"

namespace refit::server {
namespace {

// Peers asked at once, each on a thread of its own (an event loop each): a group's unreachable
// peers then cost one timeout together, not one each.
constexpr size_t kConcurrentPeers = 64;

// Asks one peer on this thread's own event loop: the connection, then its status call, each
// bounded by `timeout_ms`.
void AskPeer(PeerAnswer& a, const ControlClientOptions& options, uint64_t timeout_ms) {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::Timer& timer = io.provider->getTimer();
  absl::StatusOr<kj::Own<kj::AsyncIoStream>> conn = ConnectControl(io.provider->getNetwork(), io.waitScope, a.address,
                                                                   options, &timer, timeout_ms * kj::MILLISECONDS);
  if (!conn.ok()) {
    a.error = std::string(conn.status().message());
    return;
  }
  capnp::TwoPartyClient rpc(**conn);
  auto daemon = rpc.bootstrap().castAs<proto::Daemon>();
  auto status = daemon.statusRequest().send().then([&a](auto response) {
    auto g = response.getStatus().getGroup();
    a.group = wire::Str(g.getName());
    a.said_member = g.getMember();
    a.phase = wire::Str(g.getPhase());
    a.tag = wire::Str(g.getTag());
    a.dirty = g.getDirty();
  });
  timer.timeoutAfter(timeout_ms * kj::MILLISECONDS, kj::mv(status))
      .catch_([&a](kj::Exception&& e) {
        a.error = e.getType() == kj::Exception::Type::OVERLOADED ? "did not answer its status in time"
                                                                 : e.getDescription().cStr();
      })
      .wait(io.waitScope);
}

}  // namespace

std::vector<PeerAnswer> QueryGroupPeers(const std::vector<std::string>& addresses, uint32_t self,
                                        absl::Duration timeout, const std::string& token) {
  std::vector<PeerAnswer> answers;
  absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
  if (options.ok() && options->token.empty()) options->token = token;
  answers.reserve(addresses.size());
  for (uint32_t i = 0; i < addresses.size(); ++i) {
    if (i == self) continue;
    PeerAnswer& a = answers.emplace_back();
    a.member = i;
    a.address = addresses[i];
    if (!options.ok()) a.error = std::string(options.status().message());
  }
  if (!options.ok()) return answers;
  const auto timeout_ms = static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  for (size_t first = 0; first < answers.size(); first += kConcurrentPeers) {
    std::vector<std::thread> asking;
    const size_t last = std::min(answers.size(), first + kConcurrentPeers);
    asking.reserve(last - first);
    for (size_t i = first; i < last; ++i) {
      try {
        asking.emplace_back([&a = answers[i], &options, timeout_ms] { AskPeer(a, *options, timeout_ms); });
      } catch (const std::system_error&) {
        AskPeer(answers[i], *options, timeout_ms);  // no thread to be had: this one asks
      }
    }
    for (std::thread& t : asking) t.join();
  }
  return answers;
}

std::vector<GroupMember::PeerVersion> ServedVersions(const std::vector<PeerAnswer>& answers, const std::string& name,
                                                     std::vector<std::string>& problems) {
  std::vector<GroupMember::PeerVersion> served;
  for (const PeerAnswer& a : answers) {
    const std::string who = absl::StrCat("group.addresses[", a.member, "] (", a.address, ")");
    if (!a.error.empty()) {
      problems.push_back(absl::StrCat(who, ": ", a.error));
    } else if (a.group != name) {
      problems.push_back(absl::StrCat(who, " is ",
                                      a.group.empty() ? "in no engine group" : absl::StrCat("in group '", a.group, "'"),
                                      ", not '", name, "'"));
    } else if (a.said_member != a.member) {
      problems.push_back(absl::StrCat(who, " is member ", a.said_member, " of '", name, "', not member ", a.member));
    } else if (a.phase != "joining" && !a.tag.empty()) {
      served.push_back({a.member, a.tag});
    }
  }
  return served;
}

}  // namespace refit::server
