#include "refit/session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hot_wait.h"
#include "common/trace.h"

namespace refit {

Session::Session(const Planner& planner, transport::Receiver& receiver, BucketRing& ring, Converter& converter,
                 StagingPool& pool, Options options)
    : planner_(planner),
      receiver_(receiver),
      ring_(ring),
      converter_(converter),
      options_(std::move(options)),
      ledger_(planner),
      staging_(std::make_unique<Staging>(options_.limits.staging_bytes, pool)),
      slices_(ring.memory(), options_.limits.staging_bytes) {
  {
    absl::MutexLock lock(&mu_);
    awaiting_placement_ = options_.await_placement;
    for (const auto& [name, amax] : options_.supplied_amax) supplied_amax_[name] = amax;
  }
  receiver_.Reset();
  ring_.Reset();
  KeptThreads* threads = options_.threads;
  if (threads == nullptr) threads = (own_threads_ = std::make_unique<KeptThreads>()).get();
  receiver_run_ = threads->Start([this] { ReceiveLoop(); });
  converter_run_ = threads->Start([this] { ConvertLoop(); });
}

Session::~Session() {
  Stop();
  absl::MutexLock lock(&mu_);
  for (const Received& r : received_) Done(r);  // left by a converter that failed (a lent sender waits)
  received_.clear();
}

void Session::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (failure_.ok()) failure_ = absl::CancelledError("session closed");
  }
  receiver_.EndSession(options_.id);
  receiver_.Cancel();
  ring_.Cancel();
  receiver_run_.Wait();
  converter_run_.Wait();
}

void Session::UsePlacement(std::shared_ptr<const Placement> placement) {
  staging_->Place(std::move(placement));
  absl::MutexLock lock(&mu_);
  awaiting_placement_ = false;
}

uint64_t Session::in_place_bytes() const { return staging_->in_place_bytes(); }

void Session::Done(const Received& r) {
  receiver_.GiveBack(r.loan);
  ring_.Release(r.slot);
}

void Session::FailLocked(absl::Status status) {
  if (!failure_.ok()) return;
  failure_ = std::move(status);
  receiver_.EndSession(options_.id);
  receiver_.Cancel();
  ring_.Cancel();
}

void Session::Abort(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  FailLocked(absl::AbortedError(reason));
}

absl::Status Session::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

