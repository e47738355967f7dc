#include "refitctl/convert_command.h"

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "refit/checkpoint_io.h"
#include "refit/offline.h"
#include "spec/model_spec.h"

namespace refit::refitctl {
namespace {

int Usage(std::string_view problem) {
  std::cerr << "refitctl convert: " << problem << "\nusage: refitctl convert " << kConvertCommand.usage << "\n";
  return kExitUsage;
}

int Fail(absl::string_view msg) {
  std::cerr << "refitctl convert: " << std::string(msg) << "\n";
  return kExitFailure;
}

}  // namespace

int RunConvert(std::span<const std::string_view> args) {
  std::string spec_path;
  bool engine_layout = false;
  std::vector<std::string> paths;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--spec") {
      if (i + 1 >= args.size()) return Usage("--spec needs a value");
      spec_path = std::string(args[++i]);
    } else if (a == "--engine-layout") {
      engine_layout = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return Usage("unknown option '" + std::string(a) + "'");
    } else {
      paths.emplace_back(a);
    }
  }
  if (spec_path.empty()) return Usage("--spec is required");
  if (paths.size() != 2) return Usage("expected IN and OUT_DIR");
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
