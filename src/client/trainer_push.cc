#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/trainer_client_internal.h"
#include "common/device_env.h"
#include "common/parallel_checksum.h"
#include "transport/cuda_ipc/cuda_ipc_wire.h"

namespace refit::client {

// Wire format checkpoint: converts `t` as the plan says and packs its outputs into one bucket.
absl::Status PushConverted(RefitSession& session, RefitSession::Impl& impl, const TrainerConverter::Entry& e,
                           const TensorRef& t) {
  // NVFP4's global amax: the caller's (TensorRef::amax, reduced over the fused group or the ranks
  // holding the tensor's slices), else the tensor's own when that is all it spans.
  std::optional<float> global_amax;
  if (formats::NeedsGlobalAmax(e.format)) global_amax = t.amax;
  if (!global_amax && TrainerConverter::NeedsReducedAmax(e, t.slice.present())) {
    const std::string why =
        !e.amax_group.empty()
            ? absl::StrCat("it is a member of the fused NVFP4 group (", absl::StrJoin(e.amax_group, ", "),
                           "), which shares one global amax: set TensorRef::amax to the group's max|x| (over every "
                           "member and every rank's slices), or push the members together with PushGroup")
            : "it is a slice of an NVFP4 tensor, whose global amax spans every rank's slices: set TensorRef::amax to "
              "the whole tensor's max|x| (all_reduce MAX over the ranks holding it)";
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': wire format checkpoint: pushed without an amax; ", why, "; or use wire format bf16"));
  }
  // A block-aligned slice converts on its own; its outputs are slices of the whole outputs.
  std::vector<TrainerConverter::SliceOutput> sliced;
  if (t.slice.present()) {
    absl::StatusOr<std::vector<TrainerConverter::SliceOutput>> s =
        impl.convert.SliceOutputs(e, t.dtype, t.shape, t.slice);
    if (!s.ok()) return s.status();
    sliced = std::move(*s);
  } else if (absl::Status st = impl.convert.CheckInput(e, t.dtype, t.shape); !st.ok()) {
    return st;
  }
  std::vector<uint64_t> bytes;
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    bytes.push_back(sliced.empty() ? e.outputs[i].bytes : *DenseBytes(sliced[i].dtype, sliced[i].shape));
  }
  const bool device = storage::CheckDeviceMemory(t.data).ok();
  std::vector<formats::MutableBytes> outs;
  std::vector<TensorRef> parts;
  std::vector<std::shared_ptr<uint8_t>> device_outs;
  if (device) {
    absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> converted =
        impl.convert.ConvertDevice(e, t.dtype, t.shape, t.data, global_amax);
    if (!converted.ok()) return converted.status();
    device_outs = std::move(*converted);
    for (size_t i = 0; i < e.outputs.size(); ++i) outs.push_back({device_outs[i].get(), bytes[i]});
  } else {
    impl.convert_scratch.resize(std::max(impl.convert_scratch.size(), e.outputs.size()));
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      impl.convert_scratch[i].resize(bytes[i]);
      outs.push_back({impl.convert_scratch[i].data(), bytes[i]});
    }
    if (absl::Status st = impl.convert.ConvertHost(e, t.dtype, t.shape, t.data, outs, global_amax); !st.ok()) return st;
  }
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    if (sliced.empty() || !sliced[i].slice.present()) {  // whole (an NVFP4 slice's global scale too)
      parts.push_back({t.name + e.outputs[i].suffix, e.outputs[i].dtype, e.outputs[i].shape, outs[i].data});
    } else {
      parts.push_back({t.name + e.outputs[i].suffix, sliced[i].dtype, sliced[i].shape, outs[i].data, sliced[i].slice});
    }
  }
  absl::Status packed = impl.PackTogether(session, parts);
  // The outputs are copied into the bucket before their buffers go (and before host scratch is reused).
  if (absl::Status st = impl.data->memory->Synchronize(); packed.ok()) packed = st;
  return packed;
}

