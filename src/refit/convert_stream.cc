#include "refit/convert_stream.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "refit/convert.h"
#include "refit/resolve.h"

namespace refit {
namespace {

// Drops the pages of [p, p + n) from this process: they were read through a read-only file
// mapping, so the kernel re-reads them if touched again. Keeps the resident set bounded while
// a checkpoint larger than memory streams through.
void DropPages(const void* p, uint64_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

struct Output {
  storage::ParamInfo info;
  size_t input = 0;  // the input tensor it comes from
  size_t index = 0;  // its place among that input's outputs
};

// Input tensors handed to workers in the order the writer first needs them, at most `window`
// held (converted, not yet fully written) at once, plus the one the writer waits for.
class Pipeline {
 public:
  Pipeline(const spec::ModelSpec& spec, const std::vector<InputTensor>& inputs,
           const std::vector<Resolution>& resolved, const std::vector<std::optional<float>>& amax,
           std::vector<size_t> start_order, std::vector<size_t> outputs_per_input, size_t window)
      : spec_(spec),
        inputs_(inputs),
        resolved_(resolved),
        amax_(amax),
        order_(std::move(start_order)),
        remaining_(std::move(outputs_per_input)),
        window_(window),
        slots_(inputs.size()) {}

  void Run(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }

  ~Pipeline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  // Copies output `index` of input `input` into `out`, waiting for its conversion.
  absl::Status Take(size_t input, size_t index, std::span<uint8_t> out) {
    std::unique_lock<std::mutex> lock(mu_);
    wanted_ = input;
    cv_.notify_all();
    cv_.wait(lock, [&] { return slots_[input].done || !failure_.ok(); });
    if (!slots_[input].done) return failure_;
    Slot& s = slots_[input];
    if (!s.result.ok()) return s.result.status();
    const std::vector<uint8_t>& bytes = (*s.result)[index].bytes;
    if (bytes.size() != out.size()) {
      return absl::InternalError(absl::StrCat("tensor '", (*s.result)[index].name, "': converted ", bytes.size(),
                                              " bytes, planned ", out.size()));
    }
    std::memcpy(out.data(), bytes.data(), bytes.size());
    (*s.result)[index].bytes = std::vector<uint8_t>();  // written: freed now
    if (--remaining_[input] == 0) {
      s.result = std::vector<ConvertedTensor>();
      --held_;
      cv_.notify_all();
    }
    return absl::OkStatus();
  }

 private:
  struct Slot {
    bool done = false;
    absl::StatusOr<std::vector<ConvertedTensor>> result;
  };

  void Work() {
    while (true) {
      size_t input;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return stop_ || !failure_.ok() ||
                 (next_ < order_.size() && (held_ < window_ || order_[next_] == wanted_));
        });
        if (stop_ || !failure_.ok()) return;
        input = order_[next_++];
        ++held_;
      }
      const InputTensor& in = inputs_[input];
      absl::StatusOr<std::vector<ConvertedTensor>> r = ConvertResolved(spec_, resolved_[input], in, amax_[input]);
      DropPages(in.data, *DenseBytes(in.dtype, in.shape));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!r.ok() && failure_.ok()) failure_ = r.status();
        slots_[input].result = std::move(r);
        slots_[input].done = true;
      }
      cv_.notify_all();
    }
  }

  const spec::ModelSpec& spec_;
  const std::vector<InputTensor>& inputs_;
  const std::vector<Resolution>& resolved_;
  const std::vector<std::optional<float>>& amax_;
  const std::vector<size_t> order_;
  std::vector<size_t> remaining_;  // outputs not yet written, per input
  const size_t window_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  size_t next_ = 0;  // into order_
  size_t held_ = 0;  // inputs started and not fully written
  size_t wanted_ = SIZE_MAX;
  absl::Status failure_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

std::string ShardName(size_t i, size_t n) { return absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n); }

