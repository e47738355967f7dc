// What the example trainer's sources share (example_trainer.cc: the command line and main;
// example_trainer_checkpoint.cc: --checkpoint, a model family's checkpoint pushed once;
// example_trainer_weights.cc: each demo refit's weights, the engine bytes they must give, and
// their copy on the GPU; example_trainer_refits.cc: the demo refits, begin to commit and check).
// Not a library: the example_trainer binary's own parts.
//
// Threading: one thread, as the trainer client's (the weights are generated on every core inside
// MakeRefitWeights).
#ifndef REFIT_TOOLS_EXAMPLES_EXAMPLE_TRAINER_INTERNAL_H_
#define REFIT_TOOLS_EXAMPLES_EXAMPLE_TRAINER_INTERNAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/control_connect.h"
#include "demo_model.h"
#include "refit/offline.h"
#include "refit/types.h"
#include "spec/model_spec.h"

namespace refit::examples {

// The command line (example_trainer.cc's opening comment says what each flag does).
struct TrainerFlags {
  std::string address = refit::kDefaultControlAddress, spec_path, fault = "none", checkpoint, expected_dir,
              model_config_path;
  std::vector<std::string> only, drop, addresses;
  bool fanout = false;
  int refits = 3;
  int tp_size = 0;          // --tp-size: the engine's size, for a spec whose tensor_parallel.size is `engine`
  std::string tag;          // --tag T: each refit's manifest tag (T, or T-<refit> with several refits)
  bool stage_only = false;  // --stage-only: hold each refit in refitd's staging (hold: K) under its tag
  bool group = false;       // --group: the daemons are one engine group's members (two-phase commit)
  uint32_t group_deadline_ms = 0, group_timeout_ms = 0;
  std::string group_fault = "none";
  WireFormat wire = WireFormat::kBf16;  // --wire (with --checkpoint)
  std::string wire_fault;               // --wire-fault KIND:TENSOR (with --checkpoint)
  int gpu = -1;                         // --gpu: weights on this GPU
  bool in_place = false;                // --in-place: whole device tensors go by RefitSession::PushInPlace
  bool vmm = false;                     // --vmm: the weights' allocation is CUDA virtual memory
  uint64_t vmm_piece_bytes = 0;         // --vmm-piece-mib: ... mapped in pieces of this size
  int slices = 1;                       // --slices: push matrices in this many slices
  int ranks = 1, rank = 0;              // --ranks/--rank: this process pushes its share of one session
  std::string session_file;             // --session-file: where rank 0 publishes the session id
  uint64_t seed = 1;
  bool prequantized = false;
  bool verify = true;         // compute the expected conversion and compare the engine's bytes
  bool measure_amax = false;  // --measure-amax: announce each BF16 tensor's amax (single-pass NVFP4)
  int begin_ahead_ms = 0;     // --begin-ahead-ms: Begin this long before the weights are pushed
  std::string sleep_wake;     // --sleep-wake: sleep the engine between refits, wake it before each (FIFOs)
  std::string dump_dir;
  demo::ModelShape shape;
};

// Prints "example_trainer: <msg>" on stderr; returns the exit code 1.
int Fail(absl::string_view msg);

// One JSON line of a refit's report.
std::string JsonEscape(const std::string& in);
std::string Json(const RefitReport& r, int refit, bool match, const std::string& error, double push_commit_ms = 0,
                 absl::StatusCode code = absl::StatusCode::kOk);

// --checkpoint: pushes the checkpoint at `checkpoint` once and checks the engine; the exit code.
int RunCheckpoint(const std::string& address, const spec::ModelSpec& spec, const std::string& checkpoint,
                  const std::string& expected_dir, const std::vector<std::string>& only,
                  const std::vector<std::string>& drop, WireFormat wire, const std::string& wire_fault, int gpu,
                  int slices);

// --dump: writes the first refit's weights and their offline conversion; sends nothing. The exit code.
int DumpWeights(const TrainerFlags& flags, const spec::ModelSpec& spec);

// One demo refit: what is sent, its manifest, and the engine's expected bytes (checksum by
// parameter name; empty without verification).
struct RefitWeights {
  std::map<std::string, uint64_t> expected;
  std::vector<ConvertedTensor> to_send;
  Manifest manifest;
};

// Refit number `refit`'s weights for the daemon serving `model`, the fault (--fault) applied.
absl::Status MakeRefitWeights(const TrainerFlags& flags, const spec::ModelSpec& spec, const std::string& model,
                              int refit, RefitWeights* out);

#if REFIT_HAVE_CUDA
// --gpu: the weights' one allocation on the GPU, kept across refits as a trainer keeps its parameters.
struct DeviceWeights {
  std::shared_ptr<void> memory;
  uint64_t bytes = 0;
};

// Writes `to_send` into `device` (growing it when too small); `sources` then points at each
// tensor's place there.
absl::Status PlaceOnGpu(const TrainerFlags& flags, const std::vector<ConvertedTensor>& to_send, DeviceWeights* device,
                        std::vector<const void*>* sources);
#endif

// The demo refits (every mode but --checkpoint and --dump); the exit code.
int RunRefits(TrainerFlags flags, const spec::ModelSpec& spec);

}  // namespace refit::examples

#endif  // REFIT_TOOLS_EXAMPLES_EXAMPLE_TRAINER_INTERNAL_H_
