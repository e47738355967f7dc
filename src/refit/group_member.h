// GroupMember: this daemon's side of an engine group's commit. An engine whose ranks span several
// nodes is served by one refitd per node; the trainer (the coordinator) makes each group version V
// in two phases (docs/architecture.md "Engine groups"):
//
//   prepare   every member receives, converts, validates and holds V (a stage-only refit, hold: K)
//   commit    every member pauses its engine and copies V, answering "copied" with the engine
//             still paused; once every member copied, the coordinator resumes every member with V
//
// and aborts V everywhere when a member cannot prepare or copy. This class is the member's state
// machine for one version at a time; it decides nothing about bytes (Node's group commit does the
// pause, the copy, the resume and the restore) and knows no wire:
//
//   kJoining ─(first group version resumed, or PeersReported: the engine holds the group's)─► kIdle
//   kIdle ──StartCommit──► kCopying ──Copied──► kCopied ──StartResume──► kResuming ──Resumed──► kIdle
//                              │                   │  └──StartRestore (abort, deadline)──► kRestoring
//                              └─CommitEnded──► kIdle                 Restored ──► kIdle
//
// kJoining: the daemon (re)started inside a group and has served no group version yet, so its
// engine is not ready (Node::Ready) until a group refit lands. Its peers (config group.addresses) tell
// it the group's version (PeersReported): an engine that holds that version, clean, joins at once;
// one that holds another is kept paused (MustHold) until the next group version lands on it.
// The deadline: a member copied (its engine paused) that hears neither resume nor abort by its
// deadline restores the version it held and resumes (Expired), and marks the group dirty: the
// coordinator vanished and another member may have been told to resume; only the next group
// version clears it.
//
// Threading: not thread-safe; the server's event loop only (as Node). Time from the Clock.
#ifndef REFIT_REFIT_GROUP_MEMBER_H_
#define REFIT_REFIT_GROUP_MEMBER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace refit {

// The daemon's `group:` config (docs/config.md "Engine groups"). members == 0: no group.
struct GroupOptions {
  std::string name;
  uint32_t members = 0;
  uint32_t member = 0;  // this daemon's index, 0 .. members - 1
  // How long a copied member waits for the coordinator's resume or abort (groupCommit's
  // deadlineMs when it gives none).
  absl::Duration decision_timeout = absl::Seconds(30);
  // Late join (config group.addresses, group.peers_unreachable): the member asks its peers for the
  // group's version; while the latest ask reached none and nothing is known, hold_unanswered keeps
  // every engine (rank) that registers paused (MustHoldUnanswered) rather than let it serve what it
  // holds next to the group's version.
  bool ask_peers = false;
  bool hold_unanswered = true;
};

enum class GroupPhase { kJoining, kIdle, kCopying, kCopied, kResuming, kRestoring };
const char* GroupPhaseName(GroupPhase phase);  // "joining", "idle", ...

class GroupMember {
 public:
  // REQUIRES: clock outlives this.
  GroupMember(GroupOptions options, const Clock* clock);

  bool enabled() const { return options_.members > 0; }
  const GroupOptions& options() const { return options_; }
  GroupPhase phase() const { return phase_; }
  // The group version this member serves ("" before its first).
  const std::string& tag() const { return tag_; }
  // The version in flight (kCopying .. kRestoring); "" otherwise.
  const std::string& pending_tag() const { return pending_; }
  bool dirty() const { return dirty_; }
  const std::string& reason() const { return reason_; }
  // kCopied: when the member decides alone (absl::InfiniteFuture() otherwise).
  absl::Time deadline() const { return deadline_; }
  absl::Duration DeadlineLeft() const;
  uint64_t commits() const { return commits_; }
  uint64_t aborts() const { return aborts_; }
  uint64_t expiries() const { return expiries_; }
  // Serving-readiness as a group member: OK unless joining (no group version yet) or dirty.
  absl::Status Ready() const;

