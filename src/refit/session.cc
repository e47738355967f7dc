#include "refit/session.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "common/hot_wait.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "formats/format.h"
#include "formats/format_info.h"
#include "refit/convert.h"
#include "refit/megatron_source.h"

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
    if (status.ok() && !receiver_.ChecksIntegrity()) {
      // A transport that checks integrity itself announces no checksum (its slots may be on the
      // device, where reading them back would cost a device-to-host copy).
      uint64_t sum = Checksum64(item.data, item.header.nbytes);
      if (sum != item.header.checksum) {
        status = absl::DataLossError(absl::StrCat("bucket ", item.header.seq, ": checksum ", ChecksumHex(sum),
                                                  " does not match the announced ", ChecksumHex(item.header.checksum)));
      }
    }
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

namespace {

// Where output `o`'s parts among `distinct` lie when the output is split by rows over the engine
// ranks: every part present (one per shard index), and nothing before the shard dim, so that
// part k is bytes [k * part, (k + 1) * part) of the whole output. Their indices into `distinct`
// in shard order; empty otherwise.
absl::InlinedVector<size_t, 8> RowParts(const TensorPlan& plan, std::span<const Target* const> distinct, size_t o) {
  absl::InlinedVector<size_t, 8> order;
  if (!plan.shard_dim.has_value() || plan.shard_parts <= 1) return {};
  const size_t d = static_cast<size_t>(*plan.shard_dim);
  order.assign(static_cast<size_t>(plan.shard_parts), distinct.size());
  size_t found = 0;
  for (size_t i = 0; i < distinct.size(); ++i) {
    const Target& t = *distinct[i];
    if (t.output != o) continue;
    if (t.full_shape.size() <= d || t.shard_index < 0 || t.shard_index >= plan.shard_parts) return {};
    for (size_t k = 0; k < d; ++k) {
      if (t.full_shape[k] != 1) return {};
    }
    size_t& slot = order[static_cast<size_t>(t.shard_index)];
    if (slot != distinct.size()) return {};
    slot = i;
    ++found;
  }
  if (found != order.size()) return {};
  return order;
}

// Whether the parts `order` (RowParts) lie back to back in `outs`, `whole` bytes in all.
bool InOneRun(const absl::InlinedVector<size_t, 8>& order, std::span<const formats::MutableBytes> outs,
              uint64_t whole) {
  if (order.empty()) return false;
  const uint8_t* next = static_cast<const uint8_t*>(outs[order.front()].data);
  if (next == nullptr) return false;
  const uint8_t* const start = next;
  for (size_t i : order) {
    if (outs[i].data != next) return false;
    next += outs[i].bytes;
  }
  return next == start + whole;
}

// Rows of the input each rank's parts take when every output of `plan` is split by rows over the
// ranks, each rank's part of each output its own target (nothing shared), and converting a
// rank's input rows alone gives exactly that rank's parts (a row-local conversion without a
// tensor-wide amax, the parts on whole blocks): then each rank's rows convert as a tensor of
// their own. nullopt where any of that does not hold.
std::optional<int64_t> RowsPerRank(const TensorPlan& plan, const TensorDesc& desc,
                                   std::span<const Target* const> distinct) {
  if (plan.shard_dim != 0 || plan.shard_parts <= 1 || plan.transpose || desc.shape.empty()) return std::nullopt;
  if (distinct.size() != plan.targets.size() || desc.shape[0] % plan.shard_parts != 0) return std::nullopt;
  const bool quantize = plan.kind == ConvertKind::kQuantize;
  if (quantize && formats::NeedsGlobalAmax(plan.format)) return std::nullopt;
  const int64_t rows = desc.shape[0] / plan.shard_parts;
  Shape part = desc.shape;
  part[0] = rows;
  std::vector<formats::OutputSpec> planned;
  if (quantize) {
    if (rows % formats::BlockAlong(plan.format, 0, desc.shape.size()) != 0) return std::nullopt;
    absl::StatusOr<std::vector<formats::OutputSpec>> o = formats::PlanOutputs(plan.format, desc.dtype, part);
    if (!o.ok()) return std::nullopt;
    planned = *std::move(o);
  }
  for (const Target& t : plan.targets) {
    if (t.shard_index < 0 || t.shard_index >= plan.shard_parts || t.spec.shape.empty() ||
        t.full_shape.size() != t.spec.shape.size() || t.spec.shape[0] * plan.shard_parts != t.full_shape[0]) {
      return std::nullopt;  // an output whose rows do not split with the input's (a whole-tensor scale)
    }
    if (quantize ? (t.output >= planned.size() || planned[t.output].shape != t.spec.shape ||
                    planned[t.output].bytes != t.spec.bytes)
                 : (t.output != 0 || t.spec.shape != part)) {
      return std::nullopt;
    }
  }
  return rows;
}

}  // namespace

