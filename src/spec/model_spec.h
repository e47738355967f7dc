// A model spec: how a trainer's HF tensors map onto the engine's parameters for one model —
// which engine parameter each tensor lands in (renamed, fused with its siblings, stacked by
// expert, sharded for tensor parallelism), in which format, with which engine-side layout
// steps, which tensors refits never carry, and which parameters are derived at every commit.
// Loaded once from YAML at daemon start, validated (errors name file, line and key), immutable
// afterwards (thread-safe to read). docs/config.md is the reference for the YAML schema.
//
// Sizes (a stacked rule's expert count, a Megatron source's heads, head dim, vocabulary...) come
// from the model: a spec may leave them out, and they are read from the model's config.json
// (spec/model_config.h) at load. A size the spec does state must agree with the config's.
#ifndef REFIT_SPEC_MODEL_SPEC_H_
#define REFIT_SPEC_MODEL_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"
#include "spec/model_config.h"
#include "spec/name_pattern.h"
#include "spec/pattern_index.h"
#include "spec/quant_config.h"

namespace refit::spec {

// How a trainer tensor becomes engine parameters.
enum class Conversion : uint8_t {
  kAuto,         // cast to the engine parameter's dtype (bf16/fp16/fp32); offline: keep the dtype
  kPassthrough,  // bytes copied as sent; dtype and shape must equal the engine's
  kFormat,       // quantize with `format`; outputs are NAME + the format's suffixes
  kCheckpoint,   // the format the checkpoint's quantization metadata gives the tensor's module
};

// Members of one engine parameter concatenated along dim 0, in `order` (values of `capture`).
struct Fuse {
  std::string capture;
  std::vector<std::string> order;
};

// A new leading dimension of `count` entries indexed by the integer value of `capture`. `count`
// omitted in the spec: the model config's expert count.
struct Stack {
  std::string capture;
  int64_t count = 0;
};

// This engine holds part `rank` of `size` along `dim` of every output of the rule's tensors.
struct Shard {
  int dim = 0;
  int size = 1;
  int rank = 0;
};

enum class LayoutOp : uint8_t {
  kSwizzle128x4,  // byte scales -> 128x4 swizzled, zero-padded (FORMATS.md B §8.1)
  kPackUe8m0,     // fp32 pow2 block-128 scales -> DeepGEMM packed int32, MN-major (B §8.6)
  kSwapRowPairs,  // rows (2j, 2j+1) -> (2j+1, 2j) along `dim` (gpt-oss g,u -> u,g)
  kSwapHalves,    // the two halves along `dim` swapped ([w1; w3] <-> [w3; w1])
  kPad,           // zero rows appended along `dim` up to a multiple of `multiple`
  // TRT-LLM / FlashInfer fused-MoE layouts (FORMATS.md B §8.2-8.3), on the rows (dim -2) of each
  // matrix of the leading batch (each expert):
  kReorderGatedRows,  // reorder_rows_for_gated_act_gemm: out[2i] = in[i], out[2i+1] = in[M/2+i]
  kShuffleMatrixA,    // shuffle_matrix_a(W, epilogue_tile_m): rows permuted in blocks of 32 (16)
  kShuffleMatrixSfA,  // shuffle_matrix_sf_a: the same rows (M % 128 == 0), then swizzle_128x4
  // Views and casts, bytes or values unchanged:
  kMergeDims,  // dims `dim` and `dim + 1` merged into one (a view: gpt-oss _blocks [.., K/32, 16] -> [.., K/2])
  kCastF32,    // BF16/F16 values -> F32, exactly (compressed-tensors scales as vLLM holds them)
  // The same bytes read as `dtype`, a dtype of the same element size (a view: the TRT-LLM MXFP4
  // MoE's shuffled E8M0 scales, which vLLM and SGLang register as float8_e4m3fn views).
  kViewDtype,
};

// One engine layout step, applied at commit to the assembled (fused/stacked/sharded)
// checkpoint-format bytes of the outputs with suffix `on` ("" = the data tensor).
struct LayoutStep {
  LayoutOp op = LayoutOp::kPad;
  std::vector<std::string> on;
  int dim = 0;
  int64_t multiple = 1;
  int64_t epilogue_tile_m = 128;  // kShuffleMatrixA / kShuffleMatrixSfA
  DType dtype = DType::kU8;       // kViewDtype
  int line = 0;
  bool AppliesTo(std::string_view suffix) const;
};

struct Rule {
  NamePattern match;
  std::optional<NamePattern> target;  // engine parameter (base) name; absent: the trainer name
  Conversion conversion = Conversion::kAuto;
  formats::Format format = formats::Format::kBf16;  // when kFormat
  bool never = false;      // `refit: never`: engine keeps its own value; excluded from checks
  bool partial = false;    // may be refit alone in a partial refit
  bool transpose = false;  // swap the last two dims before quantizing (BMM-style [E, in, out])
  std::optional<Fuse> fuse;
  std::optional<Stack> stack;
  std::optional<Shard> shard;
  std::optional<int> shard_dim;  // the spec's shard.dim; `shard` is set once the TP size is above 1
  std::vector<LayoutStep> layout;
  int line = 0;  // 1-based line in the spec file
  std::string Describe() const;
  // Fused members times stacked entries (1 for a plain rule).
  int64_t Slots() const;
};

// Members that must arrive together (beyond what fuse/stack already imply).
struct Group {
  std::string name;
  std::vector<NamePattern> members;
  int line = 0;
};

enum class DerivedOp : uint8_t {
  kAddOne,  // Gemma-style RMSNorm: gemma_weight = RN(weight + 1) in the parameter's dtype
  kLayout,  // a laid-out copy: `layout` steps applied to the value of `from` (a shuffled MoE copy)
  kMlaWkc,  // SGLang's MLA w_kc from kv_b_proj, stored [heads, kv_lora_rank, qk_nope_head_dim]
  kMlaWvc,  // SGLang's MLA w_vc from kv_b_proj, stored [heads, v_head_dim, kv_lora_rank]
};

// An engine parameter recomputed at every commit from the staged (checkpoint-format, before
// its own rule's layout steps) value of engine parameter `from`, and for the MLA ops of a
// block-FP8 kv_b_proj also its `scale` (weight_scale_inv). It is written whenever `from` (or
// `scale`) is written, in the same commit (formats/mla_absorb.h, formats/moe_shuffle.h).
struct Derived {
  NamePattern target;
  NamePattern from;
  DerivedOp op = DerivedOp::kAddOne;
  std::vector<LayoutStep> layout;    // kLayout: the steps, each on the data ("")
  std::optional<NamePattern> scale;  // kMlaWkc / kMlaWvc of an FP8 kv_b_proj
  int64_t qk_nope_head_dim = 0;      // kMlaWkc / kMlaWvc (spec or model config)
  int64_t v_head_dim = 0;
  int line = 0;
};

// `source: {layout: megatron, ...}`: the trainer pushes its Megatron-core model chunk's
// `named_parameters()` (TP shards as slices, global layer and expert numbers); refitd maps each
// to the checkpoint tensors (refit/megatron_source.h, docs/config.md "source"). Sizes the spec
// omits come from the model config (num_key_value_heads for num_query_groups, ...).
struct MegatronSource {
  // kGated: Qwen3-Next / Qwen3.5 (attention_output_gate: linear_qkv holds an output gate per
  // query head; gated delta-net layers; MTP and shared_expert names of that family).
  enum class Attention : uint8_t { kGqa, kMla, kGated };
  enum class Experts : uint8_t { kPerExpert, kGptOss };
  Attention attention = Attention::kGqa;  // kMla: DeepSeek multi-latent attention names
  Experts experts = Experts::kPerExpert;  // kGptOss: stacked [E, in, out] experts, gate/up interleaved
  int64_t num_attention_heads = 0;        // these three: needed by linear_qkv only (0: not given)
  int64_t num_query_groups = 0;
  int64_t head_dim = 0;
  int64_t q_lora_rank = 0;  // MLA: rows of q_a_proj in a fused linear_qkv_down_proj (0: not given)
  int64_t num_experts = 0;  // kGptOss: the stacked experts' leading dim
  int64_t vocab_size = 0;   // the checkpoint's rows of the embedding and output layer; 0: no padding
  // Gated delta-net layers (kGated): needed by their in_proj and conv1d only (0: not given).
  int64_t linear_num_key_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_value_head_dim = 0;
  int line = 0;
};

struct ModelSpec {
  std::string model;
  std::string path;  // where it was loaded from ("<string>" for inline specs)
  formats::QuantizeOptions options;
  Rule defaults;  // applies to names no rule matches (match is "**")
  std::vector<Rule> rules;
  std::vector<Group> groups;
  std::vector<Derived> derived;
  std::optional<QuantConfig> checkpoint;  // the rollout checkpoint's quantization metadata
  // `tensor_parallel`: the engine's TP size, and the rank this daemon's one engine holds. With
  // `rank` omitted (tp_rank_given false) and size > 1, the node's engine is `size` rank processes,
  // each registering its rank (docs/config.md "Engine ranks"); ForRank gives each rank's spec.
  // `tensor_parallel: {size: engine}` (tp_size_from_engine): the size is the engine's, which its
  // ranks give when they register; until WithEngineSize fixes it the spec reads as a single
  // engine's (tp_size 1, no rule sharded).
  int tp_size = 1;
  int tp_rank = 0;
  bool tp_rank_given = false;
  bool tp_size_from_engine = false;
  // `expert_parallel: {size: E}`: stacked (expert) rules are split by expert across E ranks, the
  // TP ranks themselves (E == tp_size; EP rank = TP rank): rank r holds experts
  // [r * count / E, (r + 1) * count / E) of every stacked parameter, whole (not TP-sharded).
  // `expert_parallel: {size: engine}` (with tensor_parallel.size engine): ep_size is the TP size.
  int ep_size = 1;
  int ep_rank = 0;
  bool ep_size_from_engine = false;
  std::optional<MegatronSource> source;  // absent: the trainer pushes checkpoint names
  // The model config the sizes were read from ("" when none was given), and the sizes the spec
  // leaves to a model config that was not given ("source.head_dim (line 21)"), 0 here: a Megatron
  // source's heads are refused when a push needs them (megatron_source.h); a stack's count refuses
  // the load, unless LoadOptions::allow_unresolved.
  std::string model_config;
  std::vector<std::string> unresolved;

