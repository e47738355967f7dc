// An example trainer on the host path: pushes the demo model's BF16 weights to refitd for each
// of N refits (fresh weights every time), commits, and checks the engine's bytes (read back
// through refitd) against the offline conversion of the same weights. One JSON line per refit.
//
//   example_trainer [--address unix:/run/refitd/refitd.sock]... [--fanout] [--refits N] [--seed S] [--spec FILE]
//                   [--prequantized] [--fault none|drop-scale|strand-gate|abort|die-mid-bucket|
//                    duplicate|stall|silent|bit-flip|garbage|partial|drop-slice|withhold] [--gpu N [--in-place] [--vmm
//                    [--vmm-piece-mib N]]]
//                   [--slices N] [--ranks N --rank R --session-file F] [--tag T] [--stage-only] [shape flags]
//   example_trainer --checkpoint DIR --spec FILE [--model-config FILE] [--tp-size N] [--expected CONVERTED_DIR]
//                   [--only PATTERN]...
//                   [--drop NAME]... [--wire bf16|checkpoint] [--wire-fault KIND:TENSOR] [--gpu N] [--slices 2]
//                   [--address ...]
// --checkpoint pushes a model family's trainer checkpoint once (every tensor refits carry, or
// with --only just those matching, as a partial refit; --drop leaves tensors out). The engine
// must then hold the engine layout of CONVERTED_DIR (`refitctl convert` of the same
// checkpoint) for every parameter the refit touched, and its old bytes for every other; an
// engine of several ranks (a spec with tensor_parallel.size and no rank) each rank's part. The
// spec's sizes come from --model-config, else DIR/config.json when there is one; --tp-size N
// gives the engine's size to a spec whose tensor_parallel.size is `engine`.
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
//
// This file: the command line and main; the rest of the trainer: example_trainer_internal.h.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "example_trainer_internal.h"
#include "spec/demo_spec.h"
#include "spec/model_spec.h"