absl::Status Session::ConvertRowsPerRank(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                         const TensorPlan& plan, int64_t rows, std::span<const Target* const> distinct,
                                         std::span<const formats::MutableBytes> outs) {
  const uint64_t part_bytes = desc.nbytes / static_cast<uint64_t>(plan.shard_parts);
  TensorDesc part = desc;
  part.shape[0] = rows;
  part.nbytes = part_bytes;
  absl::InlinedVector<formats::MutableBytes, 4> rank_outs;
  for (int64_t r = 0; r < plan.shard_parts; ++r) {
    rank_outs.assign(formats::kMaxOutputs, formats::MutableBytes{nullptr, 0});
    size_t n = 0;
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (distinct[i]->shard_index != r) continue;
      rank_outs[distinct[i]->output] = outs[i];
      n = std::max(n, distinct[i]->output + 1);
    }
    rank_outs.resize(n);
    REFIT_RETURN_IF_ERROR(converter_.Convert(plan, part, src + static_cast<uint64_t>(r) * part_bytes, src_kind,
                                             rank_outs, planner_.spec().options));
  }
  return absl::OkStatus();
}

absl::Status Session::AllocateRuns(const TensorPlan& plan, std::span<const Target* const> distinct,
                                   std::span<formats::MutableBytes> outs) {
  size_t n_outputs = 0;
  for (const Target* t : distinct) n_outputs = std::max(n_outputs, t->output + 1);
  for (size_t o = 0; o < n_outputs; ++o) {
    const absl::InlinedVector<size_t, 8> order = RowParts(plan, distinct, o);
    if (order.empty()) continue;
    absl::InlinedVector<Staging::RunPart, 8> parts;
    for (size_t i : order) {
      const Target& t = *distinct[i];
      parts.push_back({&t.key, t.spec.dtype, &t.spec.shape, t.spec.bytes});
    }
    absl::StatusOr<std::vector<uint8_t*>> run = staging_->AllocateRun(parts);
    if (run.status().code() == absl::StatusCode::kFailedPrecondition) continue;  // placed: one by one
    if (!run.ok()) return run.status();
    for (size_t k = 0; k < order.size(); ++k) outs[order[k]] = {(*run)[k], parts[k].nbytes};
  }
  return absl::OkStatus();
}

void Session::CountFormatBytes(const TensorPlan& plan, uint64_t bytes) {
  const bool copy = plan.kind == ConvertKind::kCopy;
  auto same = [&](const FormatBytes& f) { return f.copy == copy && (copy || f.format == plan.format); };
  auto it = std::find_if(bucket_out_by_format_.begin(), bucket_out_by_format_.end(), same);
  if (it == bucket_out_by_format_.end()) {
    bucket_out_by_format_.push_back({copy, plan.format, bytes});
  } else {
    it->bytes += bytes;
  }
}

absl::Status Session::StageOnRanks(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                   const TensorPlan& plan, std::optional<float> global_amax, const float* device_amax,
                                   std::optional<float> claim, std::span<const Target* const> distinct,
                                   std::span<const formats::MutableBytes> outs) {
  const bool sharded = plan.shard_dim.has_value() && plan.shard_parts > 1;
  // Rows split over the ranks whose parts lie apart (`direct`: each in its rank's memory; staged
  // parts lie in one run, converted whole below): each rank's rows convert as a tensor of their
  // own straight into its parts, with no whole output in scratch sliced out afterwards.
  if (!global_amax && device_amax == nullptr && !claim) {
    if (std::optional<int64_t> rows = RowsPerRank(plan, desc, distinct); rows.has_value()) {
      bool apart = false;
      for (size_t o = 0; o < formats::kMaxOutputs && !apart; ++o) {
        const absl::InlinedVector<size_t, 8> order = RowParts(plan, distinct, o);
        apart = !order.empty() && !InOneRun(order, outs, outs[order.front()].bytes * order.size());
      }
      if (apart) return ConvertRowsPerRank(desc, src, src_kind, plan, *rows, distinct, outs);
    }
  }
  // Several engine ranks: the tensor is converted whole once, then each rank's part (or the
  // one part they share) is staged: on the GPU by the device ops, else on the host.
  if (DeviceOps* ops = device_ops(); ops != nullptr) {
    absl::InlinedVector<formats::MutableBytes, 8> per_target(plan.targets.size(), formats::MutableBytes{nullptr, 0});
    for (size_t i = 0, d = 0; i < plan.targets.size() && d < distinct.size(); ++i) {
      if (&plan.targets[i] == distinct[d]) per_target[i] = outs[d++];
    }
    return ops->ConvertPlanned(plan, desc, src, src_kind, per_target, planner_.spec().options,
                               PlannedAmax{device_amax, device_amax == nullptr ? global_amax : std::nullopt, claim});
  }
  if (src_kind != storage::MemoryKind::kHost || staging_->kind() != storage::MemoryKind::kHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", desc.name, "': an engine of several ranks staged on the GPU needs a converter with device ops"));
  }
  // Whole outputs: straight into staging when the output's parts were staged as one run in row
  // order (AllocateRuns), else into host buffers sliced from below.
  std::vector<std::vector<uint8_t>> full;
  std::vector<formats::MutableBytes> full_outs;
  std::vector<bool> in_run(distinct.size(), false);
  for (const Target& t : plan.targets) {
    if (t.output < full.size()) continue;
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(t.spec.dtype, t.full_shape));
    full.emplace_back();
    const absl::InlinedVector<size_t, 8> order = RowParts(plan, distinct, t.output);
    if (InOneRun(order, outs, n)) {
      full_outs.push_back({outs[order.front()].data, n});
      for (size_t i : order) in_run[i] = true;
      continue;
    }
    full.back().resize(n);
    full_outs.push_back({full.back().data(), n});
  }
  const ConvertStep step{plan.kind, plan.format, plan.transpose};
  REFIT_RETURN_IF_ERROR(ConvertFull(step, formats::ConstTensor{desc.dtype, desc.shape, src}, planner_.spec().options,
                                    global_amax, full_outs, desc.name, claim));
  for (size_t i = 0; i < distinct.size(); ++i) {
    if (in_run[i]) continue;
    const Target& t = *distinct[i];
    ShardPart(full[t.output].data(), t.spec.dtype, t.full_shape, sharded ? plan.shard_dim : std::nullopt,
              sharded ? plan.shard_parts : 1, sharded ? t.shard_index : 0, static_cast<uint8_t*>(outs[i].data));
  }
  return absl::OkStatus();
}

