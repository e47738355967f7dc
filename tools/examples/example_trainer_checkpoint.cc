// example_trainer --checkpoint: a model family's trainer checkpoint pushed once (whole, or the
// tensors --only selects as a partial refit; --drop, --wire, --wire-fault, --gpu and --slices as
// example_trainer.cc's opening comment says), then the engine's bytes checked against the
// converted checkpoint (--expected).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#if REFIT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include "common/checksum.h"
#include "example_trainer_internal.h"
#include "formats/format_info.h"
#include "refit/checkpoint_io.h"
#include "refit/convert.h"
#include "refit/offline.h"
#include "refit/resolve.h"
#include "spec/model_spec.h"

namespace refit::examples {
namespace {

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
  for (const formats::OutputSpec& o : *specs) {
    outs.push_back({t.name + o.suffix, o.dtype, o.shape, std::vector<uint8_t>(o.bytes)});
  }
  for (ConvertedTensor& o : outs) bufs.push_back({o.bytes.data(), o.bytes.size()});
  absl::Status st =
      ConvertFull(ConvertStep{ConvertKind::kQuantize, format, r->transpose},
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

}  // namespace

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
  for (const InputTensor* t : send) {
    sent_infos.push_back({t->name, t->dtype, t->shape, *DenseBytes(t->dtype, t->shape)});
  }
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
    for (const InputTensor* t : pushed) {
      manifest.tensors.push_back({t->name, t->dtype, t->shape, 0, *DenseBytes(t->dtype, t->shape)});
    }
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
          const std::optional<float> a =
              part == 1 && slice_amax_fault && amax ? std::optional<float>(2.0f * *amax) : amax;
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
    std::vector<std::string> group =
        wire == WireFormat::kCheckpoint ? (*session)->AmaxGroup(t.name) : std::vector<std::string>{};
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
  absl::StatusOr<RefitReport> report =
      push_status.ok() ? (*session)->Commit() : absl::StatusOr<RefitReport>(push_status);
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
  line.insert(line.size() - 1, absl::StrCat(",\"wire_format\":\"", WireFormatName(wire),
                                            "\",\"trainer_converted\":", trainer_converted));
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return match ? 0 : 4;
}

}  // namespace refit::examples
