// An example trainer on the host path: pushes the demo model's BF16 weights to refitd for each
// of N refits (fresh weights every time), commits, and checks the engine's bytes (read back
// through refitd) against the offline conversion of the same weights. One JSON line per refit.
//
//   example_trainer [--address unix:/run/refitd/refitd.sock]... [--fanout] [--refits N] [--seed S] [--spec FILE]
//                   [--prequantized] [--fault none|drop-scale|strand-gate|abort|die-mid-bucket|
//                    duplicate|stall|silent|bit-flip|garbage|partial|drop-slice|withhold] [--gpu N [--in-place] [--vmm
//                    [--vmm-piece-mib N]]]
//                   [--slices N] [--ranks N --rank R --session-file F] [--tag T] [--stage-only] [shape flags]
//   example_trainer --checkpoint DIR --spec FILE [--model-config FILE] [--expected CONVERTED_DIR] [--only PATTERN]...
//                   [--drop NAME]... [--wire bf16|checkpoint] [--wire-fault KIND:TENSOR] [--gpu N] [--slices 2]
//                   [--address ...]
// --checkpoint pushes a model family's trainer checkpoint once (every tensor refits carry, or
// with --only just those matching, as a partial refit; --drop leaves tensors out). The engine
// must then hold the engine layout of CONVERTED_DIR (`refitctl convert` of the same
// checkpoint) for every parameter the refit touched, and its old bytes for every other; an
// engine of several ranks (a spec with tensor_parallel.size and no rank) each rank's part. The
// spec's sizes come from --model-config, else DIR/config.json when there is one.
// --wire checkpoint: the session's wire format; the client converts what refitd's wire plan lists
// before sending (FP8/FP4 bytes plus scales). --wire-fault KIND:TENSOR sends TENSOR's outputs
// converted here and then spoiled (KIND wrong-scale-shape: a scale with one more row; nan-scale:
// the first scale NaN; wrong-format: the outputs of another format), which refitd must refuse
// naming the tensor (KIND raw: TENSOR sent as declared, unconverted; KIND slice: TENSOR pushed in two slices even where
// refitd's plan cannot take them, e.g. a transposed one; NVFP4 slices then go without an amax, which the client
// refuses; KIND no-amax: a fused NVFP4 member pushed alone without its group's amax, refused by the client; KIND
// group-amax: a fused NVFP4 member encoded against twice its group's amax, so its global scale differs from the other
// members', refused by refitd; KIND slice-amax: an NVFP4 tensor pushed in two slices, the second encoded against twice
// the amax, refused by refitd). Fused NVFP4 members are pushed together (RefitSession::PushGroup: the client takes the
// group's amax), or from a GPU with the group's amax computed here. --slices 2 pushes each matrix as two slices split
// on a block boundary (transposed tensors whole: their trainer-side conversion needs the whole tensor; NVFP4 slices
// carry the whole tensor's or fused group's amax). With --gpu N every tensor is pushed from GPU N's memory (a CUDA
// build's client converts the listed ones there with the kernels).
// --prequantized converts on the trainer (offline functions) and sends checkpoint-format tensors,
// for daemons whose spec passes them through. Faults exercise refusal and abort paths; the
// process exits 0 when every refit ended as expected for the fault (committed for none).
// --gpu N holds the weights on GPU N and pushes device tensors (the NCCL data plane sends from
// that GPU); push_commit_ms in each line is the trainer's time from Begin to the commit reply.
// --in-place (with --gpu) pushes whole tensors by RefitSession::PushInPlace: the weights lie in
// one allocation, 256-byte aligned, so the CUDA IPC data plane sends runs of them from where they
// are, nothing packed (on one GPU refitd's converter reads them there; other planes pack).
// --vmm (with --gpu) makes that allocation CUDA virtual memory exportable as a POSIX descriptor
// (as PyTorch's expandable segments make a trainer's), which the CUDA IPC data plane sends as
// descriptors instead of a CUDA IPC handle; --vmm-piece-mib N maps it in pieces of N MiB, as
// expandable segments grow (tensors then run across pieces).
// --begin-ahead-ms N begins each refit N ms before its weights are pushed, as a trainer that
// begins while its optimizer step still runs (refitd plans and, with `staging: direct`, pauses
// the engine meanwhile); each line's ready_commit_ms is the time from then (the weights ready) to
// the commit reply, push_commit_ms still from Begin.
// --sleep-wake PATH drives the colocated loop with an engine started with --sleep-wake PATH (FIFOs
// PATH.ctl and PATH.ack, made by the caller): before each refit after the first the trainer has
// the engine end its rollout and sleep (it gives its weights' memory back), makes the refit's
// weights (its step), then wakes the engine and begins once it is awake: trainer step, engine
// wakes, refit, rollout, engine sleeps.
// --slices N pushes every matrix as N slices (refitd assembles them); the fault drop-slice
// leaves one slice out, which refitd must refuse naming the tensor and the missing rows.
// Several --address flags (or --fanout with one) feed every daemon at once through one
// FanoutClient (one NCCL broadcast per bucket on the NCCL data plane); every daemon's engine is
// checked.
// --tag T: the manifest's version tag (T with one refit, T-0, T-1, ... with several).
// --stage-only: each refit is held in refitd's staging under its tag (config hold: K) instead of
// committed; its line says "outcome":"staged" and nothing is checked (`refitctl commit TAG` writes it).
// --group: the daemons (several --address flags, in member order) are the members of one engine
// group (config group:, hold >= 1): each refit is prepared as a stage-only fan-out refit tagged T-<refit>
// (--tag T, default "group"), then committed on every member at once (FanoutClient::CommitGroup:
// every member copies it, paused, then every member resumes with it; a member that cannot
// prepare or copy aborts it everywhere). Each line has "group": committed | aborted | dirty.
// --group-deadline-ms D: each member's deadline once copied (0: its config's); --group-timeout-ms
// T: the trainer's bound on each phase's answers. --group-fault exit-after-copy: the trainer
// exits once every member copied, before any resume (the members' deadlines decide).
// --ranks N --rank R: N processes push one refit together, as pipeline/expert/tensor-parallel
// ranks do: rank 0 begins (publishing the session id in --session-file) and commits, the others
// join, push their share (every N-th tensor, or with --slices N their own slice of every matrix)
// and detach.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <vector>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/trainer_client.h"
#if REFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_vmm_alloc.h"
#endif
#include "common/checksum.h"
#include "common/control_connect.h"
#include "common/trace.h"
#include "formats/format_info.h"
#include "formats/safetensors.h"
#include "demo_model.h"
#include "refit/checkpoint_io.h"
#include "refit/convert.h"
#include "refit/resolve.h"
#include "refit/offline.h"
#include "spec/demo_spec.h"
#include "spec/model_spec.h"