// The model's config.json (at `path`) with the quantization_config of `meta`'s config.json in
// place of any it had (removed when the conversion wrote none). Errors name the file.
absl::StatusOr<std::string> WithModelConfig(const std::string& path, const std::map<std::string, std::string>& meta) {
  constexpr uint64_t kMaxConfigBytes = 64u << 20;
  REFIT_ASSIGN_OR_RETURN(std::string text, ReadBoundedFile(path, kMaxConfigBytes, "model config"));
  nlohmann::json model = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (model.is_discarded() || !model.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("model config '", path, "' is not a JSON object"));
  }
  model.erase("quantization_config");
  if (auto it = meta.find("config.json"); it != meta.end()) {
    const nlohmann::json written = nlohmann::json::parse(it->second);
    if (written.contains("quantization_config")) model["quantization_config"] = written["quantization_config"];
  }
  return model.dump(2);
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  char* end = nullptr;
  const double value = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  static const std::map<std::string, double> kUnits = {
      {"", 1},          {"B", 1},          {"KB", 1e3},       {"MB", 1e6},       {"GB", 1e9},
      {"TB", 1e12},     {"KIB", 1024.0},   {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (value <= 0 || end == nullptr || *end != '\0' || it == kUnits.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a size (bytes, or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB)"));
  }
  const double bytes = value * it->second;
  if (bytes < 1 || bytes > 1.8e19) return absl::InvalidArgumentError(absl::StrCat("'", text, "' is out of range"));
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<StreamConvertResult> ConvertCheckpointToDir(const spec::ModelSpec& spec, const Checkpoint& in,
                                                           const std::string& out_dir,
                                                           const StreamConvertOptions& options) {
  const std::vector<InputTensor>& inputs = in.tensors();
  // Plan: every input resolved (errors before anything is written), its outputs' names and
  // sizes, fused groups' amax.
  std::vector<Resolution> resolved;
  std::vector<Output> outputs;
  std::vector<size_t> per_input(inputs.size(), 0);
  std::map<std::string, float> group_amax;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputTensor& t = inputs[i];
    REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, t.name, t.dtype, t.shape));
    for (const ResolvedOutput& o : r.outputs) {
      REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(o.dtype, o.full_shape));
      outputs.push_back({{o.checkpoint_name, o.dtype, o.full_shape, n}, i, per_input[i]++});
    }
    if (!r.amax_group.empty()) {
      REFIT_ASSIGN_OR_RETURN(float a, TensorAmax(formats::ConstTensor{t.dtype, t.shape, t.data}, spec.options, t.name));
      DropPages(t.data, *DenseBytes(t.dtype, t.shape));
      auto [it, fresh] = group_amax.emplace(r.amax_group_key, a);
      if (!fresh) it->second = std::max(it->second, a);
    }
    resolved.push_back(std::move(r));
  }
  std::vector<std::optional<float>> amax(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!resolved[i].amax_group.empty()) amax[i] = group_amax[resolved[i].amax_group_key];
  }
  std::stable_sort(outputs.begin(), outputs.end(), [](const Output& a, const Output& b) { return a.info.name < b.info.name; });
  for (size_t i = 1; i < outputs.size(); ++i) {
    if (outputs[i].info.name == outputs[i - 1].info.name) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", outputs[i].info.name, "': duplicate tensor name"));
    }
  }
  // Inputs in the order the writer first needs them.
  std::vector<size_t> start_order;
  {
    std::vector<bool> seen(inputs.size(), false);
    for (const Output& o : outputs) {
      if (!seen[o.input]) {
        seen[o.input] = true;
        start_order.push_back(o.input);
      }
    }
  }
  // Shards: consecutive runs of outputs in name order, each at most max_shard_bytes of tensor
  // data unless one tensor alone is larger.
  std::vector<std::pair<size_t, size_t>> shards;  // [begin, end) into outputs
  uint64_t total = 0;
  {
    uint64_t in_shard = 0;
    size_t begin = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const uint64_t n = outputs[i].info.nbytes;
      if (i > begin && in_shard + n > options.max_shard_bytes) {
        shards.push_back({begin, i});
        begin = i;
        in_shard = 0;
      }
      in_shard += n;
      total += n;
    }
    shards.push_back({begin, outputs.size()});
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", out_dir, "': ", ec.message()));
  REFIT_ASSIGN_OR_RETURN(auto meta, QuantMetadata(spec, in.infos()));
  if (!options.model_config_path.empty()) {
    REFIT_ASSIGN_OR_RETURN(meta["config.json"], WithModelConfig(options.model_config_path, meta));
  }

  StreamConvertResult result;
  result.threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  result.bytes = total;
  for (const Output& o : outputs) result.tensors.push_back(o.info);

  Pipeline pipeline(spec, inputs, resolved, amax, start_order, per_input, static_cast<size_t>(result.threads) + 1);
  pipeline.Run(result.threads);

  ConvertProgress progress;
  progress.tensors = outputs.size();
  progress.bytes = total;
  progress.shards = static_cast<uint32_t>(shards.size());
  progress.shard = 1;
  if (options.on_progress) options.on_progress(progress);
  const std::filesystem::path dir(out_dir);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors" : ShardName(s, shards.size());
    progress.shard = static_cast<uint32_t>(s + 1);
    std::vector<formats::SafetensorsWriteEntry> entries;
    for (size_t i = shards[s].first; i < shards[s].second; ++i) {
      const Output& o = outputs[i];
      weight_map[o.info.name] = file;
      entries.push_back({o.info.name, o.info.dtype, o.info.shape, {}, [&, &o = o](std::span<uint8_t> out) {
                           REFIT_RETURN_IF_ERROR(pipeline.Take(o.input, o.index, out));
                           ++progress.tensors_done;
                           progress.bytes_done += out.size();
                           if (options.on_progress) options.on_progress(progress);
                           return absl::OkStatus();
                         }});
    }
    formats::SafetensorsWriteOptions wo;
    wo.order = formats::HeaderOrder::kGiven;  // already sorted by name
    wo.metadata = {{"format", "pt"}};
    REFIT_RETURN_IF_ERROR(formats::WriteSafetensors((dir / file).string(), entries, wo));
    result.files.push_back(file);
  }
  if (shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream f(dir / "model.safetensors.index.json");
    f << index.dump(2) << "\n";
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write '", (dir / "model.safetensors.index.json").string(), "'"));
    result.files.push_back("model.safetensors.index.json");
  }
  for (const auto& [file, text] : meta) {
    std::ofstream f(dir / file);
    f << text << "\n";
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write '", (dir / file).string(), "'"));
    result.files.push_back(file);
  }
  return result;
}

}  // namespace refit