absl::Status Session::Stage(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                            const TensorPlan& plan, std::optional<float> global_amax, uint64_t& out_bytes,
                            const float* device_amax, std::optional<float> claim) {
  const bool sharded = plan.shard_dim.has_value() && plan.shard_parts > 1;
  absl::InlinedVector<uint8_t*, 4> staged;
  absl::InlinedVector<formats::MutableBytes, 4> outs;
  uint64_t tensor_bytes = 0;
  const bool ranks = planner_.ranks() > 1;
  absl::InlinedVector<const Target*, 4> distinct;  // over engine ranks: one per staging key
  for (const Target& t : plan.targets) {
    if (ranks && std::any_of(distinct.begin(), distinct.end(), [&](const Target* d) { return d->key == t.key; })) {
      continue;  // a part every rank shares: staged once
    }
    distinct.push_back(&t);
  }
  if (ranks) {
    outs.assign(distinct.size(), formats::MutableBytes{nullptr, 0});
    REFIT_RETURN_IF_ERROR(AllocateRuns(plan, distinct, outs));
  }
  for (size_t i = 0; i < distinct.size(); ++i) {
    const Target& t = *distinct[i];
    if (!ranks || outs[i].data == nullptr) {
      REFIT_ASSIGN_OR_RETURN(uint8_t * buf, staging_->Allocate(t.key, t.spec.dtype, t.spec.shape, t.spec.bytes));
      if (ranks) {
        outs[i] = {buf, t.spec.bytes};
      } else {
        outs.push_back({buf, t.spec.bytes});
      }
    }
    staged.push_back(static_cast<uint8_t*>(outs[i].data));
    out_bytes += t.spec.bytes;
    tensor_bytes += t.spec.bytes;
  }
  CountFormatBytes(plan, tensor_bytes);
  if (ranks) return StageOnRanks(desc, src, src_kind, plan, global_amax, device_amax, claim, distinct, outs);
  if (!sharded && !plan.transpose && !global_amax && device_amax == nullptr) {
    // The common case: the converter (CPU, or GPU kernels) writes straight into staging.
    return converter_.Convert(plan, desc, src, src_kind, outs, planner_.spec().options);
  }
  if (DeviceOps* ops = device_ops(); ops != nullptr) {
    // Staging on the GPU: transpose, whole outputs and this rank's slice of each on the device,
    // from device or host payloads alike.
    return ops->ConvertPlanned(plan, desc, src, src_kind, outs, planner_.spec().options,
                               PlannedAmax{device_amax, device_amax == nullptr ? global_amax : std::nullopt, claim});
  }
  // Transposed, sharded or group-scaled tensors are converted whole on the host, then this
  // rank's part is staged.
  if (src_kind != storage::MemoryKind::kHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", desc.name, "' is transposed, sharded or group-scaled; such tensors need a host data plane"));
  }
  const ConvertStep step{plan.kind, plan.format, plan.transpose};
  const bool host_staging = staging_->kind() == storage::MemoryKind::kHost;
  std::vector<std::vector<uint8_t>> full;  // whole outputs, when this rank keeps a part or staging is on the GPU
  std::vector<formats::MutableBytes> host_outs;
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    const Target& t = plan.targets[i];
    if (!sharded && host_staging) {
      host_outs.push_back(outs[i]);
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(t.spec.dtype, sharded ? t.full_shape : t.spec.shape));
    full.emplace_back(n);
    host_outs.push_back({full.back().data(), n});
  }
  REFIT_RETURN_IF_ERROR(ConvertFull(step, formats::ConstTensor{desc.dtype, desc.shape, src}, planner_.spec().options,
                                    global_amax, host_outs, desc.name, claim));
  if (full.empty()) return absl::OkStatus();
  std::vector<uint8_t> part;
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    const Target& t = plan.targets[i];
    const uint8_t* bytes = full[i].data();
    if (sharded) {
      part.resize(t.spec.bytes);
      ShardPart(full[i].data(), t.spec.dtype, t.full_shape, plan.shard_dim, plan.shard_parts, plan.shard_index,
                host_staging ? staged[i] : part.data());
      if (host_staging) continue;
      bytes = part.data();
    }
    REFIT_RETURN_IF_ERROR(staging_->pool().memory().CopyFromHost(staged[i], bytes, t.spec.bytes));
  }
  return absl::OkStatus();
}

