#include "refitctl/convert_command.h"

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "formats/safetensors.h"
#include "refit/checkpoint_io.h"
#include "refit/offline.h"
#include "spec/model_spec.h"

ABSL_FLAG(std::string, spec, "", "the model spec (required; deploy/models/*.yaml)");
ABSL_FLAG(bool, engine_layout, false,
          "also write engine.safetensors: the parameters an engine holds after refitting IN");

namespace refit::refitctl {
namespace {

int Usage(std::string_view problem) { return UsageError(kConvertCommand, problem); }

int Fail(absl::string_view msg) {
  std::cerr << "refitctl convert: " << std::string(msg) << "\n";
  return kExitFailure;
}

}  // namespace

int RunConvert(std::span<const std::string> paths) {
  const std::string spec_path = absl::GetFlag(FLAGS_spec);
  const bool engine_layout = absl::GetFlag(FLAGS_engine_layout);
  if (spec_path.empty()) return Usage("--spec is required");
  absl::StatusOr<spec::ModelSpec> spec = spec::LoadModelSpecFile(spec_path);
  if (!spec.ok()) return Fail(spec.status().message());
  absl::StatusOr<std::unique_ptr<Checkpoint>> in = Checkpoint::Open(paths[0]);
  if (!in.ok()) return Fail(in.status().message());
  absl::StatusOr<std::vector<ConvertedTensor>> converted = ConvertCheckpoint(*spec, (*in)->tensors());
  if (!converted.ok()) return Fail(converted.status().message());
  const std::vector<storage::ParamInfo> infos = (*in)->infos();
  absl::Status written = WriteConvertedCheckpoint(paths[1], *spec, infos, *converted);
  if (!written.ok()) return Fail(written.message());
  for (const ConvertedTensor& t : *converted) {
    std::cout << t.name << " " << DTypeName(t.dtype) << ShapeString(t.shape) << "\n";
  }
  if (engine_layout) {
    absl::StatusOr<std::vector<ConvertedTensor>> engine = EngineLayout(*spec, infos, ByName(*converted));
    if (!engine.ok()) return Fail(engine.status().message());
    std::vector<formats::SafetensorsWriteEntry> entries;
    for (const ConvertedTensor& t : *engine) entries.push_back({t.name, t.dtype, t.shape, t.bytes, nullptr});
    formats::SafetensorsWriteOptions options;
    options.order = formats::HeaderOrder::kSortedByName;
    absl::Status st = formats::WriteSafetensors(
        (std::filesystem::path(paths[1]) / "engine.safetensors").string(), entries, options);
    if (!st.ok()) return Fail(st.message());
  }
  return kExitOk;
}

}  // namespace refit::refitctl