  // Over rules[i].match, rules[i].target (or .match when it has none) and derived[i].target,
  // built by ParseModelSpec; a spec assembled by hand without them is searched rule by rule.
  PatternIndex match_index;
  PatternIndex target_index;
  PatternIndex derived_index;

  // The rule for trainer tensor `name`: the one rule whose pattern matches, else `defaults`.
  // Error naming both rules when two match (overlapping rules).
  absl::StatusOr<const Rule*> RuleFor(std::string_view name) const;
  // The `refit: never` rule matching `name`, or nullptr.
  const Rule* NeverRuleFor(std::string_view name) const;
  // The derived entry whose target matches `engine_param`, with its captures; nullopt if none.
  std::optional<std::pair<const Derived*, Captures>> DerivedFor(std::string_view engine_param) const;
  // The rules, in order, whose target (their match when they have none) may match the engine
  // parameter base name `base`; every rule whose target matches it is among them.
  std::vector<const Rule*> TargetCandidates(std::string_view base) const;
};

// Largest model spec file read (bytes) and most rules in one spec; beyond them the spec is refused.
inline constexpr uint64_t kMaxModelSpecFileBytes = 4 << 20;
inline constexpr size_t kMaxRules = 20000;
inline constexpr int64_t kMaxEngineRanks = 64;  // tensor_parallel.size

// The spec as engine rank `tp_rank` sees it: every shard rule holds part `tp_rank`, and under
// `expert_parallel` the rank's experts are ep_rank = tp_rank's. InvalidArgument when the rank is
// outside tensor_parallel.size.
absl::StatusOr<ModelSpec> ForRank(const ModelSpec& spec, int tp_rank);

// The spec for an engine of `tp_size` ranks. A spec whose tensor_parallel.size is the engine's
// gets that size (its shard rules sharded tp_size ways, under expert_parallel.size engine its
// experts split tp_size ways); a spec that states its size is returned as is when the sizes agree.
// InvalidArgument naming tp_size (or ep_size: experts that do not split evenly) otherwise.
absl::StatusOr<ModelSpec> WithEngineSize(const ModelSpec& spec, int tp_size);

// `tensor_parallel` as the spec states it, for tools: "engine" (the size is the engine's ranks'
// registrations'; "engine, expert_parallel engine" with expert_parallel size engine), "N", "N, rank R",
// "N, expert_parallel N"; "1" without the section.
std::string TensorParallelText(const ModelSpec& spec);

struct LoadOptions {
  // The model's config.json: the sizes the spec omits are read from it, and the sizes it states
  // are checked against it. Not owned; only read during the load.
  const ModelConfig* model_config = nullptr;
  // Without a model config, a spec that omits a stacked rule's count is refused naming every
  // such count and how to give the config; with this set it loads with those counts 0, listed in
  // ModelSpec::unresolved (for checks of the spec's text alone).
  bool allow_unresolved = false;
};

absl::StatusOr<ModelSpec> LoadModelSpecFile(const std::string& path, const LoadOptions& options = {});
// `base_dir` resolves a relative checkpoint.quant_config path ("" = the current directory).
absl::StatusOr<ModelSpec> ParseModelSpec(std::string_view yaml, std::string_view path = "<string>",
                                         std::string_view base_dir = "", const LoadOptions& options = {});

}  // namespace refit::spec

#endif  // REFIT_SPEC_MODEL_SPEC_H_