namespace {

using namespace refit;

int Fail(absl::string_view msg) {
  std::fprintf(stderr, "example_trainer: %s\n", std::string(msg).c_str());
  return 1;
}

std::string JsonEscape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string Json(const RefitReport& r, int refit, bool match, const std::string& error, double push_commit_ms = 0,
                 absl::StatusCode code = absl::StatusCode::kOk) {
  return absl::StrCat("{\"push_commit_ms\":", push_commit_ms, ",\"refit\":", refit, ",\"session\":", r.session_id, ",\"version\":", r.version,
                      ",\"tag\":\"", JsonEscape(r.tag), "\"",
                      ",\"outcome\":\"", OutcomeName(r.outcome), "\",\"bytes_in\":", r.bytes_in, ",\"bytes_out\":", r.bytes_out,
                      ",\"bytes_in_place\":", r.bytes_in_place,
                      ",\"buckets\":", r.buckets, ",\"tensors\":", r.tensors, ",\"receive_ms\":", r.times.receive_ms,
                      ",\"convert_ms\":", r.times.convert_ms, ",\"validate_ms\":", r.times.validate_ms,
                      ",\"commit_ms\":", r.times.commit_ms, ",\"pause_ms\":", r.times.pause_ms,
                      ",\"total_ms\":", r.times.total_ms, ",\"plan_ms\":", r.times.plan_ms,
                      ",\"finish_ms\":", r.times.finish_ms, ",\"prepare_ms\":", r.times.prepare_ms,
                      ",\"engine_matches_expected\":", match ? "true" : "false",
                      ",\"error\":\"", JsonEscape(error), "\"",
                      code == absl::StatusCode::kOk ? "" : absl::StrCat(",\"code\":\"", absl::StatusCodeToString(code), "\""),
                      "}");
}

// --wire-fault: TENSOR's outputs, converted here as the spec says and then spoiled by KIND.
absl::StatusOr<std::vector<ConvertedTensor>> SpoiledOutputs(const spec::ModelSpec& spec, const InputTensor& t,
                                                            const std::string& kind) {
  absl::StatusOr<Resolution> r = Resolve(spec, t.name, t.dtype, t.shape);
  if (!r.ok()) return r.status();
  if (!r->quantized) return absl::InvalidArgumentError(absl::StrCat("--wire-fault: '", t.name, "' is not quantized"));
  formats::Format format = r->format;
  if (kind == "wrong-format") {
    format = format == formats::Format::kMxfp8 ? formats::Format::kFp8Block128 : formats::Format::kMxfp8;
  } else if (kind != "wrong-scale-shape" && kind != "nan-scale") {
    return absl::InvalidArgumentError(absl::StrCat("--wire-fault: unknown kind '", kind, "'"));
  }
  absl::StatusOr<std::vector<formats::OutputSpec>> specs = formats::PlanOutputs(format, t.dtype, r->input_shape);
  if (!specs.ok()) return specs.status();
  std::vector<ConvertedTensor> outs;
  std::vector<formats::MutableBytes> bufs;
  for (const formats::OutputSpec& o : *specs) outs.push_back({t.name + o.suffix, o.dtype, o.shape, std::vector<uint8_t>(o.bytes)});
  for (ConvertedTensor& o : outs) bufs.push_back({o.bytes.data(), o.bytes.size()});
  absl::Status st = ConvertFull(ConvertStep{ConvertKind::kQuantize, format, r->transpose},
                                formats::ConstTensor{t.dtype, t.shape, t.data}, spec.options, std::nullopt, bufs, t.name);
  if (!st.ok()) return st;
  ConvertedTensor& scale = outs.size() > 1 ? outs[1] : outs[0];
  if (kind == "wrong-scale-shape") {
    if (scale.shape.empty()) scale.shape.push_back(1);
    scale.shape[0] += 1;
    scale.bytes.resize(*DenseBytes(scale.dtype, scale.shape));
  } else if (kind == "nan-scale") {
    if (scale.dtype == DType::kF32) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(scale.bytes.data(), &nan, 4);
    } else {
      scale.bytes[0] = scale.dtype == DType::kF8E4M3 ? 0x7F : 0xFF;
    }
  }
  return outs;
}