std::optional<std::pair<float, float>> Session::SuppliedAmax(const TensorDesc& desc, const TensorPlan& plan) {
  if (plan.kind != ConvertKind::kQuantize || !formats::NeedsGlobalAmax(plan.format)) return std::nullopt;
  // Device payloads convert with a supplied amax only through the device ops.
  if (device_ops() == nullptr && ring_.kind() != storage::MemoryKind::kHost) return std::nullopt;
  if (plan.amax_group.empty()) {
    if (desc.amax) return std::make_pair(*desc.amax, *desc.amax);
    absl::MutexLock lock(&mu_);
    auto it = supplied_amax_.find(desc.name);
    if (it == supplied_amax_.end()) return std::nullopt;
    return std::make_pair(it->second, it->second);
  }
  if (auto g = supplied_groups_.find(plan.amax_group_key); g != supplied_groups_.end()) {
    auto c = g->second.claims.find(desc.name);
    if (c == g->second.claims.end()) return std::nullopt;  // not a member the group was fixed with
    return std::make_pair(g->second.amax, c->second);
  }
  // Members already held for the two-pass path stay on it.
  if (pending_.count(plan.amax_group_key) != 0 || device_pending_.count(plan.amax_group_key) != 0) return std::nullopt;
  SuppliedGroup group;
  {
    absl::MutexLock lock(&mu_);
    if (desc.amax) {
      auto [it, fresh] = supplied_amax_.try_emplace(desc.name, *desc.amax);
      if (!fresh) it->second = std::max(it->second, *desc.amax);
    }
    for (const std::string& member : plan.amax_group) {
      auto it = supplied_amax_.find(member);
      if (it == supplied_amax_.end()) return std::nullopt;
      group.claims.emplace(member, it->second);
      group.amax = std::max(group.amax, it->second);
    }
  }
  const float a = group.amax, claim = group.claims.at(desc.name);
  supplied_groups_.emplace(plan.amax_group_key, std::move(group));
  return std::make_pair(a, claim);
}

std::optional<float> Session::ClaimOf(const TensorDesc& desc) {
  if (desc.amax) return desc.amax;
  absl::MutexLock lock(&mu_);
  auto it = supplied_amax_.find(desc.name);
  return it == supplied_amax_.end() ? std::nullopt : std::optional<float>(it->second);
}

absl::Status Session::Defer(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                            std::shared_ptr<const TensorPlan> shared_plan, uint64_t& out_bytes) {
  const TensorPlan& plan = *shared_plan;
  if (DeviceOps* ops = device_ops(); ops != nullptr) return DeferOnDevice(*ops, desc, src, src_kind, std::move(shared_plan), out_bytes);
  if (src_kind != storage::MemoryKind::kHost) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", desc.name, "' shares a group amax; such tensors need a host data plane"));
  }
  PendingMember member{desc, std::move(shared_plan), std::nullopt, std::vector<uint8_t>(src, src + desc.nbytes),
                       ClaimOf(desc)};
  absl::StatusOr<float> amax =
      TensorAmax(formats::ConstTensor{desc.dtype, desc.shape, member.input.data()}, planner_.spec().options, desc.name);
  if (amax.ok()) {
    // A supplied amax that covers the member defines the group's amax as on the single-pass path;
    // one below it is refused by the member's encode (Stage checks the claim).
    member.amax = member.claim && *member.claim >= *amax ? *member.claim : *amax;
  } else {
    ledger_.Fail(desc.name, amax.status());
  }
  std::vector<PendingMember>& group = pending_[plan.amax_group_key];
  group.push_back(std::move(member));
  if (group.size() < plan.amax_group.size()) return absl::OkStatus();
  // Every member is here: A = max over the group, then encode each member against it.
  float a = 0.0f;
  bool all_ok = true;
  for (const PendingMember& m : group) {
    if (!m.amax) {
      all_ok = false;
    } else {
      a = std::max(a, *m.amax);
    }
  }
  absl::Status result;
  for (const PendingMember& m : group) {
    if (!all_ok) break;
    absl::Status st = Stage(m.desc, m.input.data(), storage::MemoryKind::kHost, *m.plan, a, out_bytes, nullptr, m.claim);
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      result = st;
    } else if (!st.ok()) {
      ledger_.Fail(m.desc.name, st);
    }
  }
  pending_.erase(plan.amax_group_key);  // `plan` stays valid: the caller holds it too
  return result;
}

absl::StatusOr<float*> Session::TakeGroupAmax() {
  constexpr uint64_t kFloatsPerBlock = 4096;
  if (free_amax_.empty()) {
    // Blocks of device floats, kept by the pool across sessions (16 KiB each).
    REFIT_ASSIGN_OR_RETURN(uint8_t* block, staging_->pool().Get(absl::StrCat("group-amax:", amax_blocks_),
                                                              kFloatsPerBlock * sizeof(float)));
    ++amax_blocks_;
    auto* f = reinterpret_cast<float*>(block);
    for (uint64_t i = kFloatsPerBlock; i > 0; --i) free_amax_.push_back(f + i - 1);
  }
  float* a = free_amax_.back();
  free_amax_.pop_back();
  return a;
}

