// Session's conversion of one bucket (Convert): each pushed tensor taken in — a wire format
// checkpoint tensor's outputs converted by the trainer (checked, assembled from slices, staged as
// copies), or an input tensor (its Megatron-core pieces, assembled from slices) planned by the
// ledger and staged, or held for its fused group — then the bucket ended on the converter.
// Converter thread only.
#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "common/parallel_checksum.h"
#include "formats/format.h"
#include "refit/megatron_source.h"
#include "refit/session.h"

namespace refit {

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

absl::Status Session::VerifyChecksum(const Received& r) {
  if (!r.verify) return absl::OkStatus();
  const BucketHeader& h = r.header;
  const uint64_t sum = h.checksum_kind == ChecksumKind::kParallel64 ? ParallelChecksum64Threads(r.data, h.nbytes)
                                                                    : Checksum64(r.data, h.nbytes);
  if (sum == h.checksum) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("bucket ", h.seq, ": checksum ", ChecksumHex(sum),
                                          " does not match the announced ", ChecksumHex(h.checksum)));
}

void Session::Convert(Converting& c) {
  const BucketHeader& header = c.item.header;
  BucketWork w(c, c.item.data);
  // Nothing of a bucket whose bytes do not match its checksum is read: the session fails with
  // the bucket's number, before any of its tensors is staged.
  if (absl::Status sum = VerifyChecksum(c.item); !sum.ok()) {
    FailBucket(w, std::move(sum));
    return;
  }
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
    ledger_.Fail(name,
                 absl::InvalidArgumentError(absl::StrCat(
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
      return absl::ResourceExhaustedError(
          msg.find(name) == std::string::npos ? absl::StrCat("tensor '", name, "': ", msg) : msg);
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
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", entry.input.name, "': wire format checkpoint: its global scale '", entry.input.name,
                   suffix, "' (", scale_2, ") differs from fused group member '", it->second.first, "''s '",
                   it->second.first, suffix, "' (", it->second.second, "); the members of a fused NVFP4 group (",
                   absl::StrJoin(group, ", "), ") share one global amax: reduce it over the group before converting"));
}

absl::StatusOr<std::optional<SliceAssembler::Whole>> Session::SliceScale(const WireEntry& entry,
                                                                         const TensorDesc& pushed, const uint8_t* src) {
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
        pushed.name, "' for its slices (", it->second, " and ", scale_2,
        "); the ranks holding an NVFP4 tensor "
        "must reduce its amax over all of them (all_reduce MAX) before converting"));
  }
  absl::StatusOr<std::shared_ptr<uint8_t>> data = ring_.memory().Allocate(sizeof(float));
  if (!data.ok()) return data.status();
  if (absl::Status st = ring_.memory().CopyFromHost(data->get(), &scale_2, sizeof(float)); !st.ok()) return st;
  SliceAssembler::Whole whole{pushed, std::move(*data)};
  whole.desc.offset = 0;
  return std::optional<SliceAssembler::Whole>(std::move(whole));
}

}  // namespace refit
