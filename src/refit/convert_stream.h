// Offline conversion of a whole checkpoint straight to disk (`refitctl convert`): tensor by
// tensor, on a pool of worker threads, with bounded memory, into one safetensors file or HF-style
// shards with a model.safetensors.index.json.
//
// Bytes: every output tensor is what ConvertCheckpoint gives (the same resolve and convert
// functions), and the files are laid out as WriteConvertedCheckpoint writes them (tensors sorted
// by name, metadata {"format": "pt"}): a checkpoint that fits one shard is written as
// model.safetensors, byte for byte what the in-memory path writes, whatever the thread count.
//
// Memory: inputs are read through the checkpoint's read-only mapping and each input's pages are
// dropped from this process (madvise DONTNEED) once it is converted; converted bytes are held
// only until written. At most `threads + 1` input tensors' outputs are held at once (an input
// whose outputs are not adjacent in name order stays held until its last output is written), so
// the bound is about (threads + 2) x the largest tensor's converted size, plus one write buffer
// of the largest output tensor, independent of the checkpoint's size.
//
// Thread-safety: one call converts one checkpoint; calls are independent.
#ifndef REFIT_REFIT_CONVERT_STREAM_H_
#define REFIT_REFIT_CONVERT_STREAM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "refit/checkpoint_io.h"
#include "spec/model_spec.h"
#include "storage/engine_storage.h"

namespace refit {

// Hugging Face's default max_shard_size ("5GB": decimal gigabytes).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

struct ConvertProgress {
  uint64_t tensors_done = 0;  // output tensors written
  uint64_t tensors = 0;
  uint64_t bytes_done = 0;    // output bytes written
  uint64_t bytes = 0;
  uint32_t shard = 0;         // the shard being written (1-based)
  uint32_t shards = 0;
};

struct StreamConvertOptions {
  int threads = 0;  // conversion workers; 0: the machine's cores
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;  // tensor bytes per shard (a larger tensor gets a shard of its own)
  // The model's config.json: when given, the output's config.json is it with the conversion's
  // quantization_config (replacing any it had, removed when nothing is quantized), so that the
  // output directory loads in an engine as it is; without it config.json holds only
  // quantization_config.
  std::string model_config_path;
  // Called on the calling thread after each output tensor is written (and once before the first).
  std::function<void(const ConvertProgress&)> on_progress;
};

struct StreamConvertResult {
  std::vector<std::string> files;              // written, relative to the output directory
  std::vector<storage::ParamInfo> tensors;     // every output tensor, sorted by name
  uint64_t bytes = 0;                          // output tensor bytes
  int threads = 0;
};

// Parses a shard size: bytes ("1000000"), or a number with a unit, decimal (KB, MB, GB, TB) or
// binary (KiB, MiB, GiB, TiB), as HF's max_shard_size takes them. Errors name the text.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

// Converts every tensor of `in` under `spec` into `out_dir` (created if missing): model.safetensors
// when the output fits one shard, else model-0000i-of-0000N.safetensors and
// model.safetensors.index.json; then the quantization metadata files. Errors name the tensor;
// a file being written when an error occurs is removed.
absl::StatusOr<StreamConvertResult> ConvertCheckpointToDir(const spec::ModelSpec& spec, const Checkpoint& in,
                                                           const std::string& out_dir,
                                                           const StreamConvertOptions& options = {});

}  // namespace refit

#endif  // REFIT_REFIT_CONVERT_STREAM_H_