absl::Status Session::DeferOnDevice(DeviceOps& ops, const TensorDesc& desc, const uint8_t* src,
                                    storage::MemoryKind src_kind, std::shared_ptr<const TensorPlan> shared_plan,
                                    uint64_t& out_bytes) {
  const TensorPlan& plan = *shared_plan;
  const formats::QuantizeOptions& options = planner_.spec().options;
  auto [it, fresh] = device_pending_.try_emplace(plan.amax_group_key);
  DeviceGroup& group = it->second;
  if (fresh) {
    absl::StatusOr<float*> amax = TakeGroupAmax();
    if (!amax.ok()) {
      device_pending_.erase(it);
      return amax.status();
    }
    group.amax = *amax;
    if (absl::Status st = ops.ResetAmax(group.amax); !st.ok()) group.ok = false;
  }
  // Each member raises the group's device amax as it arrives; its bytes stay where they are (the
  // ring slot) until the bucket ends, and are copied out only if the group is still incomplete then.
  absl::Status st = ops.AccumulateAmax(desc, src, src_kind, options, group.amax);
  if (!st.ok()) {
    ledger_.Fail(desc.name, st);
    group.ok = false;
  }
  group.members.push_back({desc, std::move(shared_plan), src, src_kind, nullptr, 0, ClaimOf(desc)});
  if (group.members.size() < plan.amax_group.size()) return absl::OkStatus();
  absl::Status result;
  for (const DeviceMember& m : group.members) {
    if (!group.ok) break;
    absl::Status staged = Stage(m.desc, m.src, m.src_kind, *m.plan, std::nullopt, out_bytes, group.amax, m.claim);
    if (staged.code() == absl::StatusCode::kResourceExhausted) {
      result = staged;
    } else if (!staged.ok()) {
      ledger_.Fail(m.desc.name, staged);
    }
  }
  // Its amax float and held copies stay until the bucket's Sync (kernels may still read them).
  retiring_.push_back(std::move(group));
  device_pending_.erase(it);
  return result;
}

absl::Status Session::HoldPendingMembers() {
  DeviceOps* ops = device_ops();
  if (ops == nullptr) return absl::OkStatus();
  for (auto& [key, group] : device_pending_) {
    for (DeviceMember& m : group.members) {
      if (m.held != nullptr) continue;
      // The group is incomplete at the end of the bucket: the member's bytes leave the slot for
      // a device buffer of their own, counted against the staging limit until the group converts.
      REFIT_RETURN_IF_ERROR(staging_->Reserve(m.desc.nbytes, m.desc.name));
      absl::StatusOr<std::shared_ptr<uint8_t>> buf = staging_->pool().memory().Allocate(std::max<uint64_t>(m.desc.nbytes, 1));
      if (!buf.ok()) {
        staging_->Unreserve(m.desc.nbytes);
        return absl::ResourceExhaustedError(
            absl::StrCat("tensor '", m.desc.name, "': holding a fused member on the device: ", buf.status().message()));
      }
      REFIT_RETURN_IF_ERROR(ops->Copy(buf->get(), m.src, m.desc.nbytes, m.src_kind));
      m.held = std::move(*buf);
      m.reserved = m.desc.nbytes;
      m.src = m.held.get();
      m.src_kind = storage::MemoryKind::kDevice;
      held_bytes_ += m.desc.nbytes;
      if (held_bytes_ > peak_held_bytes_.load()) peak_held_bytes_.store(held_bytes_);
    }
  }
  return absl::OkStatus();
}

void Session::RetireGroups(std::vector<DeviceGroup>& groups) {
  for (DeviceGroup& g : groups) {
    for (const DeviceMember& m : g.members) {
      if (m.reserved == 0) continue;
      staging_->Unreserve(m.reserved);
      held_bytes_ -= m.reserved;
    }
    if (g.amax != nullptr) free_amax_.push_back(g.amax);
  }
  groups.clear();
}

// One bucket's conversion, its state across the bucket's tensors (Convert and its steps).
struct Session::BucketWork {
  BucketWork(Converting& converting, const uint8_t* bytes) : c(converting), data(bytes) {}
  Converting& c;
  const uint8_t* data;  // the bucket's bytes (its slot or loan)
  uint64_t out_bytes = 0;
  // Wire format checkpoint: converted tensors' outputs in this bucket, staged after the loop.
  const WireTable* wire = nullptr;
  std::vector<std::pair<const WireEntry*, std::vector<WirePart>>> converted;
  absl::flat_hash_map<const WireEntry*, size_t> converted_index;
  // Tensors whose outputs arrive as slices here: their NVFP4 global scale (a scalar) comes whole
  // from every rank alongside its slices.
  absl::flat_hash_set<const WireEntry*> sliced_here;
  std::vector<SourcePiece> pieces;
  bool failed = false;  // the session failed: nothing more of the bucket is converted
};

void Session::AddFormatBytesLocked() {
  for (const FormatBytes& f : bucket_out_by_format_) {
    const std::string name = f.copy ? "passthrough" : std::string(formats::FormatName(f.format));
    bytes_out_by_format_[name] += f.bytes;
    if (options_.on_converted) bucket_report_[name] += f.bytes;
  }
  bucket_out_by_format_.clear();
}

