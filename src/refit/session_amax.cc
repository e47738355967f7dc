// Session's NVFP4 amax groups: a tensor's trainer-supplied amax (single pass), and fused members
// deferred until every member of their group has arrived (their shared amax must be known before
// any member is encoded): held on the host, or on the device with the group's amax in a device
// float (held copies and amax floats retired once their bucket is complete). Converter thread only.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/format.h"
#include "refit/convert.h"
#include "refit/session.h"

namespace refit {

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
  if (DeviceOps* ops = device_ops(); ops != nullptr)
    return DeferOnDevice(*ops, desc, src, src_kind, std::move(shared_plan), out_bytes);
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
    absl::Status st =
        Stage(m.desc, m.input.data(), storage::MemoryKind::kHost, *m.plan, a, out_bytes, nullptr, m.claim);
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
    REFIT_ASSIGN_OR_RETURN(uint8_t * block, staging_->pool().Get(absl::StrCat("group-amax:", amax_blocks_),
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
  // Each member's bytes stay where they are (the ring slot) until the bucket ends, and are copied
  // out only if the group is still incomplete then; nothing is read until the group is complete.
  DeviceGroup& group = device_pending_[plan.amax_group_key];
  group.members.push_back({desc, std::move(shared_plan), src, src_kind, nullptr, 0, ClaimOf(desc)});
  if (group.members.size() < plan.amax_group.size()) return absl::OkStatus();
  const std::string key = plan.amax_group_key;  // `plan` stays valid: the member holds it
  absl::Status result = ConvertDeviceGroup(ops, group, out_bytes);
  // Its amax float and held copies stay until the bucket's Sync (kernels may still read them).
  retiring_.push_back(std::move(group));
  device_pending_.erase(key);
  return result;
}

absl::Status Session::ConvertDeviceGroup(DeviceOps& ops, DeviceGroup& group, uint64_t& out_bytes) {
  const formats::QuantizeOptions& options = planner_.spec().options;
  const bool ranks = planner_.ranks() > 1;
  // A group of plain members (whole untransposed device tensors, no supplied amax to check) is
  // staged first, then goes into the converter's batched NVFP4 run with its amax computed there,
  // when every member's outputs land whole: over engine ranks too (an expert of one rank's range,
  // a tensor the ranks share), so that an engine of several ranks takes the path one rank does.
  bool plain = true;
  for (const DeviceMember& m : group.members) {
    const TensorPlan& p = *m.plan;
    plain = plain && m.src_kind == storage::MemoryKind::kDevice && !m.claim && !p.transpose &&
            !(p.shard_dim.has_value() && p.shard_parts > 1) && p.kind == ConvertKind::kQuantize;
  }
  absl::Status result;
  if (!plain) {
    if (!AccumulateGroupAmax(ops, group)) return absl::OkStatus();
    for (const DeviceMember& m : group.members) {
      absl::Status staged = Stage(m.desc, m.src, m.src_kind, *m.plan, std::nullopt, out_bytes, group.amax, m.claim);
      if (staged.code() == absl::StatusCode::kResourceExhausted) {
        result = staged;
      } else if (!staged.ok()) {
        ledger_.Fail(m.desc.name, staged);
      }
    }
    return result;
  }
  std::vector<StagedMember> staged(group.members.size());
  bool all = true;
  for (size_t i = 0; i < group.members.size(); ++i) {
    const DeviceMember& m = group.members[i];
    absl::Status st = ranks ? AllocateOnRanks(*m.plan, staged[i].distinct, staged[i].outs, out_bytes)
                            : AllocateTargets(*m.plan, staged[i].outs, out_bytes);
    if (st.ok()) continue;
    all = false;
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      result = st;
    } else {
      ledger_.Fail(m.desc.name, st);
    }
  }
  if (!all) return result;  // the session fails: nothing of the group is encoded
  std::vector<std::vector<formats::MutableBytes>> whole;
  for (size_t i = 0; i < group.members.size(); ++i) {
    std::optional<std::vector<formats::MutableBytes>> w = WholeMemberOutputs(*group.members[i].plan, staged[i]);
    if (!w) break;
    whole.push_back(*std::move(w));
  }
  if (whole.size() == group.members.size()) {
    std::vector<DeviceOps::GroupMember> members;
    for (size_t i = 0; i < group.members.size(); ++i) {
      members.push_back({&group.members[i].desc, group.members[i].src, whole[i]});
    }
    absl::StatusOr<bool> batched = ops.ConvertAmaxGroup(group.members[0].plan->format, members, options);
    if (batched.ok() && *batched) return absl::OkStatus();
    if (!batched.ok()) {
      for (const DeviceMember& m : group.members) ledger_.Fail(m.desc.name, batched.status());
      return absl::OkStatus();
    }
  }
  // Not batched: the group's amax in a device float, then each member against it into its staged
  // targets (over engine ranks, each distinct part).
  if (!AccumulateGroupAmax(ops, group)) return absl::OkStatus();
  for (size_t i = 0; i < group.members.size(); ++i) {
    const DeviceMember& m = group.members[i];
    absl::Status st = ranks ? StageOnRanks(m.desc, m.src, m.src_kind, *m.plan, std::nullopt, group.amax, std::nullopt,
                                           staged[i].distinct, staged[i].outs)
                            : ops.ConvertPlanned(*m.plan, m.desc, m.src, m.src_kind, staged[i].outs, options,
                                                 PlannedAmax{group.amax, std::nullopt, std::nullopt});
    if (!st.ok()) ledger_.Fail(m.desc.name, st);
  }
  return absl::OkStatus();
}

bool Session::AccumulateGroupAmax(DeviceOps& ops, DeviceGroup& group) {
  absl::StatusOr<float*> amax = TakeGroupAmax();
  absl::Status st = amax.status();
  if (st.ok()) {
    group.amax = *amax;
    st = ops.ResetAmax(group.amax);
  }
  if (!st.ok()) {
    for (const DeviceMember& m : group.members) ledger_.Fail(m.desc.name, st);
    return false;
  }
  bool ok = true;
  for (const DeviceMember& m : group.members) {
    st = ops.AccumulateAmax(m.desc, m.src, m.src_kind, planner_.spec().options, group.amax);
    if (!st.ok()) {
      ledger_.Fail(m.desc.name, st);
      ok = false;
    }
  }
  return ok;
}

absl::Status Session::HoldPendingMembers() {
  DeviceOps* ops = device_ops();
  if (ops == nullptr) return absl::OkStatus();
  for (auto& [key, group] : device_pending_) {
    for (DeviceMember& m : group.members) {
      if (m.held != nullptr) continue;
      // The group is incomplete at the end of the bucket: the member's bytes leave the slot for
      // a device buffer of their own, counted against the staging limit until the group converts.
      // The pool keeps that buffer for the member's next refit: no allocation per bucket, and no
      // free (a device-wide synchronization) when the group retires.
      REFIT_RETURN_IF_ERROR(staging_->Reserve(m.desc.nbytes, m.desc.name));
      absl::StatusOr<uint8_t*> buf =
          staging_->pool().Get(absl::StrCat("held:", m.desc.name), std::max<uint64_t>(m.desc.nbytes, 1));
      if (!buf.ok()) {
        staging_->Unreserve(m.desc.nbytes);
        return absl::ResourceExhaustedError(
            absl::StrCat("tensor '", m.desc.name, "': holding a fused member on the device: ", buf.status().message()));
      }
      REFIT_RETURN_IF_ERROR(ops->Copy(*buf, m.src, m.desc.nbytes, m.src_kind));
      m.held = std::shared_ptr<uint8_t>(std::shared_ptr<uint8_t>(), *buf);  // the pool owns it
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

}  // namespace refit
