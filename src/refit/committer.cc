#include "refit/committer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "refit/derived_build.h"

namespace refit {
namespace {

float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu) != 0) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

absl::Status ComputeDerived(spec::DerivedOp op, const storage::ParamInfo& target, const uint8_t* from, uint8_t* out) {
  (void)op;  // add_one is the only op
  absl::StatusOr<int64_t> n = NumElements(target.shape);
  if (!n.ok()) return n.status();
  switch (target.dtype) {
    case DType::kBF16:
      for (int64_t i = 0; i < *n; ++i) {
        uint16_t h;
        std::memcpy(&h, from + 2 * i, 2);
        uint16_t r = FloatToBf16(Bf16ToFloat(h) + 1.0f);  // exact in fp32, one rounding to bf16
        std::memcpy(out + 2 * i, &r, 2);
      }
      return absl::OkStatus();
    case DType::kF32:
      for (int64_t i = 0; i < *n; ++i) {
        float f;
        std::memcpy(&f, from + 4 * i, 4);
        f += 1.0f;
        std::memcpy(out + 4 * i, &f, 4);
      }
      return absl::OkStatus();
    default:
      return absl::UnimplementedError(absl::StrCat("derived parameter '", target.name, "': add_one on ",
                                                   DTypeName(target.dtype), " is not supported"));
  }
}

absl::StatusOr<Built> AssemblePieces(const spec::Rule& rule, const std::string& name,
                                     const std::vector<const StagedTensor*>& pieces) {
  std::vector<Shape> shapes;
  uint64_t total = 0;
  for (const StagedTensor* t : pieces) {
    if (t->dtype != pieces[0]->dtype) {
      return absl::InvalidArgumentError(absl::StrCat("engine parameter '", name, "': pieces of different dtypes"));
    }
    shapes.push_back(t->shape);
    total += t->nbytes;
  }
  Built b;
  b.dtype = pieces.empty() ? DType::kU8 : pieces[0]->dtype;
  REFIT_ASSIGN_OR_RETURN(b.shape, AssembledShape(rule, shapes));
  b.bytes.resize(total);
  uint64_t off = 0;
  for (const StagedTensor* t : pieces) {
    std::memcpy(b.bytes.data() + off, t->data, t->nbytes);
    off += t->nbytes;
  }
  return b;
}

absl::StatusOr<Built> BuildParam(const Planner& planner, size_t index, const PieceLookup& lookup, bool apply_layout) {
  const ParamSource& src = planner.source(index);
  const std::string& name = planner.params()[index].name;
  std::vector<const StagedTensor*> pieces;
  for (const std::string& key : src.slots) {
    const StagedTensor* t = lookup(key);
    if (t == nullptr) {
      return absl::InternalError(absl::StrCat("engine parameter '", name, "': '", key, "' was not staged"));
    }
    pieces.push_back(t);
  }
  REFIT_ASSIGN_OR_RETURN(Built b, AssemblePieces(*src.rule, name, pieces));
  if (!apply_layout) return b;
  int64_t data_rows = -1;
  if (src.data_index >= 0) {
    std::vector<Shape> shapes;
    bool all = true;
    for (const std::string& key : planner.source(static_cast<size_t>(src.data_index)).slots) {
      const StagedTensor* t = lookup(key);
      if (t == nullptr) {
        all = false;
        break;
      }
      shapes.push_back(t->shape);
    }
    if (all) {
      absl::StatusOr<Shape> s = AssembledShape(*src.rule, shapes);
      if (s.ok() && s->size() >= 2) data_rows = (*s)[s->size() - 2];
    }
  }
  REFIT_RETURN_IF_ERROR(ApplyLayout(*src.rule, src.suffix, data_rows, b));
  const storage::ParamInfo& p = planner.params()[index];
  if (b.dtype != p.dtype || b.shape != p.shape || b.bytes.size() != p.nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("engine parameter '", p.name, "' built as ", DTypeName(b.dtype),
                                                   ShapeString(b.shape), ", registered as ", DTypeName(p.dtype),
                                                   ShapeString(p.shape)));
  }
  return b;
}