void Session::FailBucket(BucketWork& w, absl::Status status) {
  // Once nothing of the bucket is read any more, what it staged is counted and the session fails.
  converter_.Sync();
  RetireGroups(retiring_);
  absl::MutexLock lock(&mu_);
  AddFormatBytesLocked();
  FailLocked(std::move(status));
  w.failed = true;
}

bool Session::SliceFailed(BucketWork& w, const absl::StatusOr<std::optional<SliceAssembler::Whole>>& added,
                          const std::string& name) {
  if (added.ok()) return false;
  if (added.status().code() == absl::StatusCode::kResourceExhausted) {
    FailBucket(w, added.status());
    return true;
  }
  ledger_.Fail(name, added.status());
  return false;
}

void Session::Convert(Converting& c) {
  const BucketHeader& header = c.item.header;
  BucketWork w(c, c.item.data);
  // Per-format bytes are counted as tensors are staged (also when the bucket then fails), and
  // reported to on_converted once the lock is released (the caller, ConvertLoop).
  bucket_out_by_format_.clear();
  bucket_report_.clear();
  if (options_.wire != nullptr && !options_.wire->entries().empty()) w.wire = options_.wire.get();
  if (w.wire != nullptr) {
    for (const TensorDesc& pushed : header.tensors) {
      size_t out = 0;
      const WireEntry* e = pushed.slice.present() ? w.wire->FindOutput(pushed.name, &out) : nullptr;
      if (e != nullptr) w.sliced_here.insert(e);
    }
  }
  for (const TensorDesc& pushed : header.tensors) {
    if (w.wire != nullptr && ConvertWireTensor(w, pushed, header.seq)) {
      if (w.failed) return;
      continue;
    }
    ConvertPushed(w, pushed);
    if (w.failed) return;
  }
  for (const auto& [entry, parts] : w.converted) {
    absl::Status status = StageConverted(*entry, parts, w.out_bytes);
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      FailBucket(w, status);
      return;
    }
  }
  // Fused members whose group is still incomplete leave the slot before it is released.
  absl::Status held = HoldPendingMembers();
  if (!held.ok()) {
    FailBucket(w, held);
    return;
  }
  // The slot is released once the bucket is complete (Complete): the conversions reading it and
  // the groups converted here are the bucket's from now on.
  c.ticket = converter_.EndBucket();
  c.retiring = std::move(retiring_);
  retiring_.clear();
  absl::MutexLock lock(&mu_);
  AddFormatBytesLocked();
  c.report = std::move(bucket_report_);
  bucket_report_.clear();
  bytes_out_ += w.out_bytes;
}

bool Session::ConvertWireTensor(BucketWork& w, const TensorDesc& pushed, uint32_t seq) {
  const WireTable& wire = *w.wire;
  size_t out = 0;
  if (const WireEntry* e = wire.FindOutput(pushed.name, &out)) {
    const bool slice_scale =
        !pushed.slice.present() && static_cast<int>(out) == e->global_scale && w.sliced_here.contains(e);
    if (pushed.slice.present() || slice_scale) {
      AssembleWireSlice(w, *e, out, pushed, slice_scale);
      return true;
    }
    auto [it, fresh] = w.converted_index.try_emplace(e, w.converted.size());
    if (fresh) w.converted.push_back({e, std::vector<WirePart>(e->outputs.size())});
    WirePart& part = w.converted[it->second].second[out];
    if (part.desc != nullptr) {
      ledger_.Fail(e->input.name,
                   absl::InvalidArgumentError(absl::StrCat("tensor '", e->input.name, "': wire format checkpoint: '",
                                                           pushed.name, "' arrived twice in bucket ", seq)));
    }
    part = {&pushed, w.data + pushed.offset};
    return true;
  }
  if (const WireEntry* e = wire.FindTensor(pushed.name)) {
    // Sent as declared although the plan has the trainer convert it (e.g. BF16 for mxfp4).
    ledger_.Fail(e->input.name,
                 absl::InvalidArgumentError(absl::StrCat(
                     "tensor '", e->input.name, "': wire format checkpoint: arrived as ", DTypeName(pushed.dtype),
                     ShapeString(pushed.shape), "; the session's plan has the trainer convert it to ",
                     formats::FormatName(e->plan->format), " and send its outputs")));
    return true;
  }
  return false;
}

void Session::AssembleWireSlice(BucketWork& w, const WireEntry& e, size_t out, const TensorDesc& pushed,
                                bool slice_scale) {
  // A slice of an output (a block-aligned slice converted on its own): assembled first; the
  // tensor stages once every output is whole.
  absl::Status st = CheckWireOutput(e, out, pushed);
  absl::StatusOr<std::optional<SliceAssembler::Whole>> added =
      !st.ok()      ? absl::StatusOr<std::optional<SliceAssembler::Whole>>(st)
      : slice_scale ? SliceScale(e, pushed, w.data + pushed.offset)
                    : slices_.Add(pushed, w.data + pushed.offset);
  if (SliceFailed(w, added, e.input.name)) return;
  if (!added.ok() || !added->has_value()) return;
  WireAssembly& a = wire_assembly_[&e];
  if (a.data.empty()) {
    a.descs.resize(e.outputs.size());
    a.data.resize(e.outputs.size());
  }
  a.descs[out] = std::move((*added)->desc);
  a.data[out] = std::move((*added)->data);
  if (++a.whole < e.outputs.size()) return;
  std::vector<WirePart> parts;
  for (size_t i = 0; i < a.descs.size(); ++i) parts.push_back({&a.descs[i], a.data[i].get()});
  absl::Status staged = StageConverted(e, parts, w.out_bytes);
  if (staged.code() == absl::StatusCode::kResourceExhausted) {
    FailBucket(w, staged);
    return;
  }
  // The assembled outputs stay until the bucket's conversions are done with them.
  for (std::shared_ptr<uint8_t>& d : a.data) w.c.assembled.push_back(std::move(d));
  wire_assembly_.erase(&e);
}