int RunCheckpoint(const std::string& address, const spec::ModelSpec& spec, const std::string& checkpoint,
                  const std::string& expected_dir, const std::vector<std::string>& only,
                  const std::vector<std::string>& drop, WireFormat wire, const std::string& wire_fault, int gpu,
                  int slices) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(checkpoint);
  if (!ckpt.ok()) return Fail(ckpt.status().message());
  std::vector<spec::NamePattern> only_patterns;
  for (const std::string& o : only) {
    absl::StatusOr<spec::NamePattern> p = spec::NamePattern::Parse(o);
    if (!p.ok()) return Fail(p.status().message());
    only_patterns.push_back(*p);
  }
  std::vector<const InputTensor*> send;
  for (const InputTensor& t : (*ckpt)->tensors()) {
    if (spec.NeverRuleFor(t.name) != nullptr) continue;  // refits never carry it
    bool selected = only_patterns.empty();
    for (const spec::NamePattern& p : only_patterns) selected = selected || p.Match(t.name).has_value();
    if (!selected) continue;
    send.push_back(&t);
  }
  std::vector<storage::ParamInfo> sent_infos;
  for (const InputTensor* t : send) sent_infos.push_back({t->name, t->dtype, t->shape, *DenseBytes(t->dtype, t->shape)});
  std::vector<const InputTensor*> pushed;
  for (const InputTensor* t : send) {
    if (std::find(drop.begin(), drop.end(), t->name) == drop.end()) pushed.push_back(t);
  }
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> client = client::TrainerClient::Connect(address);
  if (!client.ok()) return Fail(client.status().message());
  absl::StatusOr<client::DaemonStatus> status = (*client)->Status();
  if (!status.ok()) return Fail(status.status().message());
  absl::StatusOr<std::pair<uint64_t, std::vector<client::ParamChecksum>>> before = (*client)->Checksums();
  if (!before.ok()) return Fail(before.status().message());
  Manifest manifest;
  manifest.model = status->model;
  manifest.partial = !only_patterns.empty();
  if (drop.empty()) {
    for (const InputTensor* t : pushed) manifest.tensors.push_back({t->name, t->dtype, t->shape, 0, *DenseBytes(t->dtype, t->shape)});
  }
  manifest.wire_format = wire;
  std::string fault_kind, fault_tensor;
  if (!wire_fault.empty()) {
    const size_t colon = wire_fault.find(':');
    if (colon == std::string::npos) return Fail("--wire-fault takes KIND:TENSOR");
    fault_kind = wire_fault.substr(0, colon);
    fault_tensor = wire_fault.substr(colon + 1);
  }
  // --gpu N: every tensor is pushed from GPU N (a CUDA build converts listed ones with the kernels).
  std::vector<const void*> sources;
  std::shared_ptr<void> device_copy;
  for (const InputTensor* t : pushed) sources.push_back(t->data);
  if (gpu >= 0) {
#if REFIT_HAVE_CUDA
    if (cudaSetDevice(gpu) != cudaSuccess) return Fail(absl::StrCat("cannot use GPU ", gpu));
    uint64_t total = 0;
    for (const InputTensor* t : pushed) total += (*DenseBytes(t->dtype, t->shape) + 255) & ~uint64_t{255};
    void* d = nullptr;
    if (cudaMalloc(&d, std::max<uint64_t>(total, 1)) != cudaSuccess) return Fail("cudaMalloc failed");
    device_copy = std::shared_ptr<void>(d, [](void* p) { cudaFree(p); });
    uint64_t at = 0;
    for (size_t i = 0; i < pushed.size(); ++i) {
      const uint64_t n = *DenseBytes(pushed[i]->dtype, pushed[i]->shape);
      auto* dst = static_cast<uint8_t*>(d) + at;
      if (cudaMemcpy(dst, pushed[i]->data, n, cudaMemcpyHostToDevice) != cudaSuccess) return Fail("cudaMemcpy failed");
      sources[i] = dst;
      at += (n + 255) & ~uint64_t{255};
    }
#else
    return Fail("--gpu needs a build with CUDA");
#endif
  }
  absl::StatusOr<std::unique_ptr<client::RefitSession>> session = (*client)->Begin(manifest);
  if (!session.ok()) return Fail(session.status().message());
  absl::Status push_status;
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < pushed.size(); ++i) index_of[pushed[i]->name] = i;
  // NVFP4 amax a push supplies (wire format checkpoint): a fused group's (the max over its
  // members) or the whole tensor's for its slices, as a trainer reduces it over its ranks.
  auto amax_of = [&](const InputTensor& t) -> absl::StatusOr<float> {
    std::vector<std::string> group = (*session)->AmaxGroup(t.name);
    float a = 0.0f;
    for (const std::string& m : group) {
      auto it = index_of.find(m);
      if (it == index_of.end()) return absl::InvalidArgumentError(absl::StrCat("fused member '", m, "' is not pushed"));
      const InputTensor& mt = *pushed[it->second];
      absl::StatusOr<float> own = TensorAmax(formats::ConstTensor{mt.dtype, mt.shape, mt.data}, spec.options, m);
      if (!own.ok()) return own.status();
      a = std::max(a, *own);
    }
    return a;
  };
  std::vector<bool> done(pushed.size(), false);
  for (size_t i = 0; i < pushed.size() && push_status.ok(); ++i) {
    if (done[i]) continue;
    done[i] = true;
    // --slices 2: two slices along dim 0, split on a block boundary of the tensor's format
    // (transposed tensors whole, unless --wire-fault slice:TENSOR names them; NVFP4 slices carry
    // the tensor's or its fused group's amax, except under the slice fault).
    const InputTensor& t = *pushed[i];
    const bool slice_fault = fault_kind == "slice" && t.name == fault_tensor;
    const bool slice_amax_fault = fault_kind == "slice-amax" && t.name == fault_tensor;
    if ((slices > 1 || slice_fault || slice_amax_fault) && t.shape.size() >= 2) {
      absl::StatusOr<Resolution> r = Resolve(spec, t.name, t.dtype, t.shape);
      int64_t block = 1;
      bool whole = false;
      std::optional<float> amax;
      if (r.ok() && r->quantized) {
        block = formats::BlockAlong(r->format, 0, t.shape.size());
        whole = r->transpose && !slice_fault;
        if (wire == WireFormat::kCheckpoint && formats::NeedsGlobalAmax(r->format) && !slice_fault) {
          absl::StatusOr<float> a = amax_of(t);
          if (!a.ok()) return Fail(a.status().message());
          amax = *a;
        }
      }
      const int64_t rows = t.shape[0], split = rows / 2 / block * block;
      if (!whole && split > 0 && split < rows) {
        const uint64_t row_bytes = *DenseBytes(t.dtype, t.shape) / static_cast<uint64_t>(rows);
        for (int part = 0; part < 2 && push_status.ok(); ++part) {
          Shape shape = t.shape;
          shape[0] = part == 0 ? split : rows - split;
          TensorSlice slice{0, part == 0 ? 0u : static_cast<uint64_t>(split), t.shape};
          const auto* from = static_cast<const uint8_t*>(sources[i]) + (part == 0 ? 0 : split * row_bytes);
          // slice-amax: the second slice encodes against twice the amax, as a rank that did not
          // reduce it would; its global scale then differs from the first slice's.
          const std::optional<float> a = part == 1 && slice_amax_fault && amax ? std::optional<float>(2.0f * *amax) : amax;
          push_status = (*session)->Push({t.name, t.dtype, shape, from, slice, a});
        }
        continue;
      }
    }
    if (pushed[i]->name == fault_tensor && fault_kind == "raw") {
      // As declared (BF16), although refitd's plan has the trainer convert it.
      const client::TensorRef raw{t.name, t.dtype, t.shape, sources[i]};
      push_status = (*session)->PushTogether(std::span<const client::TensorRef>(&raw, 1));
      continue;
    }
    if (pushed[i]->name == fault_tensor && fault_kind == "no-amax") {
      // A fused NVFP4 member pushed alone without its group's amax: the client refuses it.
      push_status = (*session)->Push({t.name, t.dtype, t.shape, sources[i]});
      continue;
    }
    if (pushed[i]->name == fault_tensor && !slice_fault && fault_kind != "group-amax") {
      absl::StatusOr<std::vector<ConvertedTensor>> spoiled = SpoiledOutputs(spec, *pushed[i], fault_kind);
      if (!spoiled.ok()) return Fail(spoiled.status().message());
      std::vector<client::TensorRef> parts;
      for (const ConvertedTensor& o : *spoiled) parts.push_back({o.name, o.dtype, o.shape, o.bytes.data()});
      push_status = (*session)->PushTogether(parts);
      continue;
    }
    std::vector<std::string> group = wire == WireFormat::kCheckpoint ? (*session)->AmaxGroup(t.name) : std::vector<std::string>{};
    if (group.size() > 1 && gpu < 0) {
      // A fused NVFP4 group's members together: the client takes their shared amax.
      std::vector<client::TensorRef> members;
      for (const std::string& m : group) {
        auto it = index_of.find(m);
        if (it == index_of.end() || done[it->second] != (it->second == i)) continue;
        done[it->second] = true;
        const InputTensor& mt = *pushed[it->second];
        std::optional<float> amax;
        if (fault_kind == "group-amax" && m == fault_tensor) {
          absl::StatusOr<float> a = amax_of(mt);
          if (!a.ok()) return Fail(a.status().message());
          amax = 2.0f * *a;
        }
        members.push_back({mt.name, mt.dtype, mt.shape, sources[it->second], {}, amax});
      }
      push_status = (*session)->PushGroup(members);
      continue;
    }
    std::optional<float> amax;
    if (group.size() > 1) {  // device tensors: the group's amax supplied
      absl::StatusOr<float> a = amax_of(t);
      if (!a.ok()) return Fail(a.status().message());
      amax = *a;
    }
    push_status = (*session)->Push({pushed[i]->name, pushed[i]->dtype, pushed[i]->shape, sources[i], {}, amax});
  }
  const size_t trainer_converted = (*session)->trainer_converted_tensors();
  absl::StatusOr<RefitReport> report = push_status.ok() ? (*session)->Commit() : absl::StatusOr<RefitReport>(push_status);
  if (!report.ok()) {
    RefitReport r;
    r.outcome = Outcome::kRefused;
    std::printf("%s\n", Json(r, 0, false, std::string(report.status().message()), 0, report.status().code()).c_str());
    std::fflush(stdout);
    return drop.empty() && wire_fault.empty() ? 4 : 0;
  }
  bool match = true;
  std::string mismatch;
  if (!expected_dir.empty()) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> conv = Checkpoint::Open(expected_dir + "/model.safetensors");
    if (!conv.ok()) return Fail(conv.status().message());
    std::vector<ConvertedTensor> converted;
    for (const InputTensor& t : (*conv)->tensors()) {
      const auto* b = static_cast<const uint8_t*>(t.data);
      converted.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(b, b + *DenseBytes(t.dtype, t.shape))});
    }
    // An engine of several ranks: refitd names each rank's parameters "rank<R>/<name>".
    const bool ranked = spec.tp_size > 1 && !spec.tp_rank_given;
    std::map<std::string, uint64_t> want, old;
    for (int r = 0; r < (ranked ? spec.tp_size : 1); ++r) {
      absl::StatusOr<spec::ModelSpec> rank_spec = ranked ? spec::ForRank(spec, r) : spec;
      if (!rank_spec.ok()) return Fail(rank_spec.status().message());
      absl::StatusOr<std::vector<ConvertedTensor>> layout = EngineLayout(*rank_spec, sent_infos, ByName(converted));
      if (!layout.ok()) return Fail(layout.status().message());
      const std::string prefix = ranked ? absl::StrCat("rank", r, "/") : "";
      for (const ConvertedTensor& t : *layout) {
        if (spec.NeverRuleFor(t.name) == nullptr) want[prefix + t.name] = Checksum64(t.bytes.data(), t.bytes.size());
      }
    }
    for (const client::ParamChecksum& p : before->second) old[p.name] = p.checksum;
    absl::StatusOr<std::pair<uint64_t, std::vector<client::ParamChecksum>>> after = (*client)->Checksums();
    if (!after.ok()) return Fail(after.status().message());
    size_t touched = 0;
    for (const client::ParamChecksum& p : after->second) {
      auto it = want.find(p.name);
      uint64_t expect = it != want.end() ? it->second : old[p.name];
      if (it != want.end()) ++touched;
      if (expect != p.checksum) {
        match = false;
        if (mismatch.size() < 2000) absl::StrAppend(&mismatch, mismatch.empty() ? "" : ", ", p.name);
      }
    }
    if (touched != want.size()) {
      match = false;
      absl::StrAppend(&mismatch, " (", want.size() - touched, " expected parameters not registered)");
    }
  }
  std::string line = Json(*report, 0, match, match ? "" : absl::StrCat("mismatch: ", mismatch));
  line.insert(line.size() - 1, absl::StrCat(",\"wire_format\":\"", WireFormatName(wire), "\",\"trainer_converted\":",
                                           trainer_converted));
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return match ? 0 : 4;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address = refit::kDefaultControlAddress, spec_path, fault = "none", checkpoint, expected_dir,
              model_config_path;
  std::vector<std::string> only, drop, addresses;
  bool fanout = false;
  int refits = 3;
  std::string tag;  // --tag T: each refit's manifest tag (T, or T-<refit> with several refits)
  bool stage_only = false;  // --stage-only: hold each refit in refitd's staging (hold: K) under its tag
  bool group = false;       // --group: the daemons are one engine group's members (two-phase commit)
  uint32_t group_deadline_ms = 0, group_timeout_ms = 0;
  std::string group_fault = "none";
  WireFormat wire = WireFormat::kBf16;  // --wire (with --checkpoint)
  std::string wire_fault;               // --wire-fault KIND:TENSOR (with --checkpoint)
  int gpu = -1;  // --gpu: weights on this GPU
  bool in_place = false;  // --in-place: whole device tensors go by RefitSession::PushInPlace
  [[maybe_unused]] bool vmm = false;  // --vmm: the weights' allocation is CUDA virtual memory
  [[maybe_unused]] uint64_t vmm_piece_bytes = 0;  // --vmm-piece-mib: ... mapped in pieces of this size
  int slices = 1;  // --slices: push matrices in this many slices
  int ranks = 1, rank = 0;  // --ranks/--rank: this process pushes its share of one session
  std::string session_file;  // --session-file: where rank 0 publishes the session id
  uint64_t seed = 1;
  bool prequantized = false;
  bool verify = true;  // compute the expected conversion and compare the engine's bytes
  bool measure_amax = false;  // --measure-amax: announce each BF16 tensor's amax (single-pass NVFP4)
  int begin_ahead_ms = 0;     // --begin-ahead-ms: Begin this long before the weights are pushed
  std::string sleep_wake;     // --sleep-wake: sleep the engine between refits, wake it before each (FIFOs)
  std::string dump_dir;
  demo::ModelShape shape;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--address" && i + 1 < argc) {
      address = argv[++i];
      addresses.push_back(address);
    } else if (a == "--fanout") {
      fanout = true;
    } else if (a == "--refits" && i + 1 < argc) {
      refits = std::atoi(argv[++i]);
    } else if (a == "--tag" && i + 1 < argc) {
      tag = argv[++i];
    } else if (a == "--stage-only") {
      stage_only = true;
    } else if (a == "--group") {
      group = true;
    } else if (a == "--group-deadline-ms" && i + 1 < argc) {
      group_deadline_ms = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--group-timeout-ms" && i + 1 < argc) {
      group_timeout_ms = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--group-fault" && i + 1 < argc) {
      group_fault = argv[++i];
      if (group_fault != "none" && group_fault != "exit-after-copy")
        return Fail("--group-fault takes none or exit-after-copy");
    } else if (a == "--wire" && i + 1 < argc) {
      const std::string w = argv[++i];
      if (w != "bf16" && w != "checkpoint") return Fail("--wire takes bf16 or checkpoint");
      wire = w == "checkpoint" ? WireFormat::kCheckpoint : WireFormat::kBf16;
    } else if (a == "--wire-fault" && i + 1 < argc) {
      wire_fault = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--spec" && i + 1 < argc) {
      spec_path = argv[++i];
    } else if (a == "--fault" && i + 1 < argc) {
      fault = argv[++i];
    } else if (a == "--dump" && i + 1 < argc) {
      dump_dir = argv[++i];
    } else if (a == "--no-verify") {
      verify = false;
    } else if (a == "--checkpoint" && i + 1 < argc) {
      checkpoint = argv[++i];
    } else if (a == "--expected" && i + 1 < argc) {
      expected_dir = argv[++i];
    } else if (a == "--model-config" && i + 1 < argc) {
      model_config_path = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only.push_back(argv[++i]);
    } else if (a == "--drop" && i + 1 < argc) {
      drop.push_back(argv[++i]);
    } else if (a == "--prequantized") {
      prequantized = true;
    } else if (a == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (a == "--rank" && i + 1 < argc) {
      rank = std::atoi(argv[++i]);
    } else if (a == "--session-file" && i + 1 < argc) {
      session_file = argv[++i];
    } else if (a == "--slices" && i + 1 < argc) {
      slices = std::atoi(argv[++i]);
    } else if (a == "--gpu" && i + 1 < argc) {
      gpu = std::atoi(argv[++i]);
    } else if (a == "--measure-amax") {
      measure_amax = true;
    } else if (a == "--begin-ahead-ms" && i + 1 < argc) {
      begin_ahead_ms = std::atoi(argv[++i]);
    } else if (a == "--sleep-wake" && i + 1 < argc) {
      sleep_wake = argv[++i];
    } else if (a == "--in-place") {
      in_place = true;
    } else if (a == "--vmm") {
      vmm = true;
    } else if (a == "--vmm-piece-mib" && i + 1 < argc) {
      vmm_piece_bytes = std::strtoull(argv[++i], nullptr, 10) << 20;
    } else if (!demo::ParseShapeFlag(argc, argv, i, shape)) {
      return Fail(absl::StrCat("unknown flag ", a));
    }
  }
  // The conversion the engine's bytes must equal (the demo spec's formats).
  if (model_config_path.empty() && !checkpoint.empty() &&
      std::filesystem::exists(std::filesystem::path(checkpoint) / "config.json")) {
    model_config_path = (std::filesystem::path(checkpoint) / "config.json").string();
  }
  std::optional<spec::ModelConfig> model_config;
  if (!model_config_path.empty()) {
    absl::StatusOr<spec::ModelConfig> c = spec::LoadModelConfigFile(model_config_path);
    if (!c.ok()) return Fail(c.status().message());
    model_config = std::move(*c);
  }
  absl::StatusOr<spec::ModelSpec> spec =
      spec_path.empty() ? spec::ParseModelSpec(spec::kDemoModelSpec)
                        : spec::LoadModelSpecFile(spec_path, {.model_config = model_config ? &*model_config : nullptr});
  if (!spec.ok()) return Fail(spec.status().message());
  if (!dump_dir.empty()) {
    // Writes the first refit's weights (model.safetensors, BF16 HF names) and their offline
    // conversion (converted.safetensors), for refitctl refit/verify; sends nothing.
    std::vector<std::vector<uint16_t>> weights;
    std::vector<ConvertedTensor> converted;
    std::vector<formats::SafetensorsWriteEntry> in, out;
    for (const demo::HfTensor& t : demo::Tensors(shape)) {
      weights.push_back(demo::Weights(seed * 1000003, t));
      const auto& w = weights.back();
      in.push_back({t.name, DType::kBF16, t.shape,
                    std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(w.data()), w.size() * 2), nullptr});
      absl::StatusOr<std::vector<ConvertedTensor>> conv = ConvertTensor(*spec, t.name, DType::kBF16, t.shape, w.data());
      if (!conv.ok()) return Fail(conv.status().message());
      for (ConvertedTensor& c : *conv) converted.push_back(std::move(c));
    }
    for (const ConvertedTensor& c : converted) out.push_back({c.name, c.dtype, c.shape, c.bytes, nullptr});
    absl::Status st = formats::WriteSafetensors(dump_dir + "/model.safetensors", in);
    if (st.ok()) st = formats::WriteSafetensors(dump_dir + "/converted.safetensors", out);
    if (!st.ok()) return Fail(st.message());
    return 0;
  }
  if (!checkpoint.empty()) {
    return RunCheckpoint(address, *spec, checkpoint, expected_dir, only, drop, wire, wire_fault, gpu, slices);
  }
  if (ranks > 1 && (session_file.empty() || rank < 0 || rank >= ranks || refits != 1 || (slices > 1 && slices != ranks))) {
    return Fail("--ranks needs --session-file, 0 <= --rank < --ranks, --refits 1, and --slices equal to --ranks if given");
  }
  if (gpu >= 0) {
#if REFIT_HAVE_CUDA
    if (cudaSetDevice(gpu) != cudaSuccess) return Fail(absl::StrCat("cannot use GPU ", gpu));
#else
    return Fail("--gpu needs a build with CUDA");
#endif
  }
  if (addresses.empty()) addresses.push_back(address);
  fanout = fanout || addresses.size() > 1 || group;
  if (group) {
    stage_only = true;
    if (tag.empty()) tag = "group";
  }
  if (fanout && ranks > 1) return Fail("--ranks does not combine with several --address flags");
  // The daemons' clients: one TrainerClient, or a FanoutClient holding one per daemon.
  std::unique_ptr<client::TrainerClient> single;
  std::unique_ptr<client::FanoutClient> fan;
  std::vector<client::TrainerClient*> daemons;
  if (fanout) {
    absl::StatusOr<std::unique_ptr<client::FanoutClient>> c = client::FanoutClient::Connect(addresses);
    if (!c.ok()) return Fail(c.status().message());
    fan = std::move(*c);
    for (size_t d = 0; d < fan->size(); ++d) daemons.push_back(&fan->daemon(d));
  } else {
    absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(address);
    if (!c.ok()) return Fail(c.status().message());
    single = std::move(*c);
    daemons.push_back(single.get());
  }
  client::TrainerClient* const control = daemons.front();
  absl::StatusOr<client::DaemonStatus> status = control->Status();
  if (!status.ok()) return Fail(status.status().message());

  int ctl_fd = -1, ack_fd = -1;  // --sleep-wake: our orders to the engine, its answers
  if (!sleep_wake.empty()) {
    ctl_fd = open((sleep_wake + ".ctl").c_str(), O_RDWR | O_CLOEXEC);
    ack_fd = open((sleep_wake + ".ack").c_str(), O_RDWR | O_CLOEXEC);
    if (ctl_fd < 0 || ack_fd < 0) {
      return Fail(absl::StrCat("cannot open the FIFOs ", sleep_wake, ".ctl and .ack: ", std::strerror(errno)));
    }
  }
  // Sends `order` to the engine and waits for its answer `ack`.
  auto order_engine = [&](char order, char ack) -> absl::Status {
    char got = 0;
    pollfd p{ack_fd, POLLIN, 0};
    if (write(ctl_fd, &order, 1) != 1 || poll(&p, 1, 120000) != 1 || read(ack_fd, &got, 1) != 1 || got != ack) {
      return absl::DeadlineExceededError(absl::StrCat("the engine did not answer '", std::string(1, order), "' with '",
                                                      std::string(1, ack), "' within 120 s (", sleep_wake, ".ack)"));
    }
    return absl::OkStatus();
  };
  int unexpected = 0;
  std::shared_ptr<void> device_copies;  // --gpu: the weights on the GPU, kept across refits
  [[maybe_unused]] uint64_t device_bytes = 0;
  for (int refit = 0; refit < refits; ++refit) {
    if (ctl_fd >= 0 && refit > 0) {  // the rollout done, the engine sleeps through the step
      if (absl::Status s = order_engine('s', 'a'); !s.ok()) return Fail(s.message());
    }
    uint64_t weights_seed = seed * 1000003 + static_cast<uint64_t>(refit);
    // Expected engine bytes and what to send.
    std::map<std::string, uint64_t> expected;
    std::vector<ConvertedTensor> to_send;
    Manifest manifest;
    manifest.model = status->model;
    if (!tag.empty()) manifest.tag = refits == 1 && !group ? tag : absl::StrCat(tag, "-", refit);
    manifest.stage_only = stage_only;
    // Generate the weights on every core (benchmark models are many GB).
    const std::vector<demo::HfTensor> tensors = demo::Tensors(shape);
    // Without verification the workers also produce the bytes to send.
    const bool bytes_only = !verify && !prequantized;
    std::vector<std::vector<uint16_t>> generated(tensors.size());
    std::vector<std::vector<uint8_t>> generated_bytes(tensors.size());
    {
      std::atomic<size_t> next{0};
      std::vector<std::thread> workers;
      for (unsigned k = 0; k < std::max(1u, std::thread::hardware_concurrency()); ++k) {
        workers.emplace_back([&] {
          for (size_t i = next++; i < tensors.size(); i = next++) {
            generated[i] = demo::Weights(weights_seed, tensors[i]);
            if (!bytes_only) continue;
            generated_bytes[i].resize(generated[i].size() * 2);
            std::memcpy(generated_bytes[i].data(), generated[i].data(), generated_bytes[i].size());
            std::vector<uint16_t>().swap(generated[i]);
          }
        });
      }
      for (std::thread& w : workers) w.join();
    }
    // The engine's expected bytes: the offline conversion of every tensor (fused NVFP4 groups
    // sharing their amax) in the spec's engine layout (fused, stacked, sharded, laid out).
    if (!bytes_only) {
      std::vector<InputTensor> inputs;
      std::vector<storage::ParamInfo> infos;
      for (size_t ti = 0; ti < tensors.size(); ++ti) {
        const demo::HfTensor& t = tensors[ti];
        inputs.push_back({t.name, DType::kBF16, t.shape, generated[ti].data()});
        infos.push_back({t.name, DType::kBF16, t.shape, generated[ti].size() * 2});
      }
      absl::StatusOr<std::vector<ConvertedTensor>> all = ConvertCheckpoint(*spec, inputs);
      absl::StatusOr<std::vector<ConvertedTensor>> layout =
          all.ok() ? EngineLayout(*spec, infos, ByName(*all)) : absl::StatusOr<std::vector<ConvertedTensor>>(all.status());
      if (!layout.ok()) return Fail(layout.status().message());
      for (const ConvertedTensor& c : *layout) expected[c.name] = Checksum64(c.bytes.data(), c.bytes.size());
    }
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      const demo::HfTensor& t = tensors[ti];
      if (bytes_only) {
        to_send.push_back({t.name, DType::kBF16, t.shape, std::move(generated_bytes[ti])});
        continue;
      }
      std::vector<uint16_t> w = std::move(generated[ti]);
      if (prequantized) {
        absl::StatusOr<std::vector<ConvertedTensor>> conv = ConvertTensor(*spec, t.name, DType::kBF16, t.shape, w.data());
        if (!conv.ok()) return Fail(conv.status().message());
        for (ConvertedTensor& c : *conv) to_send.push_back(std::move(c));
      } else {
        std::vector<uint8_t> bytes(w.size() * 2);
        std::memcpy(bytes.data(), w.data(), bytes.size());
        to_send.push_back({t.name, DType::kBF16, t.shape, std::move(bytes)});
      }
    }
    if (fault == "drop-scale") {
      for (size_t i = 0; i < to_send.size(); ++i) {
        if (to_send[i].name.find("mlp.down_proj.weight_scale_inv") != std::string::npos) {
          to_send.erase(to_send.begin() + static_cast<long>(i));
          break;
        }
      }
    } else if (fault == "strand-gate") {
      for (size_t i = 0; i < to_send.size(); ++i) {
        if (to_send[i].name.find("mlp.up_proj.weight") != std::string::npos) {
          to_send.erase(to_send.begin() + static_cast<long>(i));
          break;
        }
      }
    } else if (fault == "duplicate") {
      to_send.push_back(to_send.front());
    } else if (fault == "partial") {
      // A partial refit of one tensor (refused while the engine is dirty).
      to_send.resize(1);
      manifest.partial = true;
    }
    for (const ConvertedTensor& c : to_send) {
      manifest.tensors.push_back({c.name, c.dtype, c.shape, 0, c.bytes.size()});
    }
    if (fault == "strand-gate" || fault == "duplicate") manifest.tensors.clear();  // let the commit-time check speak
    if (fault == "drop-scale") manifest.tensors.clear();
    // With --gpu the weights live on the GPU, as a trainer's do.
    std::vector<const void*> sources;
    for (const ConvertedTensor& c : to_send) sources.push_back(c.bytes.data());
