#include "refitctl/convert_command.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "formats/safetensors.h"
#include "nlohmann/json.hpp"
#include "refit/checkpoint_io.h"
#include "refit/convert_stream.h"
#include "refit/offline.h"
#include "refitctl/common_flags.h"
#include "spec/model_spec.h"

ABSL_FLAG(std::string, spec, "", "the model spec (required; deploy/models/*.yaml)");
ABSL_FLAG(bool, engine_layout, false,
          "also write engine.safetensors: the parameters an engine holds after refitting IN (held in memory whole)");
ABSL_FLAG(int, tp_rank, -1,
          "with --engine-layout: the engine rank whose parameters to write (engine ranks: a spec with "
          "tensor_parallel.size and no rank); -1: the spec's own rank");
ABSL_FLAG(int, tp_size, 0,
          "with --engine-layout: the engine's tensor-parallel size, needed with --tp-rank when the spec's "
          "tensor_parallel.size is 'engine' (a spec that states its size must agree); 0: the spec's");
ABSL_FLAG(int, threads, 0, "conversion worker threads (0: one per core)");
ABSL_FLAG(std::string, max_shard_size, "5GB",
          "largest output shard (bytes, or with KB/MB/GB/TB or KiB/MiB/GiB/TiB); past it the output is "
          "model-0000i-of-0000N.safetensors with model.safetensors.index.json");
ABSL_DECLARE_FLAG(bool, progress);

namespace refit::refitctl {
namespace {

int Usage(std::string_view problem) { return UsageError(kConvertCommand, problem); }

int Fail(absl::string_view msg) {
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << nlohmann::json{{"ok", false}, {"error", std::string(msg)}}.dump() << std::endl;
  } else {
    std::cerr << "refitctl convert: " << std::string(msg) << "\n";
  }
  return kExitFailure;
}

}  // namespace

int RunConvert(std::span<const std::string> paths) {
  const std::string spec_path = absl::GetFlag(FLAGS_spec);
  const bool engine_layout = absl::GetFlag(FLAGS_engine_layout);
  const bool json_output = absl::GetFlag(FLAGS_json);
  const bool progress = !json_output && (absl::GetFlag(FLAGS_progress) || isatty(STDERR_FILENO));
  if (spec_path.empty()) return Usage("--spec is required");
  if (absl::GetFlag(FLAGS_threads) < 0) return Usage("--threads must be 0 (one per core) or more");
  absl::StatusOr<uint64_t> max_shard = ParseByteSize(absl::GetFlag(FLAGS_max_shard_size));
  if (!max_shard.ok()) return Usage(absl::StrCat("--max-shard-size: ", max_shard.status().message()));
  absl::StatusOr<std::optional<spec::ModelConfig>> config = ModelConfigFor(paths[0]);
  if (!config.ok()) return Fail(config.status().message());
  absl::StatusOr<spec::ModelSpec> spec =
      spec::LoadModelSpecFile(spec_path, {.model_config = *config ? &**config : nullptr});
  if (!spec.ok()) return Fail(spec.status().message());
  absl::StatusOr<std::unique_ptr<Checkpoint>> in = Checkpoint::Open(paths[0]);
  if (!in.ok()) return Fail(in.status().message());

  StreamConvertOptions options;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.max_shard_bytes = *max_shard;
  options.model_config_path = ModelConfigPathFor(paths[0]);
  const absl::Time start = absl::Now();
  absl::Time last = absl::InfinitePast();
  options.on_progress = [&](const ConvertProgress& p) {
    const absl::Time now = absl::Now();
    const bool final = p.tensors_done == p.tensors;
    if (!final && now - last < absl::Milliseconds(json_output ? 1000 : 200)) return;
    last = now;
    const double s = absl::ToDoubleSeconds(now - start);
    const double gbps = s > 0 ? static_cast<double>(p.bytes_done) / 1e9 / s : 0;
    if (json_output) {
      std::cout << nlohmann::json{{"event", "progress"}, {"tensors_done", p.tensors_done}, {"tensors", p.tensors},
                                  {"bytes_done", p.bytes_done},  {"bytes", p.bytes},          {"shard", p.shard},
                                  {"shards", p.shards},          {"seconds", s},             {"gb_per_s", gbps}}
                       .dump()
                << std::endl;
    } else if (progress) {
      std::fprintf(stderr, "\rconverting: %llu/%llu tensors, %.2f/%.2f GB, shard %u/%u, %.2f GB/s   ",
                   static_cast<unsigned long long>(p.tensors_done), static_cast<unsigned long long>(p.tensors),
                   static_cast<double>(p.bytes_done) / 1e9, static_cast<double>(p.bytes) / 1e9, p.shard, p.shards,
                   gbps);
    }
  };
  absl::StatusOr<StreamConvertResult> result = ConvertCheckpointToDir(*spec, **in, paths[1], options);
  if (progress) std::fprintf(stderr, "\n");
  if (!result.ok()) return Fail(result.status().message());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (json_output) {
    std::cout << nlohmann::json{{"ok", true},          {"files", result->files},  {"tensors", result->tensors.size()},
                                {"bytes", result->bytes}, {"threads", result->threads}, {"seconds", seconds}}
                     .dump()
              << std::endl;
  } else {
    for (const storage::ParamInfo& t : result->tensors) {
      std::cout << t.name << " " << DTypeName(t.dtype) << ShapeString(t.shape) << "\n";
    }
  }
  if (engine_layout) {
    // The engine layout needs every converted tensor at once: this part holds them in memory.
    absl::StatusOr<std::vector<ConvertedTensor>> converted = ConvertCheckpoint(*spec, (*in)->tensors());
    if (!converted.ok()) return Fail(converted.status().message());
    spec::ModelSpec rank_spec = *spec;
    const int rank = absl::GetFlag(FLAGS_tp_rank);
    if (const int size = absl::GetFlag(FLAGS_tp_size); size > 0) {
      absl::StatusOr<spec::ModelSpec> s = spec::WithEngineSize(*spec, size);
      if (!s.ok()) return Fail(absl::StrCat("--tp-size: ", s.status().message()));
      rank_spec = std::move(*s);
    } else if (spec->tp_size_from_engine && rank >= 0) {
      return Fail("--tp-rank: the spec's tensor_parallel.size is 'engine'; give the engine's size with --tp-size");
    }
    if (rank >= 0) {
      absl::StatusOr<spec::ModelSpec> s = spec::ForRank(rank_spec, rank);
      if (!s.ok()) return Fail(absl::StrCat("--tp-rank: ", s.status().message()));
      rank_spec = std::move(*s);
    }
    absl::StatusOr<std::vector<ConvertedTensor>> engine = EngineLayout(rank_spec, (*in)->infos(), ByName(*converted));
    if (!engine.ok()) return Fail(engine.status().message());
    std::vector<formats::SafetensorsWriteEntry> entries;
    for (const ConvertedTensor& t : *engine) entries.push_back({t.name, t.dtype, t.shape, t.bytes, nullptr});
    formats::SafetensorsWriteOptions wo;
    wo.order = formats::HeaderOrder::kSortedByName;
    absl::Status st =
        formats::WriteSafetensors((std::filesystem::path(paths[1]) / "engine.safetensors").string(), entries, wo);
    if (!st.ok()) return Fail(st.message());
  }
  return kExitOk;
}

}  // namespace refit::refitctl