namespace {

// What Push and PushInPlace check before anything is sent (refitd checks it again: refused here,
// the push fails alone instead of aborting the session): the slice's geometry, then the tensor's
// dense size, which must fit one bucket.
absl::Status CheckSlice(const TensorRef& t) {
  return t.slice.present() ? CheckSliceGeometry(t.name, t.shape, t.slice) : absl::OkStatus();
}

absl::StatusOr<uint64_t> BucketedBytes(const TensorRef& t, uint64_t bucket_bytes) {
  absl::StatusOr<uint64_t> nbytes = DenseBytes(t.dtype, t.shape);
  if (!nbytes.ok())
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", nbytes.status().message()));
  if (*nbytes > bucket_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "' is ", *nbytes, " bytes, larger than the ", bucket_bytes, "-byte bucket"));
  }
  return nbytes;
}

}  // namespace

absl::Status RefitSession::Push(const TensorRef& t) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  if (absl::Status st = CheckSlice(t); !st.ok()) return st;
  if (!impl_->convert.empty() && (t.dtype == DType::kBF16 || t.dtype == DType::kF32)) {
    if (const TrainerConverter::Entry* e = impl_->convert.Find(t.name); e != nullptr)
      return PushConverted(*this, *impl_, *e, t);
  }
  absl::StatusOr<uint64_t> nbytes = BucketedBytes(t, impl_->bucket_bytes);
  if (!nbytes.ok()) return nbytes.status();
  DataPlane* data = impl_->data;
  // Keep 16-byte alignment of every tensor inside the bucket.
  uint64_t offset = (impl_->used + 15) & ~uint64_t{15};
  if (offset + *nbytes > impl_->bucket_bytes) {
    absl::Status st = Flush();
    if (!st.ok()) return st;
    offset = 0;
  }
  TensorDesc desc{t.name, t.dtype, t.shape, offset, *nbytes, t.slice, t.amax};
  if (!t.amax && impl_->amax != nullptr) {
    if (absl::Status st = impl_->amax->Measure(desc, t.data, impl_->header.tensors.size()); !st.ok()) return st;
  }
  // Host or device source; into device buckets the copy is asynchronous and completes before the
  // bucket is sent.
  uint8_t* bucket = data->bucket[data->current].get();
  if (absl::Status st = data->memory->CopyInAsync(bucket + offset, t.data, *nbytes); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "': copy into the bucket failed: ", st.message()));
  }
  impl_->used = offset + *nbytes;
  impl_->header.tensors.push_back(std::move(desc));
  return absl::OkStatus();
}

absl::Status RefitSession::PushInPlace(const TensorRef& t) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  Impl& r = *impl_;
  const bool converts =
      !r.convert.empty() && (t.dtype == DType::kBF16 || t.dtype == DType::kF32) && r.convert.Find(t.name) != nullptr;
  if (!r.data->transport->sends_in_place || r.amax != nullptr || converts) return Push(t);
  DeviceEnv& env = DefaultDeviceEnv();
  if (!env.has_cuda()) return Push(t);
  if (absl::Status st = CheckSlice(t); !st.ok()) return st;
  absl::StatusOr<uint64_t> nbytes = BucketedBytes(t, r.bucket_bytes);
  if (!nbytes.ok()) return nbytes.status();
  constexpr uint64_t kMaxGap = 256;  // padding between a contiguous buffer's parameters
  const uint64_t addr = reinterpret_cast<uint64_t>(t.data);
  const uint64_t base = reinterpret_cast<uint64_t>(r.run_base);
  // Inside the run's allocation (its range is known: no driver query per tensor), right after the
  // run's last tensor, within the bucket size.
  const bool joins = r.run_base != nullptr && addr % 16 == 0 && addr >= base + r.run_used &&
                     addr - (base + r.run_used) <= kMaxGap &&
                     addr + *nbytes - base <= std::min(r.run_limit, r.bucket_bytes);
  if (!joins) {
    absl::StatusOr<AllocationInfo> a = env.QueryAllocation(t.data);
    if (!a.ok() || !a->device || addr % 16 != 0 || addr < a->base || addr - a->base >= a->size) {
      return Push(t);  // not device memory: packed
    }
    // The bytes from the tensor to the end of its allocation; in CUDA virtual memory (expandable
    // segments map theirs piece by piece), to the end of the pieces mapped one after another.
    uint64_t extent = a->base + a->size - addr;
    if (!a->ipc_capable) {
      extent = std::max(extent, env.VmmMappedBytes(t.data, r.bucket_bytes, transport::cuda_ipc::kMaxVmmPieces));
    }
    if (*nbytes > extent) return Push(t);  // not within one allocation: packed
    if (absl::Status st = r.FlushRun(); !st.ok()) return st;
    r.run_base = static_cast<const uint8_t*>(t.data);
    r.run_used = 0;
    r.run_limit = extent;
  }
  const uint64_t offset = addr - reinterpret_cast<uint64_t>(r.run_base);
  r.run_header.tensors.push_back({t.name, t.dtype, t.shape, offset, *nbytes, t.slice, t.amax});
  r.run_used = offset + *nbytes;
  r.in_place_bytes += *nbytes;
  return absl::OkStatus();
}