#if REFIT_HAVE_CUDA
    if (gpu >= 0) {
      // One allocation holding every tensor, kept across refits as a trainer keeps its
      // parameters (each refit's weights are written into it in place).
      uint64_t total = 0;
      for (const ConvertedTensor& c : to_send) total += (c.bytes.size() + 255) & ~uint64_t{255};
      if (total > device_bytes) {
        device_copies.reset();
        void* d = nullptr;
        std::string why;
        if (vmm) {
          // Held until the process exits, as the examples' virtual memory is.
          if ((d = examples::AllocateVmm(gpu, total, why, vmm_piece_bytes)) == nullptr) {
            return Fail(absl::StrCat("cannot allocate ", total, " bytes of virtual memory on GPU ", gpu, ": ", why));
          }
          device_copies = std::shared_ptr<void>(d, [](void*) {});
        } else {
          if (cudaMalloc(&d, std::max<uint64_t>(total, 1)) != cudaSuccess) {
            return Fail(absl::StrCat("cannot allocate ", total, " bytes on GPU ", gpu));
          }
          device_copies = std::shared_ptr<void>(d, [](void* p) { cudaFree(p); });
        }
        device_bytes = total;
      }
      void* d = device_copies.get();
      uint64_t offset = 0;
      for (size_t i = 0; i < to_send.size(); ++i) {
        uint8_t* at = static_cast<uint8_t*>(d) + offset;
        if (cudaMemcpy(at, to_send[i].bytes.data(), to_send[i].bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
          return Fail(absl::StrCat("cannot place '", to_send[i].name, "' on GPU ", gpu));
        }
        sources[i] = at;
        offset += (to_send[i].bytes.size() + 255) & ~uint64_t{255};
      }
    }
#endif
    if (ctl_fd >= 0 && refit > 0) {  // the step done, the engine wakes; the refit begins once it is awake
      if (absl::Status s = order_engine('w', 'w'); !s.ok()) return Fail(s.message());
    }
    const absl::Time begun = absl::Now();
    // Several ranks: rank 0 begins the session and publishes its id in --session-file; the other
    // ranks join it, push their share and detach, each then touching <session-file>.done.<rank>.
    absl::StatusOr<std::unique_ptr<client::RefitSession>> session = absl::UnknownError("not begun");
    if (rank == 0) {
      session = fanout ? fan->Begin(manifest) : control->Begin(manifest);
      if (session.ok() && ranks > 1) {
        std::string tmp = session_file + ".tmp";
        std::FILE* f = std::fopen(tmp.c_str(), "w");
        if (f == nullptr) return Fail(absl::StrCat("cannot write ", tmp));
        std::fprintf(f, "%llu\n", static_cast<unsigned long long>((*session)->id()));
        std::fclose(f);
        std::rename(tmp.c_str(), session_file.c_str());
      }
    } else {
      unsigned long long id = 0;
      for (int tries = 0; tries < 6000 && id == 0; ++tries) {
        if (std::FILE* f = std::fopen(session_file.c_str(), "r")) {
          if (std::fscanf(f, "%llu", &id) != 1) id = 0;
          std::fclose(f);
        }
        if (id == 0) usleep(10000);
      }
      if (id == 0) return Fail(absl::StrCat("no session id in ", session_file));
      session = control->Join(id);
    }
    if (!session.ok()) return Fail(session.status().message());
    (*session)->MeasureAmax(measure_amax);
    const absl::Time begin_done = absl::Now();
    absl::Time ready = begin_done;  // the weights ready to push (--begin-ahead-ms: that long after Begin)
    if (begin_ahead_ms > 0) {
      absl::SleepFor(absl::Milliseconds(begin_ahead_ms) - (begin_done - begun));
      ready = absl::Now();
      TracePoint("trainer.weights_ready");
    }
    if (fault == "silent") {
      std::fprintf(stderr, "example_trainer: sending nothing after begin (fault injection)\n");
      pause();
    }
    if (fault == "bit-flip") {
      // One bit of the first bucket flips on the wire, after its checksum was announced.
      (*session)->SetWireTamper([](uint32_t seq, std::vector<uint8_t>& bytes) {
        if (seq == 0 && !bytes.empty()) bytes[bytes.size() / 2] ^= 0x10;
      });
    } else if (fault == "garbage") {
      // The data plane carries bytes unrelated to the announced bucket.
      (*session)->SetWireTamper([](uint32_t seq, std::vector<uint8_t>& bytes) {
        uint64_t x = 0x9e3779b97f4a7c15ull + seq;
        for (uint8_t& b : bytes) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          b = static_cast<uint8_t>(x);
        }
      });
    }
    absl::Status pushed;
    bool dropped_slice = false;
    // --slices N: every matrix goes as N slices, as tensor-parallel ranks would push their shards
    // (alternately along dimension 0 and 1; only 0 for device tensors), last slice first.
    auto push = [&](size_t i) -> absl::Status {
      const ConvertedTensor& c = to_send[i];
      if (slices <= 1 || c.shape.size() != 2) {
        // Whole tensors are shared out round-robin (with slices, rank 0 sends the vectors).
        const bool mine = ranks <= 1 || (slices > 1 ? rank == 0 : static_cast<int>(i % ranks) == rank);
        if (!mine) return absl::OkStatus();
        return in_place ? (*session)->PushInPlace({c.name, c.dtype, c.shape, sources[i]})
                        : (*session)->Push({c.name, c.dtype, c.shape, sources[i]});
      }
      const size_t dim = gpu >= 0 ? 0 : i % 2;
      const int64_t rows = c.shape[dim];
      const int parts = static_cast<int>(std::min<int64_t>(slices, rows));
      const uint64_t esize = DTypeSize(c.dtype);
      for (int p = parts; p-- > 0;) {
        if (ranks > 1 && p != rank) continue;  // each rank pushes its own shard
        const int64_t start = rows * p / parts, end = rows * (p + 1) / parts;
        if (fault == "drop-slice" && !dropped_slice && p == 1) {
          dropped_slice = true;
          continue;
        }
        Shape shape = c.shape;
        shape[dim] = end - start;
        TensorSlice slice{static_cast<int32_t>(dim), static_cast<uint64_t>(start), c.shape};
        std::vector<uint8_t> gathered;
        const uint8_t* from = static_cast<const uint8_t*>(sources[i]);
        if (dim == 0) {
          from += static_cast<uint64_t>(start) * static_cast<uint64_t>(c.shape[1]) * esize;
        } else {
          const uint64_t width = static_cast<uint64_t>(end - start) * esize;
          for (int64_t r = 0; r < c.shape[0]; ++r) {
            const uint8_t* row = from + (static_cast<uint64_t>(r) * static_cast<uint64_t>(c.shape[1]) +
                                         static_cast<uint64_t>(start)) * esize;
            gathered.insert(gathered.end(), row, row + width);
          }
          from = gathered.data();
        }
        if (absl::Status st = (*session)->Push({c.name, c.dtype, shape, from, slice}); !st.ok()) return st;
      }
      return absl::OkStatus();
    };
    // --fault withhold: the manifest names every tensor, the last is never sent (refused at commit).
    const size_t send_count = fault == "withhold" && !to_send.empty() ? to_send.size() - 1 : to_send.size();
    for (size_t i = 0; i < send_count && pushed.ok(); ++i) {
      pushed = push(i);
      if (fault == "die-mid-bucket" && i == to_send.size() / 2) {
        (void)(*session)->Flush();
        // Sends leave in the background: a moment for refitd to take what was sent, so that the
        // death comes mid-refit (refitd converting, or waiting for the rest), not before the
        // first bucket reached it.
        usleep(20000);
        std::fprintf(stderr, "example_trainer: dying mid-refit (fault injection)\n");
        _exit(9);
      }
      if (fault == "stall" && i == to_send.size() / 2) {
        (void)(*session)->Flush();
        std::fprintf(stderr, "example_trainer: stalling (fault injection)\n");
        pause();
      }
    }
    if (rank > 0) {
      absl::Status st = pushed.ok() ? (*session)->Detach() : pushed;
      if (!st.ok()) return Fail(st.message());
      std::string done = absl::StrCat(session_file, ".done.", rank);
      if (std::FILE* f = std::fopen(done.c_str(), "w")) std::fclose(f);
      std::printf("{\"rank\":%d,\"outcome\":\"detached\"}\n", rank);
      std::fflush(stdout);
      return 0;
    }
    if (ranks > 1) {
      for (int r = 1; r < ranks; ++r) {
        std::string done = absl::StrCat(session_file, ".done.", r);
        for (int tries = 0; tries < 12000 && access(done.c_str(), F_OK) != 0; ++tries) {
          usleep(10000);
          if (tries % 10 != 9) continue;
          // Stop waiting once the session ended (e.g. a joined rank died): the commit then says why.
          absl::StatusOr<client::DaemonStatus> now = control->Status();
          if (now.ok() && now->active_session != (*session)->id()) break;
        }
      }
    }
    if (fault == "abort") {
      absl::Status st = (*session)->Abort("fault injection: trainer abort");
      RefitReport r;
      r.outcome = Outcome::kAborted;
      std::printf("%s\n", Json(r, refit, false, std::string(st.message()), 0, st.code()).c_str());
      continue;
    }
    const absl::Time push_done = absl::Now();
    absl::StatusOr<RefitReport> report = pushed.ok() ? (*session)->Commit() : absl::StatusOr<RefitReport>(pushed);
    const double push_commit_ms = absl::ToDoubleMilliseconds(absl::Now() - begun);
    // The trainer's own timeline: Begin (manifest sent, refitd planned it), the pushes (packing
    // and every bucket but the last sent), Commit (the last bucket, then refitd's commit).
    const std::string trainer_times =
        absl::StrCat(",\"trainer_begin_ms\":", absl::ToDoubleMilliseconds(begin_done - begun),
                     ",\"trainer_push_ms\":", absl::ToDoubleMilliseconds(push_done - begin_done),
                     ",\"trainer_commit_ms\":", absl::ToDoubleMilliseconds(absl::Now() - push_done),
                     ",\"pushed_in_place_bytes\":", (*session)->pushed_in_place_bytes(),
                     ",\"ready_commit_ms\":", absl::ToDoubleMilliseconds(absl::Now() - ready));
    if (group) {
      // Prepared on every member (staged), or not: then the group version is aborted everywhere.
      std::string line;
      bool ok = false;
      if (!report.ok() || report->outcome != Outcome::kStaged) {
        const std::string why = report.ok() ? report->reason : std::string(report.status().message());
        absl::Status dropped =
            fan->AbortGroup(manifest.tag, absl::StrCat("not prepared everywhere: ", why), group_timeout_ms);
        line = absl::StrCat("{\"refit\":", refit, ",\"tag\":\"", manifest.tag,
                            "\",\"group\":\"aborted\",\"phase\":\"prepare\",\"error\":\"",
                            JsonEscape(why + (dropped.ok() ? "" : absl::StrCat("; ", dropped.message()))), "\"}");
        ok = fault != "none";
      } else {
        absl::StatusOr<client::GroupCommitResult> g =
            fan->CommitGroup(manifest.tag, group_deadline_ms, group_timeout_ms, [&] {
              if (group_fault == "exit-after-copy") {
                std::printf("{\"refit\":%d,\"tag\":\"%s\",\"group\":\"copied\",\"exiting\":true}\n", refit,
                            manifest.tag.c_str());
                std::fflush(stdout);
                _exit(5);
              }
            });
        if (!g.ok()) return Fail(g.status().message());
        line = absl::StrCat("{\"refit\":", refit, ",\"tag\":\"", manifest.tag, "\",\"group\":\"", g->outcome,
                            "\",\"phase\":\"commit\",\"error\":\"", JsonEscape(g->error), "\"}");
        ok = g->outcome == "committed" || fault != "none";
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      if (!ok) ++unexpected;
      continue;
    }
    if (!report.ok()) {
      RefitReport r;
      r.outcome = Outcome::kRefused;
      std::printf("%s\n", Json(r, refit, false, std::string(report.status().message()), 0, report.status().code()).c_str());
      std::fflush(stdout);
      if (fault == "none") ++unexpected;
      continue;
    }
    if (report->outcome == Outcome::kStaged) {
      // Held in refitd's staging: the engine is unchanged until `refitctl commit TAG`.
      std::string line = Json(*report, refit, false, "", push_commit_ms);
      line.insert(line.size() - 1, trainer_times);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      if (fault != "none") ++unexpected;
      continue;
    }
    if (!verify) {
      std::string line = Json(*report, refit, false, "not verified", push_commit_ms);
      line.insert(line.size() - 1, trainer_times);
      if (daemons.size() > 1) {
        // No offline conversion to compare with; every engine must at least hold the same bytes.
        bool equal = true;
        std::vector<client::ParamChecksum> first;
        for (client::TrainerClient* d : daemons) {
          absl::StatusOr<std::pair<uint64_t, std::vector<client::ParamChecksum>>> sums = d->Checksums();
          if (!sums.ok()) return Fail(sums.status().message());
          if (d == control) {
            first = sums->second;
            continue;
          }
          equal = equal && sums->second.size() == first.size();
          for (size_t k = 0; equal && k < first.size(); ++k) {
            equal = sums->second[k].name == first[k].name && sums->second[k].checksum == first[k].checksum;
          }
        }
        line.insert(line.size() - 1, absl::StrCat(",\"daemons\":", daemons.size(), ",\"engines_equal\":",
                                                  equal ? "true" : "false"));
        if (!equal) ++unexpected;
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      continue;
    }
    // Read every engine's bytes back through its refitd and compare with the offline conversion.
    bool match = true;
    for (client::TrainerClient* d : daemons) {
      absl::StatusOr<std::pair<uint64_t, std::vector<client::ParamChecksum>>> sums = d->Checksums();
      if (!sums.ok()) return Fail(sums.status().message());
      match = match && sums->second.size() == expected.size() && (d != control || sums->first == report->version);
      for (const client::ParamChecksum& p : sums->second) {
        auto it = expected.find(p.name);
        if (it == expected.end() || it->second != p.checksum) match = false;
      }
    }
    std::string line = Json(*report, refit, match, "", push_commit_ms);
    line.insert(line.size() - 1, trainer_times);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (fault != "none" || !match) ++unexpected;
  }
  return unexpected == 0 ? 0 : 4;
}
