#include "formats/quantize_file.h"

#include <algorithm>
#include <memory>
#include <set>

#include "common/status_macros.h"
#include "formats/format_info.h"
#include "formats/message.h"

namespace refit::formats {
namespace {

// Why `e` stays unquantized, or empty when the format takes it; fills `plan` then.
absl::StatusOr<std::string> Decide(const QuantizeFileOptions& o, const SafetensorsView& view,
                                   const SafetensorsEntry& e, std::vector<OutputSpec>* plan) {
  if (!IsFloating(e.dtype)) return Msg("not a floating tensor (", DTypeName(e.dtype), ")");
  const FormatInfo& info = Info(o.format);
  if (info.quantized && e.shape.size() < 2) {
    return Msg("rank ", e.shape.size(), " (", FormatName(o.format), " takes rank >= 2)");
  }
  absl::StatusOr<std::vector<OutputSpec>> p = PlanOutputs(o.format, e.dtype, e.shape);
  if (!p.ok()) return std::string(p.status().message());
  if (info.global_amax == GlobalAmax::kNonzero) {
    REFIT_ASSIGN_OR_RETURN(float amax, Amax(view.Tensor(e), o.quantize, e.name));
    if (amax == 0.0f) return Msg("all zeros: ", info.name, " block scales would be 0/0");
  }
  *plan = std::move(*p);
  return std::string();
}

}  // namespace

absl::StatusOr<std::vector<TensorReport>> QuantizeFile(const std::string& in_path,
                                                       const std::string& out_path,
                                                       const QuantizeFileOptions& options) {
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                         SafetensorsFile::Open(in_path, options.limits));
  const SafetensorsView& view = file->view();
  std::vector<TensorReport> reports;
  std::vector<SafetensorsWriteEntry> writes;
  std::set<std::string> names;
  const Format format = options.format;
  const QuantizeOptions qopts = options.quantize;
  for (const SafetensorsEntry& e : view.tensors()) {
    std::vector<OutputSpec> plan;
    REFIT_ASSIGN_OR_RETURN(std::string reason, Decide(options, view, e, &plan));
    TensorReport report{e.name, reason.empty() ? TensorReport::Action::kQuantized
                                               : TensorReport::Action::kCopied,
                        reason, {}};
    if (!reason.empty()) {
      writes.push_back({e.name, e.dtype, e.shape, view.Data(e), nullptr});
      report.outputs.push_back(e.name);
    } else {
      // All outputs of one tensor come from one Quantize call: the first output's fill runs
      // it into a shared buffer, later fills copy their part out.
      auto parts = std::make_shared<std::vector<std::vector<uint8_t>>>();
      const ConstTensor in = view.Tensor(e);
      auto produce = [parts, plan, in, format, qopts, name = e.name]() -> absl::Status {
        if (!parts->empty()) return absl::OkStatus();
        parts->resize(plan.size());
        std::vector<MutableBytes> outs;
        for (size_t i = 0; i < plan.size(); ++i) {
          (*parts)[i].resize(plan[i].bytes);
          outs.push_back({(*parts)[i].data(), plan[i].bytes});
        }
        return Quantize(format, in, qopts, std::nullopt, outs, name);
      };
      for (size_t i = 0; i < plan.size(); ++i) {
        SafetensorsWriteEntry w{e.name + plan[i].suffix, plan[i].dtype, plan[i].shape, {}, nullptr};
        w.fill = [parts, produce, i](std::span<uint8_t> dst) -> absl::Status {
          REFIT_RETURN_IF_ERROR(produce());
          std::copy((*parts)[i].begin(), (*parts)[i].end(), dst.begin());
          (*parts)[i] = std::vector<uint8_t>();  // release as soon as written
          return absl::OkStatus();
        };
        report.outputs.push_back(w.name);
        writes.push_back(std::move(w));
      }
    }
    reports.push_back(std::move(report));
  }
  for (const SafetensorsWriteEntry& w : writes) {
    if (!names.insert(w.name).second) {
      return absl::InvalidArgumentError(Msg(
          "output tensor name '", w.name, "' is produced twice (an input tensor already has that name)"));
    }
  }
  SafetensorsWriteOptions wopts;
  wopts.metadata = view.metadata();
  REFIT_RETURN_IF_ERROR(WriteSafetensors(out_path, writes, wopts));
  return reports;
}

}  // namespace refit::formats
