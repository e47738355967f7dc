#include "transport/tag_matcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/hot_wait.h"

namespace refit::transport {
namespace {

absl::Status Oversized(uint64_t bytes, uint64_t tag, uint64_t capacity) {
  return absl::InvalidArgumentError(absl::StrCat("message of ", bytes, " bytes on tag ", tag,
                                                 " exceeds the receive buffer of ", capacity, " bytes; dropped"));
}

absl::Status NoMessage(uint64_t tag) {
  return absl::DeadlineExceededError(absl::StrCat("no message on tag ", tag, " before the deadline"));
}

}  // namespace

std::list<TagMatcher::Post*>::iterator TagMatcher::FindPost(uint64_t tag) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->tag == tag && !(*it)->claimed) return it;
  }
  return posted_.end();
}

TagMatcher::Arrival TagMatcher::Arrive(Sender& sender, uint64_t tag, uint64_t bytes,
                                       const std::function<bool()>& alive) {
  Arrival a;
  a.tag = tag;
  a.bytes = bytes;
  uint64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    epoch = epoch_;
  }
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto queued = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto it = eager_.find(tag);
        return it != eager_.end() && !it->second.empty();
      };
      auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return bytes <= options_.eager_bytes && eager_held_ + bytes <= options_.eager_limit_bytes;
      };
      auto matched = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queued() && FindPost(tag) != posted_.end(); };
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ || matched() || fits(); };
      SpinWhileRefitHot(mu_, absl::Condition(&ready), absl::Now() + absl::Milliseconds(20));
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(20));
      if (shutdown_) return a;  // kStop
      auto gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (!options_.wait_for_sessions) return cancelled_ || epoch_ != epoch;
        return std::find(ended_.begin(), ended_.end(), tag >> 32) != ended_.end();
      };
      if (!matched() && !fits() && gone()) {
        a.kind = Arrival::kDrop;  // nobody will receive it: its session ended
        return a;
      }
      if (matched()) {
        auto it = FindPost(tag);
        Post* post = *it;
        post->claimed = true;
        post->owner = &sender;
        posted_.erase(it);
        sender.active_in = generation_;
        a.kind = Arrival::kPost;
        a.post = post;
        a.dst = post->dst;
        a.capacity = post->capacity;
        a.oversized = bytes > post->capacity;
        a.lendable = post->lendable;
        return a;
      }
      if (fits()) {
        eager_held_ += bytes;
        eager_[tag].push_back(Held{&sender, bytes, false, absl::OkStatus(), {}});
        sender.active_in = generation_;
        a.kind = Arrival::kHold;
        a.held = &eager_[tag].back();
        return a;
      }
    }
    if (!alive()) return a;  // kStop
  }
}

void TagMatcher::Complete(const Arrival& a, const absl::Status& status, std::vector<uint8_t> host) {
  Complete(a, status, std::move(host), Loan{});
}

void TagMatcher::Complete(const Arrival& a, const absl::Status& status, std::vector<uint8_t> host, Loan loan) {
  absl::MutexLock lock(&mu_);
  switch (a.kind) {
    case Arrival::kHold:
      a.held->status = status;
      a.held->data = std::move(host);
      a.held->ready = true;
      break;
    case Arrival::kPost:
      if (!status.ok()) {
        a.post->result = status;
      } else if (a.oversized) {
        a.post->result = Oversized(a.bytes, a.tag, a.capacity);
      } else {
        a.post->result = a.bytes;
        if (a.lendable) a.post->loan = loan;
      }
      a.post->done = true;
      break;
    case Arrival::kStop:
    case Arrival::kDrop:
      break;
  }
}

