#include "server/group_peers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "common/control_connect.h"
#include "kj/async-io.h"
#include "kj/vector.h"
#include "proto/wire.h"

namespace refit::server {
namespace {

// One connection and its status call, kept alive until every peer answered or timed out.
struct PeerCall {
  kj::Own<kj::AsyncIoStream> conn;
  kj::Own<capnp::TwoPartyClient> rpc;
};

}  // namespace

std::vector<PeerAnswer> QueryGroupPeers(const std::vector<std::string>& addresses, uint32_t self,
                                        absl::Duration timeout, const std::string& token) {
  std::vector<PeerAnswer> answers;
  kj::AsyncIoContext io = kj::setupAsyncIo();
  absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
  if (options.ok() && options->token.empty()) options->token = token;
  std::vector<PeerCall> calls;
  kj::Vector<kj::Promise<void>> pending;
  answers.reserve(addresses.size());
  calls.reserve(addresses.size());
  const auto timeout_ms = static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  kj::Timer& timer = io.provider->getTimer();
  for (uint32_t i = 0; i < addresses.size(); ++i) {
    if (i == self) continue;
    PeerAnswer& a = answers.emplace_back();
    a.member = i;
    a.address = addresses[i];
    if (!options.ok()) {
      a.error = std::string(options.status().message());
      continue;
    }
    absl::StatusOr<kj::Own<kj::AsyncIoStream>> conn = ConnectControl(io.provider->getNetwork(), io.waitScope, a.address,
                                                                     *options, &timer, timeout_ms * kj::MILLISECONDS);
    if (!conn.ok()) {
      a.error = std::string(conn.status().message());
      continue;
    }
    PeerCall& call = calls.emplace_back();
    call.conn = kj::mv(*conn);
    call.rpc = kj::heap<capnp::TwoPartyClient>(*call.conn);
    auto daemon = call.rpc->bootstrap().castAs<proto::Daemon>();
    const size_t at = answers.size() - 1;
    auto status = daemon.statusRequest().send().then([&answers, at](auto response) {
      PeerAnswer& a = answers[at];
      auto g = response.getStatus().getGroup();
      a.group = wire::Str(g.getName());
      a.said_member = g.getMember();
      a.phase = wire::Str(g.getPhase());
      a.tag = wire::Str(g.getTag());
      a.dirty = g.getDirty();
    });
    pending.add(
        timer.timeoutAfter(timeout_ms * kj::MILLISECONDS, kj::mv(status)).catch_([&answers, at](kj::Exception&& e) {
          answers[at].error = e.getType() == kj::Exception::Type::OVERLOADED ? "did not answer its status in time"
                                                                             : e.getDescription().cStr();
        }));
  }
  kj::joinPromises(pending.releaseAsArray()).wait(io.waitScope);
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
