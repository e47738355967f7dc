#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace refit {

bool IsKnownFailpoint(const std::string& name) {
  for (const char* known : {failpoints::kBeginReceived, failpoints::kAfterReceive, failpoints::kAfterConvert,
                            failpoints::kBeforeCommit, failpoints::kMidCommit, failpoints::kAfterCopy,
                            failpoints::kCorruptCopy, failpoints::kAfterCommit, failpoints::kGroupCopied,
                            failpoints::kGroupResume, failpoints::kGroupJoinHold, failpoints::kDataPlaneClosing}) {
    if (name == known) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<FailpointSet>> FailpointSet::Parse(const std::string& spec) {
  auto set = std::make_unique<FailpointSet>();
  for (absl::string_view item : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    std::string name(absl::StripAsciiWhitespace(kv.first));
    absl::string_view action = absl::StripAsciiWhitespace(kv.second);
    if (name.empty() || action.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("failpoint spec '", item, "': expected name=action"));
    }
    if (!IsKnownFailpoint(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown failpoint '", name, "'"));
    }
    auto point = std::make_unique<Point>();
    std::pair<absl::string_view, absl::string_view> at = absl::StrSplit(action, absl::MaxSplits('@', 1));
    if (!at.second.empty() && (!absl::SimpleAtoi(at.second, &point->only_hit) || point->only_hit == 0)) {
      return absl::InvalidArgumentError(absl::StrCat("failpoint '", name, "': bad hit number '", at.second, "'"));
    }
    absl::string_view verb = at.first;
    if (verb == "crash") {
      point->action = Action::kCrash;
    } else if (verb == "error") {
      point->action = Action::kError;
    } else if (absl::ConsumePrefix(&verb, "delay:")) {
      point->action = Action::kDelay;
      if (!absl::SimpleAtoi(verb, &point->delay_ms)) {
        return absl::InvalidArgumentError(absl::StrCat("failpoint '", name, "': bad delay '", verb, "'"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("failpoint '", name, "': unknown action '", at.first, "' (crash, error, delay:MS)"));
    }
    set->points_[name] = std::move(point);
  }
  return set;
}

absl::Status FailpointSet::Hit(const char* name) const {
  auto it = points_.find(absl::string_view(name));
  if (it == points_.end()) return absl::OkStatus();
  const Point& p = *it->second;
  uint64_t n = p.hits.fetch_add(1) + 1;
  if (p.only_hit != 0 && n != p.only_hit) return absl::OkStatus();
  switch (p.action) {
    case Action::kCrash:
      kill(getpid(), SIGKILL);
      _exit(137);  // not reached
    case Action::kDelay:
      std::this_thread::sleep_for(std::chrono::milliseconds(p.delay_ms));
      return absl::OkStatus();
    case Action::kError:
      break;
  }
  return absl::InternalError(absl::StrCat("failpoint '", name, "' triggered"));
}

uint64_t FailpointSet::hits(const std::string& name) const {
  auto it = points_.find(name);
  return it == points_.end() ? 0 : it->second->hits.load();
}

}  // namespace refit