void Session::ConvertPushed(BucketWork& w, const TensorDesc& pushed) {
  // A Megatron-core tensor (spec `source`) is the checkpoint tensors' pieces it holds.
  std::vector<SourcePiece>& pieces = w.pieces;
  pieces.clear();
  std::optional<std::vector<SourcePiece>> mapped;
  if (const std::optional<spec::MegatronSource>& source = planner_.spec().source) {
    absl::StatusOr<std::optional<std::vector<SourcePiece>>> m = MapMegatron(*source, pushed);
    if (!m.ok()) {
      ledger_.Fail(pushed.name, m.status());
      return;
    }
    mapped = std::move(*m);
  }
  if (mapped) {
    pieces = std::move(*mapped);
    absl::MutexLock lock(&mu_);
    for (const SourcePiece& p : pieces) {
      if (p.desc.slice.present()) source_of_.emplace(p.desc.name, pushed.name);
    }
  } else {
    pieces.push_back(SourcePiece{pushed, 0});
  }
  std::vector<std::shared_ptr<uint8_t>>& assembled = w.c.assembled;  // until converted
  for (SourcePiece& piece : pieces) {
    // A piece of a Megatron-core tensor: the pushed tensor's amax bounds each piece's.
    if (!piece.desc.amax) piece.desc.amax = pushed.amax;
    const TensorDesc& arrived = piece.desc;
    const uint8_t* src = w.data + pushed.offset + piece.src_offset;
    if (piece.reorder != Reorder::kNone) {
      // A rearranged piece (gpt-oss experts into the stacked checkpoint tensor): host bytes.
      if (ring_.kind() != storage::MemoryKind::kHost) {
        ledger_.Fail(arrived.name, absl::FailedPreconditionError(
                                       absl::StrCat("tensor '", pushed.name, "': its checkpoint layout '", arrived.name,
                                                    "' is a rearrangement of it, done in host staging only")));
        continue;
      }
      std::shared_ptr<uint8_t> buf(new uint8_t[std::max<uint64_t>(arrived.nbytes, 1)],
                                   std::default_delete<uint8_t[]>());
      ReorderPiece(piece, src, buf.get());
      assembled.push_back(std::move(buf));
      src = assembled.back().get();
    }
    if (!arrived.slice.present()) {
      StageArrived(w, arrived, src);
      if (w.failed) return;
      continue;
    }
    // A slice: assembled first; the tensor converts once its slices tile it.
    absl::StatusOr<std::optional<SliceAssembler::Whole>> added = slices_.Add(arrived, src);
    if (SliceFailed(w, added, arrived.name)) return;
    if (!added.ok() || !added->has_value()) continue;
    const TensorDesc whole = std::move((*added)->desc);
    assembled.push_back(std::move((*added)->data));
    StageArrived(w, whole, assembled.back().get());
    if (w.failed) return;
  }
}

void Session::StageArrived(BucketWork& w, const TensorDesc& desc, const uint8_t* src) {
  absl::StatusOr<std::shared_ptr<const TensorPlan>> plan = ledger_.Arrive(desc);
  if (!plan.ok()) return;  // recorded by the ledger; refused at commit
  absl::Status status;
  if (std::optional<std::pair<float, float>> supplied = SuppliedAmax(desc, **plan)) {
    // Single pass: encoded against the supplied amax, checked against the tensor's max|x|.
    status = Stage(desc, src, ring_.kind(), **plan, supplied->first, w.out_bytes, nullptr, supplied->second);
  } else if ((*plan)->amax_group.empty()) {
    status = Stage(desc, src, ring_.kind(), **plan, std::nullopt, w.out_bytes);
  } else {
    status = Defer(desc, src, ring_.kind(), *plan, w.out_bytes);
  }
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    std::string msg(status.message());
    FailBucket(w, absl::ResourceExhaustedError(msg.find(desc.name) == std::string::npos
                                                   ? absl::StrCat("tensor '", desc.name, "': ", msg)
                                                   : msg));
    return;
  }
  if (!status.ok()) ledger_.Fail(desc.name, status);
}