absl::StatusOr<uint64_t> TagMatcher::Receive(
    uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline,
    const std::function<absl::Status(void* dst, const void* src, uint64_t bytes)>& copy, Loan* loan) {
  if (loan != nullptr) *loan = {};
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("receive cancelled");
  if (!failure_.ok()) return failure_;
  if (auto it = eager_.find(tag); it != eager_.end() && !it->second.empty()) {
    // The tag's oldest message is held, or on its way into host memory: wait for it (with
    // abort_stalled, past the deadline its sender stalled mid-message and is aborted).
    Held* front = &it->second.front();
    SpinWhileRefitHot(mu_, absl::Condition(&front->ready), deadline);
    if (!options_.abort_stalled) {
      mu_.Await(absl::Condition(&front->ready));
    } else if (!mu_.AwaitWithDeadline(absl::Condition(&front->ready), deadline)) {
      front->owner->abort_requested = true;
      mu_.Await(absl::Condition(&front->ready));
    }
    Held message = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) eager_.erase(it);
    eager_held_ -= message.bytes;
    if (!message.status.ok()) return message.status;
    if (message.bytes > capacity) return Oversized(message.bytes, tag, capacity);
    if (message.bytes > 0) {
      absl::Status st = copy(dst, message.data.data(), message.bytes);
      if (!st.ok()) return st;
    }
    return message.bytes;
  }
  if (absl::Now() >= deadline) return NoMessage(tag);
  Post post;
  post.tag = tag;
  post.dst = dst;
  post.capacity = capacity;
  post.lendable = loan != nullptr;
  posted_.push_back(&post);
  // (A lent message's Loan is copied out on every successful return below.)
  auto lent = [&](absl::StatusOr<uint64_t> result) {
    if (result.ok() && loan != nullptr) *loan = post.loan;
    return result;
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return post.done || (!post.claimed && (cancelled_ || !failure_.ok() || shutdown_));
  };
  SpinWhileRefitHot(mu_, absl::Condition(&ready), deadline);
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (!post.claimed) {
    posted_.remove(&post);
    if (cancelled_ || shutdown_) return absl::CancelledError("receive cancelled");
    if (!failure_.ok()) return failure_;
    return NoMessage(tag);
  }
  SpinWhileRefitHot(mu_, absl::Condition(&post.done), deadline);
  if (!options_.abort_stalled) {
    // The message is being copied into dst (a local copy: the bytes are all there).
    mu_.Await(absl::Condition(&post.done));
    return lent(post.result);
  }
  // The message is being written into dst: wait for it. Past the deadline the sender has stalled
  // mid-message; it is asked to abort, which ends the write.
  if (!mu_.AwaitWithDeadline(absl::Condition(&post.done), deadline)) {
    post.owner->abort_requested = true;
    mu_.Await(absl::Condition(&post.done));
    if (post.result.ok()) return lent(post.result);
    return absl::DeadlineExceededError(absl::StrCat("message on tag ", tag, " still incomplete at the deadline: ",
                                                    post.result.status().message()));
  }
  return lent(post.result);
}

void TagMatcher::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  ++epoch_;
}

void TagMatcher::Reset() {
  absl::MutexLock lock(&mu_);
  cancelled_ = false;
  failure_ = absl::OkStatus();
  ++generation_;
  ++epoch_;
}

void TagMatcher::EndSession(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  if (std::find(ended_.begin(), ended_.end(), session_id) == ended_.end()) {
    ended_.push_back(session_id);
    if (ended_.size() > kEndedSessions) ended_.pop_front();
  }
  // Its held messages nobody will receive (those still being transferred stay until complete).
  for (auto it = eager_.lower_bound(session_id << 32); it != eager_.end() && (it->first >> 32) == session_id;) {
    std::deque<Held>& q = it->second;
    while (!q.empty() && q.front().ready) {
      eager_held_ -= q.front().bytes;
      q.pop_front();
    }
    it = q.empty() ? eager_.erase(it) : std::next(it);
  }
}

void TagMatcher::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

void TagMatcher::PeerFailed(Sender& sender, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok() && sender.active_in == generation_) failure_ = status;
}

uint64_t TagMatcher::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return eager_held_;
}

}  // namespace refit::transport
