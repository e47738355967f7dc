// Failpoints: named places in refitd where a test can make the process crash, fail the current
// step, or stall, to prove what the engine sees when that happens (docs/reliability.md).
//
// A FailpointSet is parsed once, at start, from a spec string (refitd reads the environment
// variable REFIT_FAILPOINTS):
//   "name=action[;name=action...]"   action: crash | error | delay:MS
// with an optional "@N" after the action: trigger on the N-th hit only (1-based; default every
// hit). `crash` ends the process with SIGKILL, as `kill -9` would; `error` makes the step return
// an Internal error naming the failpoint; `delay:MS` sleeps MS milliseconds, then continues.
//
// Failpoints are compiled only into test builds: the CMake option REFIT_FAILPOINTS defines the
// macro REFIT_FAILPOINTS, and it is ON only when REFIT_TESTING is (the default for a checkout;
// packages and images build with -DREFIT_TESTING=OFF). Without it, ArmFailpointsFromEnvironment
// ignores the variable and REFIT_FAILPOINT(...) is an OK status that never consults a set.
//
// Threading: after Parse, Hit may be called from any thread (hit counters are atomic).
#ifndef REFIT_COMMON_FAILPOINT_H_
#define REFIT_COMMON_FAILPOINT_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace refit {

// The failpoints refitd defines, in the order a refit passes them.
namespace failpoints {
inline constexpr char kBeginReceived[] = "begin_received";  // a begin's request was read; nothing planned or paused
inline constexpr char kAfterReceive[] = "after_receive";  // a bucket arrived and its checksum matched
inline constexpr char kAfterConvert[] = "after_convert";  // a bucket was converted into staging
inline constexpr char kBeforeCommit[] = "before_commit";  // validated and prepared; engine not paused yet
inline constexpr char kMidCommit[] = "mid_commit";        // engine paused, copy not started
inline constexpr char kAfterCopy[] = "after_copy";        // copy done, engine not resumed yet
// Copy done: when it triggers (armed with `error`), one bit of the first written parameter is
// flipped in the engine's storage instead of failing the step (what verify_after_commit catches).
inline constexpr char kCorruptCopy[] = "corrupt_copy";
inline constexpr char kAfterCommit[] = "after_commit";    // engine resumed, trainer not answered yet
// Group commit (docs/architecture.md "Engine groups"): a member copied the group's version and
// holds its engine paused, the coordinator not answered yet; a member got the coordinator's
// resume, its engine not resumed yet.
inline constexpr char kGroupCopied[] = "group_copied";
inline constexpr char kGroupResume[] = "group_resume";
// Late join: a joining member is about to pause an engine (rank) it holds, on a worker thread.
inline constexpr char kGroupJoinHold[] = "group_join_hold";
// refitd is exiting: its data plane stopped accepting connections and its connections are not
// closed yet (UCX: the listener's step of UcxReceiver::CloseForExit is done).
inline constexpr char kDataPlaneClosing[] = "data_plane_closing";
}  // namespace failpoints

class FailpointSet {
 public:
  enum class Action { kCrash, kError, kDelay };

  // Parses a spec (see above). An empty spec arms nothing. A name refitd does not define is an
  // error, so a misspelled failpoint fails loudly instead of never firing.
  static absl::StatusOr<std::unique_ptr<FailpointSet>> Parse(const std::string& spec);

  // Runs the action armed at `name`, if any: may not return (crash), sleep (delay), or return
  // an error (error). Unarmed names return OK at once.
  absl::Status Hit(const char* name) const;

  // How many times `name` was hit (armed points only).
  uint64_t hits(const std::string& name) const;
  bool empty() const { return points_.empty(); }

 private:
  struct Point {
    Action action = Action::kError;
    uint32_t delay_ms = 0;
    uint64_t only_hit = 0;  // 0: every hit
    mutable std::atomic<uint64_t> hits{0};
  };
  std::map<std::string, std::unique_ptr<Point>, std::less<>> points_;
};

// True when a failpoint name is one refitd defines.
bool IsKnownFailpoint(const std::string& name);

}  // namespace refit

namespace refit {

// The two builds' versions of the inline functions below live in different inline namespaces,
// so a test compiled without failpoints can link the (test-build) refit_common libraries.
#if defined(REFIT_FAILPOINTS) && REFIT_FAILPOINTS
inline namespace failpoints_compiled_in {
inline constexpr bool kFailpointsCompiledIn = true;

// The set armed by $REFIT_FAILPOINTS: null when it is unset or empty, an error when it does not
// parse (a test that arms a failpoint it misspelled must fail, not pass silently).
inline absl::StatusOr<std::unique_ptr<FailpointSet>> ArmFailpointsFromEnvironment() {
  const char* spec = std::getenv("REFIT_FAILPOINTS");
  if (spec == nullptr || *spec == '\0') return std::unique_ptr<FailpointSet>();
  return FailpointSet::Parse(spec);
}
}  // namespace failpoints_compiled_in
#else
inline namespace failpoints_compiled_out {
inline constexpr bool kFailpointsCompiledIn = false;

// A build without failpoints never reads $REFIT_FAILPOINTS: nothing can be armed.
inline absl::StatusOr<std::unique_ptr<FailpointSet>> ArmFailpointsFromEnvironment() {
  return std::unique_ptr<FailpointSet>();
}
}  // namespace failpoints_compiled_out
#endif

}  // namespace refit

// REFIT_FAILPOINT(set_ptr, name): an absl::Status; OK when failpoints are compiled out, the set
// pointer is null, or the point is not armed.
#if defined(REFIT_FAILPOINTS) && REFIT_FAILPOINTS
#define REFIT_FAILPOINT(set, name) ((set) != nullptr ? (set)->Hit(name) : ::absl::OkStatus())
#else
#define REFIT_FAILPOINT(set, name) ((void)(set), ::absl::OkStatus())
#endif

#endif  // REFIT_COMMON_FAILPOINT_H_