uint64_t RefitSession::pushed_in_place_bytes() const { return impl_->in_place_bytes; }

void RefitSession::MeasureAmax(bool on) {
  if (!on) {
    impl_->amax.reset();
  } else if (impl_->amax == nullptr) {
    impl_->amax = std::make_unique<AmaxMeter>();
  }
}

absl::Status RefitSession::PushTogether(std::span<const TensorRef> parts) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  return impl_->PackTogether(*this, parts);
}

absl::Status RefitSession::PushGroup(std::span<const TensorRef> members) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  // The global amax of each fused NVFP4 group whose members are all here (host tensors).
  absl::flat_hash_map<std::string, const TensorRef*> by_name;
  for (const TensorRef& t : members) by_name[t.name] = &t;
  absl::flat_hash_map<std::string, float> own;  // member -> max|x|
  std::vector<TensorRef> pushes(members.begin(), members.end());
  for (TensorRef& t : pushes) {
    const TrainerConverter::Entry* e = impl_->convert.Find(t.name);
    if (e == nullptr || t.amax || !formats::NeedsGlobalAmax(e->format) || e->amax_group.empty() || t.slice.present()) {
      continue;
    }
    float group = 0.0f;
    for (const std::string& m : e->amax_group) {
      auto it = by_name.find(m);
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "': wire format checkpoint: PushGroup needs every member of its fused NVFP4 group (",
            absl::StrJoin(e->amax_group, ", "), ") to compute their shared amax; '", m, "' is not among them"));
      }
      auto [a, fresh] = own.try_emplace(m, 0.0f);
      if (fresh) {
        const TensorRef& r = *it->second;
        if (r.slice.present() || storage::CheckDeviceMemory(r.data).ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor '", t.name,
                           "': wire format checkpoint: PushGroup computes a fused group's amax from whole "
                           "host tensors; '",
                           m, "' is a slice or device memory: set TensorRef::amax to the group's max|x|"));
        }
        absl::StatusOr<float> m_amax =
            TensorAmax(formats::ConstTensor{r.dtype, r.shape, r.data}, impl_->convert.options(), m);
        if (!m_amax.ok()) return m_amax.status();
        a->second = *m_amax;
      }
      group = std::isnan(a->second) || a->second > group ? a->second : group;
    }
    t.amax = group;
  }
  for (const TensorRef& t : pushes) {
    if (absl::Status st = Push(t); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::vector<std::string> RefitSession::AmaxGroup(const std::string& name) const {
  const TrainerConverter::Entry* e = impl_->convert.Find(name);
  if (e == nullptr || !formats::NeedsGlobalAmax(e->format)) return {};
  return e->amax_group.empty() ? std::vector<std::string>{name} : e->amax_group;
}

size_t RefitSession::trainer_converted_tensors() const { return impl_->convert.size(); }

absl::Status RefitSession::Impl::PackTogether(RefitSession& session, std::span<const TensorRef> parts) {
  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  for (const TensorRef& t : parts) {
    if (t.slice.present()) {
      if (absl::Status st = CheckSliceGeometry(t.name, t.shape, t.slice); !st.ok()) return st;
    }
    absl::StatusOr<uint64_t> n = DenseBytes(t.dtype, t.shape);
    if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", n.status().message()));
    sizes.push_back(*n);
    total = ((total + 15) & ~uint64_t{15}) + *n;
  }
  if (parts.empty()) return absl::OkStatus();
  if (total > bucket_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", parts[0].name, "' and the ", parts.size() - 1,
                                                   " sent with it are ", total, " bytes, more than the ", bucket_bytes,
                                                   "-byte bucket"));
  }
  if (((used + 15) & ~uint64_t{15}) + total > bucket_bytes) {
    if (absl::Status st = session.Flush(); !st.ok()) return st;
  }
  uint8_t* bucket = data->bucket[data->current].get();
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorRef& t = parts[i];
    const uint64_t offset = (used + 15) & ~uint64_t{15};
    if (absl::Status st = data->memory->CopyInAsync(bucket + offset, t.data, sizes[i]); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': copy into the bucket failed: ", st.message()));
    }
    used = offset + sizes[i];
    header.tensors.push_back({t.name, t.dtype, t.shape, offset, sizes[i], t.slice});
  }
  return absl::OkStatus();
}