absl::Status Session::CheckHeader(const BucketHeader& h) const {
  const SessionLimits& l = options_.limits;
  if (h.nbytes > l.bucket_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket ", h.seq, ": ", h.nbytes, " bytes exceeds bucket_bytes ", l.bucket_bytes));
  }
  if (h.tensors.size() > l.max_tensors) {
    return absl::InvalidArgumentError(absl::StrCat("bucket ", h.seq, ": ", h.tensors.size(), " tensors exceeds the limit"));
  }
  for (const TensorDesc& t : h.tensors) {
    if (t.name.empty() || t.name.size() > l.max_name_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", h.seq, ": tensor name of ", t.name.size(),
                                                     " bytes (limit ", l.max_name_bytes, ")"));
    }
    if (t.shape.size() > l.max_rank) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", h.seq, ": tensor '", t.name, "' has rank ",
                                                     t.shape.size(), " (limit ", l.max_rank, ")"));
    }
    absl::StatusOr<uint64_t> dense = DenseBytes(t.dtype, t.shape);
    if (!dense.ok()) return absl::InvalidArgumentError(absl::StrCat("bucket ", h.seq, ": tensor '", t.name, "': ", dense.status().message()));
    if (*dense != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", h.seq, ": tensor '", t.name, "' declares ", t.nbytes,
                                                     " bytes but ", DTypeName(t.dtype), ShapeString(t.shape), " is ",
                                                     *dense));
    }
    if (t.offset > h.nbytes || t.nbytes > h.nbytes - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", h.seq, ": tensor '", t.name, "' [", t.offset, ", +",
                                                     t.nbytes, ") lies outside the bucket of ", h.nbytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status Session::Announce(BucketHeader header, uint32_t* assigned, uint32_t rank) {
  absl::Status check = CheckHeader(header);
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return failure_;
  if (stopping_) return absl::FailedPreconditionError("session is committing; no more buckets");
  if (rank > kMaxRanks) return absl::InvalidArgumentError(absl::StrCat("trainer rank ", rank, " past ", kMaxRanks));
  uint32_t& next = next_seq_[rank];
  const uint32_t expected = SeqBase(rank) + next;
  if (header.seq == kAssignSeq) header.seq = expected;
  if (assigned != nullptr) *assigned = header.seq;
  if (check.ok() && next >= (1u << kSeqRangeBits) - 1) {
    check = absl::InvalidArgumentError(absl::StrCat("bucket ", header.seq, ": more than ", (1u << kSeqRangeBits) - 1,
                                                    " buckets from one trainer rank"));
  }
  if (check.ok() && header.seq != expected) {
    check = absl::InvalidArgumentError(absl::StrCat("bucket seq ", header.seq, " out of order (expected ", expected, ")"));
  }
  if (check.ok() && header.tensors.size() > options_.limits.max_tensors - std::min<uint64_t>(announced_tensors_, options_.limits.max_tensors)) {
    check = absl::InvalidArgumentError(absl::StrCat("bucket ", header.seq, ": the session would exceed ",
                                                    options_.limits.max_tensors, " tensors (limits.max_tensors)"));
  }
  if (!check.ok()) {
    FailLocked(check);
    return check;
  }
  ++next;
  ++announced_count_;
  announced_tensors_ += header.tensors.size();
  // Whole tensors' supplied amax, known before their bucket converts (a fused group converts in
  // one pass once every member's is known; slices are known when assembled).
  for (const TensorDesc& t : header.tensors) {
    if (!t.amax || t.slice.present()) continue;
    auto [it, fresh] = supplied_amax_.try_emplace(t.name, *t.amax);
    if (!fresh) it->second = std::max(it->second, *t.amax);
  }
  announced_.push_back(std::move(header));
  return absl::OkStatus();
}

void Session::ReceiveLoop() {
  while (true) {
    BucketHeader header;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !failure_.ok() || !announced_.empty(); };
      SpinWhileRefitHot(mu_, absl::Condition(&ready), options_.deadline);
      if (!mu_.AwaitWithDeadline(absl::Condition(&ready), options_.deadline)) {
        FailLocked(absl::DeadlineExceededError("session deadline passed while waiting for buckets"));
        return;
      }
      if (stopping_ || !failure_.ok()) return;
      header = std::move(announced_.front());
      announced_.pop_front();
    }
    int slot = ring_.Acquire();
    if (slot < 0) return;
    absl::Time start = absl::Now();
    // The transport may lend its own copy of the bytes (CUDA IPC: the trainer's buffer on this GPU)
    // instead of receiving into the slot; the slot still bounds the buckets in flight.
    absl::StatusOr<transport::Receiver::Message> got =
        receiver_.ReceiveOrLend(Tag(options_.id, header.seq), ring_.data(slot), header.nbytes, options_.deadline);
    TracePoint("daemon.bucket_received", header.seq);
    absl::Duration took = absl::Now() - start;
    absl::Status status = got.status();
    Received item{std::move(header), slot, got.ok() ? got->data : ring_.data(slot), got.ok() ? got->loan : 0};
    if (status.ok() && got->bytes != item.header.nbytes) {
      status = absl::DataLossError(
          absl::StrCat("bucket ", item.header.seq, ": received ", got->bytes, " bytes, announced ", item.header.nbytes));
    }
    // A transport that checks integrity itself announces no checksum (its slots may be on the
    // device, where reading them back would cost a device-to-host copy). Otherwise the converter
    // checks it (VerifyChecksum) while this loop receives the next bucket.
    item.verify = status.ok() && !receiver_.ChecksIntegrity();
    if (status.ok()) status = REFIT_FAILPOINT(options_.failpoints, failpoints::kAfterReceive);
    absl::ReleasableMutexLock lock(&mu_);
    receive_time_ += took;
    if (!status.ok()) {
      Done(item);
      if (status.code() == absl::StatusCode::kDeadlineExceeded) {
        status = absl::DeadlineExceededError(absl::StrCat("session deadline passed receiving bucket ", item.header.seq));
      } else if (status.code() != absl::StatusCode::kDataLoss) {
        status = absl::Status(status.code(), absl::StrCat("receiving bucket ", item.header.seq, ": ", status.message()));
      }
      FailLocked(status);
      return;
    }
    if (stopping_ || !failure_.ok()) {
      Done(item);  // the converter may have drained and left already
      return;
    }
    const uint64_t bytes = item.header.nbytes;
    bytes_in_ += bytes;
    received_.push_back(std::move(item));
    lock.Release();
    if (options_.on_received) options_.on_received(bytes);
  }
}