namespace refit::examples {
namespace {

absl::StatusOr<TrainerFlags> ParseFlags(int argc, char** argv) {
  TrainerFlags flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--address" && i + 1 < argc) {
      flags.address = argv[++i];
      flags.addresses.push_back(flags.address);
    } else if (a == "--fanout") {
      flags.fanout = true;
    } else if (a == "--refits" && i + 1 < argc) {
      flags.refits = std::atoi(argv[++i]);
    } else if (a == "--tag" && i + 1 < argc) {
      flags.tag = argv[++i];
    } else if (a == "--stage-only") {
      flags.stage_only = true;
    } else if (a == "--group") {
      flags.group = true;
    } else if (a == "--group-deadline-ms" && i + 1 < argc) {
      flags.group_deadline_ms = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--group-timeout-ms" && i + 1 < argc) {
      flags.group_timeout_ms = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--group-fault" && i + 1 < argc) {
      flags.group_fault = argv[++i];
      if (flags.group_fault != "none" && flags.group_fault != "exit-after-copy") {
        return absl::InvalidArgumentError("--group-fault takes none or exit-after-copy");
      }
    } else if (a == "--wire" && i + 1 < argc) {
      const std::string w = argv[++i];
      if (w != "bf16" && w != "checkpoint") return absl::InvalidArgumentError("--wire takes bf16 or checkpoint");
      flags.wire = w == "checkpoint" ? WireFormat::kCheckpoint : WireFormat::kBf16;
    } else if (a == "--wire-fault" && i + 1 < argc) {
      flags.wire_fault = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      flags.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--spec" && i + 1 < argc) {
      flags.spec_path = argv[++i];
    } else if (a == "--fault" && i + 1 < argc) {
      flags.fault = argv[++i];
    } else if (a == "--dump" && i + 1 < argc) {
      flags.dump_dir = argv[++i];
    } else if (a == "--no-verify") {
      flags.verify = false;
    } else if (a == "--checkpoint" && i + 1 < argc) {
      flags.checkpoint = argv[++i];
    } else if (a == "--expected" && i + 1 < argc) {
      flags.expected_dir = argv[++i];
    } else if (a == "--model-config" && i + 1 < argc) {
      flags.model_config_path = argv[++i];
    } else if (a == "--tp-size" && i + 1 < argc) {
      flags.tp_size = std::atoi(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      flags.only.push_back(argv[++i]);
    } else if (a == "--drop" && i + 1 < argc) {
      flags.drop.push_back(argv[++i]);
    } else if (a == "--prequantized") {
      flags.prequantized = true;
    } else if (a == "--ranks" && i + 1 < argc) {
      flags.ranks = std::atoi(argv[++i]);
    } else if (a == "--rank" && i + 1 < argc) {
      flags.rank = std::atoi(argv[++i]);
    } else if (a == "--session-file" && i + 1 < argc) {
      flags.session_file = argv[++i];
    } else if (a == "--slices" && i + 1 < argc) {
      flags.slices = std::atoi(argv[++i]);
    } else if (a == "--gpu" && i + 1 < argc) {
      flags.gpu = std::atoi(argv[++i]);
    } else if (a == "--measure-amax") {
      flags.measure_amax = true;
    } else if (a == "--begin-ahead-ms" && i + 1 < argc) {
      flags.begin_ahead_ms = std::atoi(argv[++i]);
    } else if (a == "--sleep-wake" && i + 1 < argc) {
      flags.sleep_wake = argv[++i];
    } else if (a == "--in-place") {
      flags.in_place = true;
    } else if (a == "--vmm") {
      flags.vmm = true;
    } else if (a == "--vmm-piece-mib" && i + 1 < argc) {
      flags.vmm_piece_bytes = std::strtoull(argv[++i], nullptr, 10) << 20;
    } else if (!demo::ParseShapeFlag(argc, argv, i, flags.shape)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
  }
  return flags;
}

int Main(int argc, char** argv) {
  absl::StatusOr<TrainerFlags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) return Fail(parsed.status().message());
  TrainerFlags& flags = *parsed;
  // The conversion the engine's bytes must equal (the demo spec's formats).
  if (flags.model_config_path.empty() && !flags.checkpoint.empty() &&
      std::filesystem::exists(std::filesystem::path(flags.checkpoint) / "config.json")) {
    flags.model_config_path = (std::filesystem::path(flags.checkpoint) / "config.json").string();
  }
  std::optional<spec::ModelConfig> model_config;
  if (!flags.model_config_path.empty()) {
    absl::StatusOr<spec::ModelConfig> c = spec::LoadModelConfigFile(flags.model_config_path);
    if (!c.ok()) return Fail(c.status().message());
    model_config = std::move(*c);
  }
  absl::StatusOr<spec::ModelSpec> spec =
      flags.spec_path.empty()
          ? spec::ParseModelSpec(spec::kDemoModelSpec)
          : spec::LoadModelSpecFile(flags.spec_path, {.model_config = model_config ? &*model_config : nullptr});
  if (spec.ok() && flags.tp_size > 0) spec = spec::WithEngineSize(*spec, flags.tp_size);
  if (!spec.ok()) return Fail(spec.status().message());
  if (!flags.dump_dir.empty()) return DumpWeights(flags, *spec);
  if (!flags.checkpoint.empty()) {
    return RunCheckpoint(flags.address, *spec, flags.checkpoint, flags.expected_dir, flags.only, flags.drop, flags.wire,
                         flags.wire_fault, flags.gpu, flags.slices);
  }
  return RunRefits(std::move(flags), *spec);
}

}  // namespace

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

std::string Json(const RefitReport& r, int refit, bool match, const std::string& error, double push_commit_ms,
                 absl::StatusCode code) {
  return absl::StrCat(
      "{\"push_commit_ms\":", push_commit_ms, ",\"refit\":", refit, ",\"session\":", r.session_id,
      ",\"version\":", r.version, ",\"tag\":\"", JsonEscape(r.tag), "\"", ",\"outcome\":\"", OutcomeName(r.outcome),
      "\",\"bytes_in\":", r.bytes_in, ",\"bytes_out\":", r.bytes_out, ",\"bytes_in_place\":", r.bytes_in_place,
      ",\"buckets\":", r.buckets, ",\"tensors\":", r.tensors, ",\"receive_ms\":", r.times.receive_ms,
      ",\"convert_ms\":", r.times.convert_ms, ",\"validate_ms\":", r.times.validate_ms,
      ",\"commit_ms\":", r.times.commit_ms, ",\"pause_ms\":", r.times.pause_ms, ",\"total_ms\":", r.times.total_ms,
      ",\"plan_ms\":", r.times.plan_ms, ",\"finish_ms\":", r.times.finish_ms, ",\"prepare_ms\":", r.times.prepare_ms,
      ",\"engine_matches_expected\":", match ? "true" : "false", ",\"error\":\"", JsonEscape(error), "\"",
      code == absl::StatusCode::kOk ? "" : absl::StrCat(",\"code\":\"", absl::StatusCodeToString(code), "\""), "}");
}

}  // namespace refit::examples

int main(int argc, char** argv) { return refit::examples::Main(argc, argv); }