absl::Status RefitSession::CheckDeviceMemory(const void* p) { return storage::CheckDeviceMemory(p); }

absl::Status RefitSession::Flush() {
  if (absl::Status st = impl_->FlushRun(); !st.ok()) return st;
  if (impl_->header.tensors.empty()) return absl::OkStatus();
  BucketHeader& h = impl_->header;
  DataPlane* data = impl_->data;
  if (absl::Status st = data->memory->Synchronize(); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("packing the bucket: ", st.message()));
  }
  if (impl_->amax != nullptr) {
    if (absl::Status st = impl_->amax->Collect(h.tensors); !st.ok()) return st;
  }
  absl::Status sent = impl_->SendBucket(h, data->bucket[data->current].get(), impl_->used, /*packed=*/true);
  impl_->used = 0;
  h.tensors.clear();
  return sent;
}

absl::Status RefitSession::Impl::FlushRun() {
  if (run_header.tensors.empty()) return absl::OkStatus();
  absl::Status sent = SendBucket(run_header, run_base, run_used, /*packed=*/false);
  run_header.tensors.clear();
  run_base = nullptr;
  run_used = run_limit = 0;
  return sent;
}

absl::Status RefitSession::Impl::CheckAnnounced(bool block) {
  block = block || pending_announces.size() >= kUncheckedAnnounces;
  if (!block && pending_begin != nullptr && !pending_begin->poll(wait())) return absl::OkStatus();
  if (absl::Status begun = CheckBegun(); !begun.ok()) {
    pending_announces.clear();  // refused with the begin
    return begun;
  }
  absl::Status failed;
  size_t checked = 0;
  for (PendingAnnounce& p : pending_announces) {
    if (!block && !p.call->poll(wait())) break;  // this one and those after it: later
    ++checked;
    absl::StatusOr<bool> ok = Call([&]() -> absl::StatusOr<bool> {
      auto resp = p.call->wait(wait());
      if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
      if (resp.getSeq() != p.seq) {
        return absl::InternalError(absl::StrCat("refitd numbered bucket ", p.seq, " as ", resp.getSeq()));
      }
      return true;
    });
    if (!ok.ok() && failed.ok()) {
      failed = Prefixed(ok.status(), Who(p.member));
    }
  }
  pending_announces.erase(pending_announces.begin(), pending_announces.begin() + checked);
  return failed;
}