namespace {

int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

// A parameter being built in device staging memory.
struct DeviceBuilt {
  DType dtype;
  Shape shape;
  const uint8_t* data;
  uint64_t nbytes;
};

// Concatenates the staged pieces of parameter `index` (slot order) in device memory: the one
// piece as it is, or a pool buffer under `key`.
absl::StatusOr<DeviceBuilt> AssembleOnDevice(const Planner& planner, size_t index, const Staging& staging,
                                             DeviceOps& ops, const std::string& key) {
  const ParamSource& src = planner.source(index);
  const std::string& name = planner.params()[index].name;
  std::vector<const StagedTensor*> pieces;
  if (size_t missing = staging.GetAll(src.slots, pieces); missing < src.slots.size()) {
    return absl::InternalError(
        absl::StrCat("engine parameter '", name, "': '", src.slots[missing], "' was not staged"));
  }
  std::vector<const Shape*> shapes;
  shapes.reserve(pieces.size());
  uint64_t total = 0;
  for (const StagedTensor* t : pieces) {
    if (t->dtype != pieces[0]->dtype) {
      return absl::InvalidArgumentError(absl::StrCat("engine parameter '", name, "': pieces of different dtypes"));
    }
    shapes.push_back(&t->shape);
    total += t->nbytes;
  }
  REFIT_ASSIGN_OR_RETURN(Shape shape, AssembledShape(*src.rule, shapes));
  const DType dtype = pieces.empty() ? DType::kU8 : pieces[0]->dtype;
  if (pieces.size() == 1) return DeviceBuilt{dtype, shape, pieces[0]->data, total};
  REFIT_ASSIGN_OR_RETURN(uint8_t* buf, staging.pool().Get(key, std::max<uint64_t>(total, 1)));
  // One batched copy for all pieces (a stacked parameter has one per expert, or two when fused).
  std::vector<DeviceOps::CopyRegion> regions;
  regions.reserve(pieces.size());
  uint64_t off = 0;
  for (const StagedTensor* t : pieces) {
    regions.push_back({buf + off, t->data, t->nbytes});
    off += t->nbytes;
  }
  REFIT_RETURN_IF_ERROR(ops.CopyMany(regions));
  return DeviceBuilt{dtype, shape, buf, total};
}

// BuildParam on the device: assembly, then each layout step through the GPU kernels (swizzle,
// UE8M0 packing) or strided device copies (row-pair and half swaps, padding). The final bytes
// land in the pool buffer "built:<name>"; intermediate steps in "layout<k>:<name>".
absl::StatusOr<const uint8_t*> BuildOnDevice(const Planner& planner, size_t index, const Staging& staging,
                                             DeviceOps& ops) {
  const ParamSource& src = planner.source(index);
  const storage::ParamInfo& p = planner.params()[index];
  const spec::Rule& rule = *src.rule;
  REFIT_ASSIGN_OR_RETURN(DeviceBuilt cur, AssembleOnDevice(planner, index, staging, ops, "pre:" + p.name));
  std::vector<const spec::LayoutStep*> steps;
  for (const spec::LayoutStep& step : rule.layout) {
    if (step.AppliesTo(src.suffix)) steps.push_back(&step);
  }
  // The data parameter's rows: only UE8M0 packing reads them (a scale's rows are in 128-row blocks).
  int64_t data_rows = -1;
  const bool packs = std::any_of(steps.begin(), steps.end(),
                                 [](const spec::LayoutStep* step) { return step->op == spec::LayoutOp::kPackUe8m0; });
  if (packs && src.data_index >= 0) {
    const std::vector<std::string>& keys = planner.source(static_cast<size_t>(src.data_index)).slots;
    std::vector<const StagedTensor*> data;
    if (staging.GetAll(keys, data) == keys.size()) {
      std::vector<const Shape*> shapes;
      for (const StagedTensor* t : data) shapes.push_back(&t->shape);
      absl::StatusOr<Shape> s = AssembledShape(rule, shapes);
      if (s.ok() && s->size() >= 2) data_rows = (*s)[s->size() - 2];
    }
  }
  for (size_t k = 0; k < steps.size(); ++k) {
    const spec::LayoutStep& step = *steps[k];
    spec::Rule one = rule;
    one.layout = {step};
    REFIT_ASSIGN_OR_RETURN(auto next, LayoutShape(one, src.suffix, cur.dtype, cur.shape, data_rows));
    REFIT_ASSIGN_OR_RETURN(uint64_t nbytes, DenseBytes(next.first, next.second));
    const std::string key = k + 1 == steps.size() ? "built:" + p.name : absl::StrCat("layout", k, ":", p.name);
    REFIT_ASSIGN_OR_RETURN(uint8_t* out, staging.pool().Get(key, std::max<uint64_t>(nbytes, 1)));
    const Shape& s = cur.shape;
    const uint64_t elem = DTypeSize(cur.dtype);
    auto dim_geometry = [&](int dim, uint64_t& outer, uint64_t& n, uint64_t& inner) {
      const size_t d = static_cast<size_t>(dim < 0 ? dim + static_cast<int>(s.size()) : dim);
      outer = static_cast<uint64_t>(Product(s, 0, d));
      n = static_cast<uint64_t>(s[d]);
      inner = static_cast<uint64_t>(Product(s, d + 1, s.size())) * elem;
    };
    switch (step.op) {
      case spec::LayoutOp::kSwizzle128x4:
        REFIT_RETURN_IF_ERROR(ops.Swizzle128x4(cur.data, Product(s, 0, s.size() - 2), s[s.size() - 2], s[s.size() - 1],
                                               out, nbytes));
        break;
      case spec::LayoutOp::kPackUe8m0:
        REFIT_RETURN_IF_ERROR(ops.PackUe8m0(reinterpret_cast<const float*>(cur.data), Product(s, 0, s.size() - 2),
                                            data_rows, s[s.size() - 1], reinterpret_cast<int32_t*>(out), nbytes / 4,
                                            absl::StrCat(rule.Describe(), " ('", p.name, "')")));
        break;
      case spec::LayoutOp::kSwapRowPairs: {
        uint64_t outer, n, inner;
        dim_geometry(step.dim, outer, n, inner);
        // out[o, i ^ 1] = in[o, i]: the even rows one row on, the odd rows one row back.
        REFIT_RETURN_IF_ERROR(ops.Copy2D(out + inner, 2 * inner, cur.data, 2 * inner, inner, outer * n / 2));
        REFIT_RETURN_IF_ERROR(ops.Copy2D(out, 2 * inner, cur.data + inner, 2 * inner, inner, outer * n / 2));
        break;
      }
      case spec::LayoutOp::kSwapHalves: {
        uint64_t outer, n, inner;
        dim_geometry(step.dim, outer, n, inner);
        const uint64_t half = n / 2 * inner;
        REFIT_RETURN_IF_ERROR(ops.Copy2D(out + half, n * inner, cur.data, n * inner, half, outer));
        REFIT_RETURN_IF_ERROR(ops.Copy2D(out, n * inner, cur.data + half, n * inner, half, outer));
        break;
      }
      case spec::LayoutOp::kPad: {
        uint64_t outer, n, inner;
        dim_geometry(step.dim, outer, n, inner);
        const size_t d = static_cast<size_t>(step.dim < 0 ? step.dim + static_cast<int>(s.size()) : step.dim);
        const uint64_t np = static_cast<uint64_t>(next.second[d]);
        REFIT_RETURN_IF_ERROR(ops.Zero(out, nbytes));
        REFIT_RETURN_IF_ERROR(ops.Copy2D(out, np * inner, cur.data, n * inner, n * inner, outer));
        break;
      }
      case spec::LayoutOp::kMergeDims:  // views: the same bytes
      case spec::LayoutOp::kViewDtype:
        REFIT_RETURN_IF_ERROR(ops.Copy2D(out, nbytes, cur.data, nbytes, nbytes, 1));
        break;
      case spec::LayoutOp::kCastF32:
      case spec::LayoutOp::kReorderGatedRows:
      case spec::LayoutOp::kShuffleMatrixA:
      case spec::LayoutOp::kShuffleMatrixSfA:
        // PrepareCommit builds parameters with casts and row shuffles on the host.
        return absl::InternalError(absl::StrCat("engine parameter '", p.name, "': a row shuffle on the device"));
    }
    cur = DeviceBuilt{next.first, next.second, out, nbytes};
  }
  if (cur.dtype != p.dtype || cur.shape != p.shape || cur.nbytes != p.nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("engine parameter '", p.name, "' built as ", DTypeName(cur.dtype),
                                                   ShapeString(cur.shape), ", registered as ", DTypeName(p.dtype),
                                                   ShapeString(p.shape)));
  }
  return cur.data;
}