void Session::ConvertLoop() {
  // One bucket may be in flight: its conversions issued, not yet complete. The next bucket's are
  // issued behind them when it arrives first; otherwise the bucket in flight completes first (its
  // slot may be what the next bucket waits for).
  std::optional<Converting> flight;
  while (true) {
    std::optional<Received> next;
    bool leave = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !failure_.ok() || (!received_.empty() && !awaiting_placement_);
      };
      if (!flight) {
        SpinWhileRefitHot(mu_, absl::Condition(&ready));
        mu_.Await(absl::Condition(&ready));
      } else {
        // Looks for the next bucket while the GPU works on this one.
        while (!ready() && !converter_.BucketDone(flight->ticket)) {
          mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Microseconds(20));
        }
      }
      if (stopping_ || !failure_.ok()) {
        leave = true;
      } else if (!received_.empty() && !awaiting_placement_) {
        next = std::move(received_.front());
        received_.pop_front();
      }
    }
    if (leave) {
      if (flight) {
        (void)converter_.Sync();
        Release(*flight);
      }
      absl::MutexLock lock(&mu_);
      for (const Received& r : received_) Done(r);
      received_.clear();
      return;
    }
    std::optional<Converting> issued;
    if (next) {
      issued.emplace();
      issued->item = std::move(*next);
      absl::Time start = absl::Now();
      Convert(*issued);
      TracePoint("daemon.bucket_issued", issued->item.header.seq);
      issued->took = absl::Now() - start;
      {
        absl::MutexLock lock(&mu_);
        ++issued_;
      }
      if (!failure().ok()) {
        // Convert synchronized the converter: nothing reads either bucket any more. What the
        // failed bucket staged is still reported.
        if (flight) Release(*flight);
        Release(*issued);
        if (options_.on_converted) options_.on_converted(bucket_report_, staging_->bytes());
        flight.reset();
        continue;  // leaves
      }
    }
    if (flight && !Complete(*flight)) {
      if (issued) {
        (void)converter_.Sync();
        Release(*issued);
      }
      return;
    }
    flight = std::move(issued);
  }
}

bool Session::Complete(Converting& c) {
  absl::Time start = absl::Now();
  for (const auto& [name, error] : converter_.WaitBucket(c.ticket)) ledger_.Fail(name, error);
  TracePoint("daemon.bucket_converted", c.item.header.seq);
  c.took += absl::Now() - start;
  Release(c);
  if (options_.on_converted) options_.on_converted(c.report, staging_->bytes());
  absl::Status fp = REFIT_FAILPOINT(options_.failpoints, failpoints::kAfterConvert);
  absl::MutexLock lock(&mu_);
  convert_time_ += c.took;
  if (!fp.ok()) {
    FailLocked(fp);
    return false;
  }
  ++converted_;
  return true;
}

void Session::Release(Converting& c) {
  RetireGroups(c.retiring);
  c.assembled.clear();
  Done(c.item);
}

DeviceOps* Session::device_ops() const {
  return staging_->kind() == storage::MemoryKind::kDevice ? converter_.device_ops() : nullptr;
}

absl::Status Session::Validate() const {
  std::vector<std::string> incomplete = slices_.Incomplete();
  {
    // A checkpoint tensor assembled from Megatron-core tensors names the one it came from.
    absl::MutexLock lock(&mu_);
    for (std::string& line : incomplete) {
      const size_t open = line.find('\''), close = line.find('\'', open + 1);
      if (open == std::string::npos || close == std::string::npos) continue;
      auto it = source_of_.find(line.substr(open + 1, close - open - 1));
      if (it != source_of_.end()) line.insert(close + 1, absl::StrCat(" (from Megatron-core '", it->second, "')"));
    }
  }
  absl::Status ledger = ledger_.Check(options_.partial);
  if (incomplete.empty()) return ledger;
  std::string msg = absl::StrCat("refit refused: ", incomplete.size(), " sliced tensor",
                                 incomplete.size() == 1 ? "" : "s", " incomplete: ", absl::StrJoin(incomplete, "; "));
  if (!ledger.ok()) absl::StrAppend(&msg, "; ", ledger.message());
  return absl::FailedPreconditionError(msg);
}

bool Session::sealed() const {
  absl::MutexLock lock(&mu_);
  return sealed_;
}

absl::Status Session::WaitIssued() const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !failure_.ok() || issued_ == announced_count_; };
  SpinWhileRefitHot(mu_, absl::Condition(&done));
  mu_.Await(absl::Condition(&done));
  return failure_;
}

absl::Status Session::Finish() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !failure_.ok() || converted_ == announced_count_; };
  SpinWhileRefitHot(mu_, absl::Condition(&done));
  mu_.Await(absl::Condition(&done));
  if (failure_.ok()) stopping_ = sealed_ = true;  // no more buckets; the deadline no longer applies
  return failure_;
}

std::unique_ptr<Staging> Session::TakeStaging() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  return std::move(staging_);
}

RefitReport Session::Report() const {
  absl::MutexLock lock(&mu_);
  RefitReport r;
  r.session_id = options_.id;
  r.bytes_in = bytes_in_;
  r.bytes_out = bytes_out_;
  r.bytes_out_by_format = bytes_out_by_format_;
  r.buckets = converted_;
  r.tensors = static_cast<uint32_t>(ledger_.tensors());
  r.times.receive_ms = absl::ToDoubleMilliseconds(receive_time_);
  r.times.convert_ms = absl::ToDoubleMilliseconds(convert_time_);
  r.fused_held_peak_bytes = peak_held_bytes_.load();
  r.bytes_in_place = staging_->in_place_bytes();
  return r;
}

}  // namespace refit