absl::Status RefitSession::Impl::SendBucket(BucketHeader& h, const uint8_t* payload, uint64_t nbytes, bool packed) {
  TracePoint("trainer.bucket_ready");
  // The announces of earlier buckets (answered by now, as a rule) before this one's; after a
  // pipelined begin whose buckets go before its answer (early_sends, SendsBeforeBegin), only once
  // that answer came, and then those answered by now.
  const bool before_answer = data->transport->early_sends && pending_begin != nullptr && SendsBeforeBegin();
  if (absl::Status st = CheckAnnounced(/*block=*/!before_answer); !st.ok()) return st;
  h.nbytes = nbytes;
  // A transport that checks integrity itself gets no checksum (its payloads may be on the device,
  // where reading them back would cost a copy); registry.h guarantees host payloads otherwise.
  // The parallel checksum (on several threads) when every daemon of the session verifies it.
  const bool parallel =
      std::all_of(members.begin(), members.end(), [](const Member& m) { return m.parallel_checksum; });
  h.checksum_kind = parallel ? ChecksumKind::kParallel64 : ChecksumKind::kChecksum64;
  if (data->transport->checks_integrity) {
    h.checksum = 0;
  } else {
    h.checksum = parallel ? ParallelChecksum64Threads(payload, h.nbytes) : Checksum64(payload, h.nbytes);
  }
  std::vector<uint64_t> tags(members.size());
  absl::StatusOr<uint32_t> first_seq = Announce(h, tags);
  if (!first_seq.ok()) return first_seq.status();
  TracePoint("trainer.bucket_announced", *first_seq);
  std::vector<uint8_t> tampered;
  if (tamper && data->memory->kind() == storage::MemoryKind::kHost) {
    tampered.assign(payload, payload + h.nbytes);
    tamper(*first_seq, tampered);
    payload = tampered.data();
  }
  absl::Status sent;
  if (!tampered.empty()) {
    // Test builds' tampered copy lives only in this call: sent here, after the sends before it.
    sent = WaitInFlight();
    if (sent.ok()) sent = data->Send(0, tags, payload, h.nbytes);
  } else {
    sent = SendInBackground(std::move(tags), *first_seq, payload, h.nbytes, packed);
  }
  if (!sent.ok()) {
    // refitd dropped the data-plane connection (the session was aborted) or it failed: the next
    // session connects afresh (once the other lane's send, if any, has ended). An announce
    // refitd refused (what ended the session) says why better than the send.
    (void)WaitInFlight();
    data->Drop();
    if (absl::Status announced = CheckAnnounced(); !announced.ok()) return announced;
  }
  return sent;
}

absl::StatusOr<uint32_t> RefitSession::Impl::Announce(BucketHeader& h, std::vector<uint64_t>& tags) {
  // Announce on every daemon (the requests go out together). A daemon that numbers this rank's
  // buckets in a range of its own gets the number here; an older one numbers the bucket itself.
  const bool own_seqs = std::all_of(members.begin(), members.end(), [](const Member& m) { return m.own_seqs; });
  std::vector<AnnounceCall> calls;
  for (auto& m : members) {
    h.seq = own_seqs ? m.next_seq : kAssignBucketSeq;
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                   auto req = m.session.announceRequest();
                   wire::ToWire(h, req.initHeader());
                   calls.push_back(std::make_unique<capnp::RemotePromise<proto::Session::AnnounceResults>>(req.send()));
                 })) {
      calls.push_back(nullptr);
    }
  }
  if (own_seqs) return AnnounceOwnSeqs(calls, tags);
  return AwaitAnnouncedSeqs(calls, tags);
}