absl::Status NotPlacementOnly(const std::string& param) {
  return absl::UnavailableError(absl::StrCat("engine parameter '", param, "' is built at commit"));
}

}  // namespace

absl::StatusOr<PreparedCommit> PrepareCommit(const Planner& planner, const Staging& staging,
                                             const std::vector<size_t>& produced, DeviceOps* ops,
                                             PrepareOptions options) {
  PreparedCommit prepared;
  prepared.kind = staging.kind();
  const auto& params = planner.params();
  storage::Memory& memory = staging.pool().memory();
  const bool device = staging.kind() == storage::MemoryKind::kDevice;
  if (!device) ops = nullptr;
  // Host views of staged pieces, for the builds that run on the host (layout steps, derived).
  std::map<std::string, StagedTensor> host_copies;
  PieceLookup host_lookup = [&](const std::string& key) -> const StagedTensor* {
    const StagedTensor* t = staging.Get(key);
    if (t == nullptr || !device) return t;
    auto it = host_copies.find(key);
    if (it != host_copies.end()) return &it->second;
    StagedTensor h{t->dtype, t->shape, t->nbytes, nullptr, {}};
    h.owner.reset(new uint8_t[t->nbytes == 0 ? 1 : t->nbytes], std::default_delete<uint8_t[]>());
    h.data = h.owner.get();
    if (!memory.CopyToHost(h.data, t->data, t->nbytes).ok()) return nullptr;
    return &host_copies.emplace(key, std::move(h)).first->second;
  };
  auto upload = [&](size_t index, const std::vector<uint8_t>& bytes) -> absl::StatusOr<const uint8_t*> {
    REFIT_ASSIGN_OR_RETURN(uint8_t* buf, staging.pool().Get("built:" + params[index].name, bytes.size()));
    REFIT_RETURN_IF_ERROR(memory.CopyFromHost(buf, bytes.data(), bytes.size()));
    return buf;
  };
  std::vector<bool> staged(params.size(), false);
  for (size_t i : produced) staged[i] = true;
  prepared.writes.reserve(produced.size() + planner.derived().size());
  std::vector<const StagedTensor*> pieces;  // reused: a stacked parameter has a piece per expert
  std::vector<const Shape*> shapes;
  for (size_t i : produced) {
    const ParamSource& src = planner.source(i);
    const storage::ParamInfo& p = params[i];
    if (size_t missing = staging.GetAll(src.slots, pieces); missing < src.slots.size()) {
      return absl::InternalError(
          absl::StrCat("engine parameter '", p.name, "': '", src.slots[missing], "' was not staged"));
    }
    const bool laid_out = std::any_of(src.rule->layout.begin(), src.rule->layout.end(),
                                      [&](const spec::LayoutStep& step) { return step.AppliesTo(src.suffix); });
    if (!laid_out) {
      ++prepared.params;
      // Converted where the engine holds it (staging: direct placed every piece at the offset
      // assembly gives it): nothing to write once the pieces are checked.
      const bool in_place = std::all_of(pieces.begin(), pieces.end(), [](const StagedTensor* t) { return t->in_place; });
      if (pieces.size() == 1 && pieces[0]->dtype == p.dtype && pieces[0]->shape == p.shape &&
          pieces[0]->nbytes == p.nbytes) {
        if (!in_place) prepared.writes.push_back({i, pieces[0]->data, 0, p.nbytes});  // as staged: no copy
        continue;
      }
      // Assembly only (fused/stacked slots are concatenated in slot order): copy within staging memory.
      shapes.clear();
      uint64_t total = 0;
      for (const StagedTensor* t : pieces) {
        if (t->dtype != p.dtype) {
          return absl::InvalidArgumentError(absl::StrCat("engine parameter '", p.name, "': pieces of dtype ",
                                                         DTypeName(t->dtype), ", registered as ", DTypeName(p.dtype)));
        }
        shapes.push_back(&t->shape);
        total += t->nbytes;
      }
      REFIT_ASSIGN_OR_RETURN(Shape shape, AssembledShape(*src.rule, shapes));
      if (shape != p.shape || total != p.nbytes) {
        return absl::InvalidArgumentError(absl::StrCat("engine parameter '", p.name, "' built as ", DTypeName(p.dtype),
                                                       ShapeString(shape), ", registered as ", DTypeName(p.dtype),
                                                       ShapeString(p.shape)));
      }
      if (in_place && !pieces.empty()) continue;
      if (options.pieces_in_place && device) {
        // Each piece straight from staging to its place in the engine's parameter, in the window.
        uint64_t off = 0;
        for (const StagedTensor* t : pieces) {
          if (!t->in_place) prepared.writes.push_back({i, t->data, off, t->nbytes});
          off += t->nbytes;
        }
        continue;
      }
      if (options.only_placement) return NotPlacementOnly(p.name);
      REFIT_ASSIGN_OR_RETURN(uint8_t* buf, staging.pool().Get("built:" + p.name, total));
      uint64_t off = 0;
      for (const StagedTensor* t : pieces) {
        REFIT_RETURN_IF_ERROR(memory.CopyWithin(buf + off, t->data, t->nbytes));
        off += t->nbytes;
      }
      prepared.writes.push_back({i, buf, 0, p.nbytes});
      continue;
    }
    if (options.only_placement) return NotPlacementOnly(p.name);
    ++prepared.params;
    const bool host_only_layout =
        std::any_of(src.rule->layout.begin(), src.rule->layout.end(), [&](const spec::LayoutStep& step) {
          return step.AppliesTo(src.suffix) &&
                 (step.op == spec::LayoutOp::kReorderGatedRows || step.op == spec::LayoutOp::kShuffleMatrixA ||
                  step.op == spec::LayoutOp::kShuffleMatrixSfA || step.op == spec::LayoutOp::kCastF32);
        });
    if (ops != nullptr && !host_only_layout) {
      // Layout steps on the GPU, before the pause.
      REFIT_ASSIGN_OR_RETURN(const uint8_t* data, BuildOnDevice(planner, i, staging, *ops));
      prepared.writes.push_back({i, data, 0, p.nbytes});
      ++prepared.built_on_device;
      continue;
    }
    // Layout steps run on the host.
    REFIT_ASSIGN_OR_RETURN(Built b, BuildParam(planner, i, host_lookup, true));
    REFIT_ASSIGN_OR_RETURN(const uint8_t* data, upload(i, b.bytes));
    prepared.writes.push_back({i, data, 0, p.nbytes});
  }
  for (const DerivedTarget& d : planner.derived()) {
    const bool scale_staged = d.scale_index >= 0 && staged[static_cast<size_t>(d.scale_index)];
    if (!staged[d.from_index] && !scale_staged) continue;  // sources unchanged in this refit: still valid
    if (options.only_placement) return NotPlacementOnly(params[d.target_index].name);
    if (d.scale_index >= 0 && staged[d.from_index] != scale_staged) {
      const size_t missing = staged[d.from_index] ? static_cast<size_t>(d.scale_index) : d.from_index;
      return absl::InvalidArgumentError(absl::StrCat(
          "derived parameter '", params[d.target_index].name, "': '", params[missing].name, "' was not refit with '",
          params[staged[d.from_index] ? d.from_index : static_cast<size_t>(d.scale_index)].name,
          "', and it reads both"));
    }
    if (d.op != spec::DerivedOp::kAddOne) {
      // Layout copies and MLA absorbed weights are built on the host from the staged sources
      // (formats/moe_shuffle.h, formats/mla_absorb.h) and uploaded into staging before the pause.
      REFIT_ASSIGN_OR_RETURN(Built from, BuildParam(planner, d.from_index, host_lookup, false));
      std::optional<Built> scale;
      if (d.scale_index >= 0) {
        REFIT_ASSIGN_OR_RETURN(scale, BuildParam(planner, static_cast<size_t>(d.scale_index), host_lookup, false));
      }
      const storage::ParamInfo& target = params[d.target_index];
      REFIT_ASSIGN_OR_RETURN(Built out, BuildDerived(*d.derived, target.name, from, scale ? &*scale : nullptr));
      if (out.dtype != target.dtype || out.shape != target.shape || out.bytes.size() != target.nbytes) {
        return absl::InvalidArgumentError(absl::StrCat("derived parameter '", target.name, "' built as ",
                                                       DTypeName(out.dtype), ShapeString(out.shape), ", registered as ",
                                                       DTypeName(target.dtype), ShapeString(target.shape)));
      }
      REFIT_ASSIGN_OR_RETURN(const uint8_t* data, upload(d.target_index, out.bytes));
      prepared.writes.push_back({d.target_index, data, 0, target.nbytes});
      ++prepared.params;
      ++prepared.derived;
      continue;
    }
    if (ops != nullptr) {
      const storage::ParamInfo& target = params[d.target_index];
      REFIT_ASSIGN_OR_RETURN(DeviceBuilt from, AssembleOnDevice(planner, d.from_index, staging, *ops,
                                                                 "pre:" + params[d.from_index].name));
      if (target.dtype != DType::kBF16 && target.dtype != DType::kF32) {
        return absl::UnimplementedError(absl::StrCat("derived parameter '", target.name, "': add_one on ",
                                                     DTypeName(target.dtype), " is not supported"));
      }
      if (from.dtype != target.dtype || from.nbytes != target.nbytes) {
        return absl::InvalidArgumentError(absl::StrCat("derived parameter '", target.name, "': its source is ",
                                                       DTypeName(from.dtype), ShapeString(from.shape)));
      }
      REFIT_ASSIGN_OR_RETURN(uint8_t* out, staging.pool().Get("built:" + target.name, std::max<uint64_t>(target.nbytes, 1)));
      REFIT_ASSIGN_OR_RETURN(int64_t n, NumElements(target.shape));
      REFIT_RETURN_IF_ERROR(ops->AddOne(from.data, target.dtype, n, out));
      prepared.writes.push_back({d.target_index, out, 0, target.nbytes});
      ++prepared.params;
      ++prepared.derived;
      ++prepared.built_on_device;
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(Built from, BuildParam(planner, d.from_index, host_lookup, false));
    const storage::ParamInfo& target = params[d.target_index];
    std::vector<uint8_t> out(target.nbytes);
    REFIT_RETURN_IF_ERROR(ComputeDerived(d.op, target, from.bytes.data(), out.data()));
    REFIT_ASSIGN_OR_RETURN(const uint8_t* data, upload(d.target_index, out));
    prepared.writes.push_back({d.target_index, data, 0, target.nbytes});
    ++prepared.params;
    ++prepared.derived;
  }
  // Everything built on the device is complete (and pack_ue8m0's scales checked) before the pause.
  TracePoint("daemon.prepare_built");
  if (ops != nullptr && !options.only_placement) REFIT_RETURN_IF_ERROR(ops->Synchronize());
  return prepared;
}

absl::Status PrepareStorageWrites(PreparedCommit& prepared, storage::EngineStorage& storage) {
  prepared.batched = false;
  if (prepared.kind != storage::MemoryKind::kDevice || !storage.on_device()) return absl::OkStatus();
  std::vector<storage::DeviceWrite> writes;
  for (const PreparedCommit::Write& w : prepared.writes) writes.push_back({w.index, w.offset, w.data, w.bytes});
  absl::Status st = storage.PrepareDeviceWrites(writes);
  if (st.code() == absl::StatusCode::kUnimplemented) return absl::OkStatus();
  if (!st.ok()) return st;
  prepared.batched = true;
  return absl::OkStatus();
}

absl::StatusOr<CommitStats> WritePrepared(const Planner& planner, const PreparedCommit& prepared,
                                          storage::EngineStorage& storage) {
  CommitStats stats;
  const bool device = prepared.kind == storage::MemoryKind::kDevice;
  if (prepared.batched) {
    REFIT_RETURN_IF_ERROR(storage.WritePreparedDevice());
    for (const PreparedCommit::Write& w : prepared.writes) stats.bytes_written += w.bytes;
  } else {
    for (const PreparedCommit::Write& w : prepared.writes) {
      if (device) {
        REFIT_RETURN_IF_ERROR(storage.WriteFromDevice({w.index, w.offset, w.data, w.bytes}));
      } else if (w.offset != 0 || w.bytes != planner.params()[w.index].nbytes) {
        return absl::InternalError(absl::StrCat("engine parameter '", planner.params()[w.index].name,
                                                "': a host write of part of it"));
      } else {
        REFIT_RETURN_IF_ERROR(storage.WriteFromHost(w.index, w.data));
      }
      stats.bytes_written += w.bytes;
    }
  }
  stats.derived_written = prepared.derived;
  stats.params_written = prepared.params - prepared.derived;
  REFIT_RETURN_IF_ERROR(storage.Flush());
  return stats;
}

absl::StatusOr<CommitStats> CommitStaged(const Planner& planner, const Staging& staging,
                                         const std::vector<size_t>& produced, storage::EngineStorage& storage) {
  REFIT_ASSIGN_OR_RETURN(PreparedCommit prepared, PrepareCommit(planner, staging, produced));
  return WritePrepared(planner, prepared, storage);
}

}  // namespace refit