  // The coordinator commits `tag`: FailedPrecondition while another version is in flight (naming
  // it); `deadline` zero: options().decision_timeout.
  absl::Status StartCommit(const std::string& tag, absl::Duration deadline);
  // The engine is paused and holds `tag` (kCopied): the deadline starts now.
  void Copied();
  // The commit ended before copying (refused, failed: the engine holds what it held, or is dirty):
  // the member is back where the version started (idle, or joining).
  void CommitEnded();
  // The coordinator resumes `tag`: FailedPrecondition unless copied with it (a member that
  // restored at its deadline refuses, so the coordinator learns the group is dirty).
  absl::Status StartResume(const std::string& tag);
  // The engine resumed with the version in flight (ok), or did not answer.
  void Resumed(bool ok);
  // Abort of `tag` by the coordinator (expired false) or at the deadline (true): true when the
  // member is copied with it and must restore (kRestoring); false when nothing is in flight for
  // it (a held version only: the caller drops it).
  bool StartRestore(const std::string& tag, bool expired);
  // The restore ended: `restored` the engine holds and serves the version it held before;
  // otherwise it stays paused and dirty (`why`).
  void Restored(bool restored, const std::string& why);
  // The coordinator aborts `tag` while this member is still copying it: true, and the member
  // restores as soon as it has copied (abort_requested()); false when `tag` is not being copied.
  bool RequestAbort(const std::string& tag);
  bool abort_requested() const { return abort_requested_; }
  // Late join. What the member's peers answered: each peer's member index and the group version it
  // serves (peers that are joining themselves, or did not answer, are left out). Joining, the
  // member learns the group's version: the one every answering peer serves, or a conflict when
  // they differ (a group dirty after its coordinator vanished mid-resume). Nothing answered: the
  // group's version stays unknown (ranks that register run; the member stays joining).
  struct PeerVersion {
    uint32_t member = 0;
    std::string tag;
  };
  void PeersReported(const std::vector<PeerVersion>& peers);
  // Whether the latest ask reached any peer (a peer that is joining itself answers too: it knows
  // nothing, as the member does, which is what the whole group restarting looks like).
  void PeersAsked(bool answered);
  // Joining, asking peers with hold_unanswered, the group's version unknown and the latest ask
  // reached no peer: every engine (rank) is kept paused until a peer answers (reason() says so).
  // Once one does, those that hold the group's version, or all when it is still unknown (every
  // peer joining), may run again; the rest stay held as MustHold says.
  bool MustHoldUnanswered();
  // The group's version as the peers reported it ("" unknown, or in conflict).
  const std::string& group_version() const { return group_version_; }
  bool group_version_known() const { return !group_version_.empty() || !conflict_.empty(); }
  // Joining with the group's version known: true when an engine (rank) holding `engine_tag` must be
  // kept paused, because it does not hold the group's version (a dirty engine is paused already:
  // false). Sets reason() naming the group and its version, for a dirty engine too (the peers'
  // answers, asked again at each registration, replace the reason).
  bool MustHold(const std::string& engine_tag, bool dirty);
  // Joining with the group's version known and held, clean, by the whole engine: the member serves
  // it (kIdle, tag() = the group's version) without a refit. False when it cannot.
  bool JoinHeld(const std::string& engine_tag, bool dirty);
  // Copied and past the deadline (by the clock).
  bool Expired() const;
  // An engine registered holding `engine_tag` (`dirty`: it lost refitd inside a commit window).
  // Unless it holds this member's group version, clean, the member is joining until the next
  // group version lands (a restarted daemon knows no group version: every engine joins).
  void EngineRegistered(const std::string& engine_tag, bool dirty);

 private:
  const GroupOptions options_;
  const Clock* const clock_;
  GroupPhase phase_;
  std::string tag_, pending_;
  bool dirty_ = false;
  bool abort_requested_ = false;
  bool joining_before_ = false;  // the phase the version in flight started from was kJoining
  std::string reason_;
  std::string group_version_;              // late join: what the peers serve ("" unknown)
  std::string conflict_;                   // late join: the peers serve different versions (naming them)
  bool asked_ = false, answered_ = false;  // late join: the latest ask of the peers, and its answer
  absl::Duration pending_deadline_;
  absl::Time deadline_ = absl::InfiniteFuture();
  uint64_t commits_ = 0, aborts_ = 0, expiries_ = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_GROUP_MEMBER_H_