absl::StatusOr<uint32_t> RefitSession::Impl::AnnounceOwnSeqs(std::vector<AnnounceCall>& calls,
                                                             std::vector<uint64_t>& tags) {
  // The numbers are known: the answers are checked later (CheckAnnounced), at once unless the
  // bytes may go first (early_sends: refitd holds a message that arrives before its announce is
  // read, and drops it if the session ends). The requests are written before the bytes go.
  for (size_t i = 0; i < members.size(); ++i) {
    if (calls[i] == nullptr) return absl::UnavailableError(absl::StrCat(Who(i), "announce request could not be sent"));
    tags[i] = (members[i].id << 32) | members[i].next_seq;
    pending_announces.push_back({i, members[i].next_seq, std::move(calls[i])});
    ++members[i].next_seq;
  }
  if (data->transport->early_sends) {
    // The bytes go now, or, after a pipelined begin not yet answered, once it is (unless sent
    // before it: SendsBeforeBegin).
    if (pending_begin != nullptr && !SendsBeforeBegin()) {
      if (absl::Status st = CheckBegun(); !st.ok()) return st;
    }
    wait().poll();
  } else if (absl::Status st = CheckAnnounced(); !st.ok()) {
    return st;
  }
  return static_cast<uint32_t>(tags[0]);
}

absl::StatusOr<uint32_t> RefitSession::Impl::AwaitAnnouncedSeqs(std::vector<AnnounceCall>& calls,
                                                                std::vector<uint64_t>& tags) {
  uint32_t first_seq = 0;
  absl::Status announced;
  for (size_t i = 0; i < members.size(); ++i) {
    absl::StatusOr<uint32_t> seq = Call([&]() -> absl::StatusOr<uint32_t> {
      if (calls[i] != nullptr) {
        auto resp = calls[i]->wait(wait());
        if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) return st;
        return resp.getSeq();
      }
      kj::throwFatalException(KJ_EXCEPTION(FAILED, "announce request could not be sent"));
    });
    if (!seq.ok()) {
      if (announced.ok()) announced = Prefixed(seq.status(), Who(i));
      continue;
    }
    if (i == 0) first_seq = *seq;
    tags[i] = (members[i].id << 32) | *seq;
  }
  if (!announced.ok()) return announced;
  return first_seq;
}

absl::Status RefitSession::Impl::SendInBackground(std::vector<uint64_t> tags, uint32_t first_seq,
                                                  const uint8_t* payload, uint64_t nbytes, bool packed) {
  absl::Status sent;
  // Send in the background while the next bucket is packed (into the other buffer) or found.
  // A run sent in place takes the next lane after the run before it, whose bytes the daemon may
  // still be reading: nothing of the trainer's is reused until every send ended.
  int lane = 0;
  if (!packed && data->run_lanes() > 1) {
    lane = next_run_lane;
    next_run_lane = (lane + 1) % data->run_lanes();
    sent = WaitLane(lane);
    if (sent.ok() && lane > 0) sent = data->ConnectLane(lane);
  } else {
    sent = WaitInFlight();
  }
  // The send starts here where the transport can (DataPlane::Post): refitd may read the bucket
  // before the thread that waits for its release has woken.
  const uint64_t n = nbytes;
  bool posted = false;
  if (sent.ok()) {
    absl::StatusOr<bool> p = data->Post(lane, tags, payload, n);
    if (p.ok() && *p) TracePoint("trainer.bucket_sent", first_seq);
    if (p.ok()) posted = *p;
    sent = p.status();
  }
  if (sent.ok()) {
    DataPlane* plane = data;
    auto status = std::make_shared<absl::Status>();
    try {
      in_flight[lane].run = data->send_threads.Start([plane, lane, posted, tags = std::move(tags), payload, n, status] {
        if (posted) {
          *status = plane->Finish(lane);
          return;
        }
        TracePoint("trainer.bucket_sent", tags[0] & 0xFFFFFFFFu);
        *status = plane->Send(lane, tags, payload, n);
      });
    } catch (...) {
      // No thread to wait for the release: this one does, so that the sender's next message
      // does not take this one's release for its own.
      if (posted) (void)data->Finish(lane);
      throw;
    }
    in_flight[lane].status = std::move(status);
    if (packed) data->current ^= 1;
  }
  return sent;
}

}  // namespace refit::client