absl::Status Session::StageConverted(const WireEntry& entry, const std::vector<WirePart>& parts, uint64_t& out_bytes) {
  const std::string& name = entry.input.name;
  std::vector<std::string> absent;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].desc == nullptr) {
      absent.push_back(absl::StrCat("'", name, entry.outputs[i].suffix, "'"));
    } else if (absl::Status st = CheckWireOutput(entry, i, *parts[i].desc); !st.ok()) {
      ledger_.Fail(name, st);  // e.g. the tensor sent as declared (BF16) instead of converted
      return absl::OkStatus();
    }
  }
  if (!absent.empty()) {
    ledger_.Fail(name, absl::InvalidArgumentError(absl::StrCat(
                           "tensor '", name, "': wire format checkpoint: its bucket lacks ", absl::StrJoin(absent, ", "),
                           " (a converted tensor's outputs travel together in one bucket)")));
    return absl::OkStatus();
  }
  const bool check_scales = planner_.spec().options.nonfinite == formats::NonfinitePolicy::kReject;
  std::vector<uint8_t> host;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorDesc& part = *parts[i].desc;
    absl::Status st;
    if (check_scales && entry.is_scale[i]) {
      const uint8_t* bytes = parts[i].src;
      if (ring_.kind() != storage::MemoryKind::kHost) {
        host.resize(part.nbytes);
        st = ring_.memory().CopyToHost(host.data(), bytes, part.nbytes);
        bytes = host.data();
      }
      if (st.ok()) st = CheckWireScales(entry, i, bytes, part.nbytes);
    }
    if (!st.ok()) {
      ledger_.Fail(name, st);
      return absl::OkStatus();
    }
  }
  if (entry.global_scale >= 0) {
    const WirePart& part = parts[static_cast<size_t>(entry.global_scale)];
    float scale_2 = 0.0f;
    absl::Status st = part.desc->nbytes == sizeof(float) ? ring_.memory().CopyToHost(&scale_2, part.src, sizeof(float))
                                                         : absl::InternalError("global scale is not one F32");
    if (st.ok()) st = CheckGlobalScale(entry, scale_2);
    if (!st.ok()) {
      ledger_.Fail(name, st);
      return absl::OkStatus();
    }
  }
  absl::StatusOr<std::shared_ptr<const TensorPlan>> plan = ledger_.Arrive(entry.input);
  if (!plan.ok()) return absl::OkStatus();  // recorded by the ledger; refused at commit
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::Status st = Stage(*parts[i].desc, parts[i].src, ring_.kind(), *entry.copies[i], std::nullopt, out_bytes);
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      std::string msg(st.message());
      return absl::ResourceExhaustedError(msg.find(name) == std::string::npos ? absl::StrCat("tensor '", name, "': ", msg)
                                                                              : msg);
    }
    if (!st.ok()) {
      ledger_.Fail(name, st);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Session::CheckGlobalScale(const WireEntry& entry, float scale_2) {
  if (absl::Status st = CheckWireGlobalScale(entry, scale_2); !st.ok()) return st;
  const std::vector<std::string>& group = entry.plan->amax_group;
  if (group.empty()) return absl::OkStatus();
  // One global amax for the group: every member's scale_2 is the same float. (Whether it is the
  // one the members' true amax gives is not checkable here: FP4 bytes and E4M3 block scales do
  // not determine it.)
  auto [it, fresh] = group_scale_.try_emplace(entry.plan->amax_group_key, entry.input.name, scale_2);
  if (fresh || std::memcmp(&it->second.second, &scale_2, sizeof(float)) == 0) return absl::OkStatus();
  const std::string suffix = entry.outputs[static_cast<size_t>(entry.global_scale)].suffix;
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", entry.input.name, "': wire format checkpoint: its global scale '", entry.input.name, suffix, "' (",
      scale_2, ") differs from fused group member '", it->second.first, "''s '", it->second.first, suffix, "' (",
      it->second.second, "); the members of a fused NVFP4 group (", absl::StrJoin(group, ", "),
      ") share one global amax: reduce it over the group before converting"));
}

absl::StatusOr<std::optional<SliceAssembler::Whole>> Session::SliceScale(const WireEntry& entry, const TensorDesc& pushed,
                                                                         const uint8_t* src) {
  // Every rank holding a slice of an NVFP4 tensor sends its global scale whole; the first becomes
  // the tensor's, the others must equal it (the ranks reduced one amax).
  float scale_2 = 0.0f;
  if (pushed.nbytes != sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", entry.input.name, "': global scale '", pushed.name,
                                                   "' is ", pushed.nbytes, " bytes, not one F32"));
  }
  if (absl::Status st = ring_.memory().CopyToHost(&scale_2, src, sizeof(float)); !st.ok()) return st;
  auto [it, fresh] = slice_scale_.try_emplace(&entry, scale_2);
  if (!fresh) {
    if (std::memcmp(&it->second, &scale_2, sizeof(float)) == 0) return std::optional<SliceAssembler::Whole>();
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", entry.input.name, "': wire format checkpoint: trainer ranks sent different global scales '",
        pushed.name, "' for its slices (", it->second, " and ", scale_2, "); the ranks holding an NVFP4 tensor "
        "must reduce its amax over all of them (all_reduce MAX) before converting"));
  }
  absl::StatusOr<std::shared_ptr<uint8_t>> data = ring_.memory().Allocate(sizeof(float));
  if (!data.ok()) return data.status();
  if (absl::Status st = ring_.memory().CopyFromHost(data->get(), &scale_2, sizeof(float)); !st.ok()) return st;
  SliceAssembler::Whole whole{pushed, std::move(*data)};
  whole.desc.offset = 0;
  return std::optional<SliceAssembler::Whole>(std::move(whole));
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
