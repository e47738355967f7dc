// MapMegatron / MapMegatronManifest: Megatron-core tensors -> slices of the checkpoint tensors,
// checked piece by piece against layouts written out by hand; and the spec's `source` section.
#include "refit/megatron_source.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "spec/model_spec.h"

namespace refit {
namespace {

spec::MegatronSource Source(int64_t heads, int64_t groups, int64_t head_dim, int64_t vocab = 0) {
  spec::MegatronSource m;
  m.num_attention_heads = heads;
  m.num_query_groups = groups;
  m.head_dim = head_dim;
  m.vocab_size = vocab;
  return m;
}

TensorDesc Slice(std::string name, Shape shape, uint64_t start, Shape full) {
  TensorDesc d;
  d.name = std::move(name);
  d.dtype = DType::kBF16;
  d.shape = std::move(shape);
  d.nbytes = *DenseBytes(d.dtype, d.shape);
  d.slice.dim = 0;
  d.slice.start = start;
  d.slice.full_shape = std::move(full);
  return d;
}

struct Want {
  std::string name;
  int64_t rows;
  int64_t start;   // -1: whole
  int64_t full;
  uint64_t src_row;
};

void Expect(const std::vector<SourcePiece>& got, const std::vector<Want>& want, int64_t cols) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(got[i].desc.name, want[i].name);
    EXPECT_EQ(got[i].desc.shape, (Shape{want[i].rows, cols}));
    EXPECT_EQ(got[i].desc.nbytes, static_cast<uint64_t>(want[i].rows * cols * 2));
    if (want[i].start < 0) {
      EXPECT_FALSE(got[i].desc.slice.present());
    } else {
      ASSERT_TRUE(got[i].desc.slice.present());
      EXPECT_EQ(got[i].desc.slice.dim, 0);
      EXPECT_EQ(got[i].desc.slice.start, static_cast<uint64_t>(want[i].start));
      EXPECT_EQ(got[i].desc.slice.full_shape, (Shape{want[i].full, cols}));
    }
    EXPECT_EQ(got[i].src_offset, want[i].src_row * static_cast<uint64_t>(cols) * 2);
  }
}

TEST(MegatronSourceTest, QkvOfTpRankOneSplitsPerQueryGroup) {
  // 4 heads in 2 groups, head_dim 2: per group [q q; k; v] = 8 rows; TP=2, rank 1 holds group 1.
  auto m = MapMegatron(Source(4, 2, 2), Slice("module.decoder.layers.3.self_attention.linear_qkv.weight", {8, 5}, 8, {16, 5}));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->has_value());
  Expect(**m, {{"model.layers.3.self_attn.q_proj.weight", 4, 4, 8, 0},
               {"model.layers.3.self_attn.k_proj.weight", 2, 2, 4, 4},
               {"model.layers.3.self_attn.v_proj.weight", 2, 2, 4, 6}}, 5);
}

TEST(MegatronSourceTest, QkvWholeIsOnePiecePerGroupAndPart) {
  auto m = MapMegatron(Source(2, 2, 3), Slice("decoder.layers.0.self_attention.linear_qkv.weight", {18, 4}, 0, {18, 4}));
  ASSERT_TRUE(m.ok()) << m.status();
  Expect(**m, {{"model.layers.0.self_attn.q_proj.weight", 3, 0, 6, 0},
               {"model.layers.0.self_attn.k_proj.weight", 3, 0, 6, 3},
               {"model.layers.0.self_attn.v_proj.weight", 3, 0, 6, 6},
               {"model.layers.0.self_attn.q_proj.weight", 3, 3, 6, 9},
               {"model.layers.0.self_attn.k_proj.weight", 3, 3, 6, 12},
               {"model.layers.0.self_attn.v_proj.weight", 3, 3, 6, 15}}, 4);
}

TEST(MegatronSourceTest, QkvRowsTheHeadsDoNotExplainAreRefused) {
  auto m = MapMegatron(Source(4, 2, 2), Slice("decoder.layers.0.self_attention.linear_qkv.weight", {8, 5}, 0, {24, 5}));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("decoder.layers.0.self_attention.linear_qkv.weight"), std::string::npos);
  EXPECT_NE(m.status().message().find("make 16"), std::string::npos) << m.status();
}

// A spec that leaves the heads to the model, loaded without its config.json: the push that needs
// them is refused saying where they come from.
TEST(MegatronSourceTest, HeadsLeftToAModelConfigNotGivenAreRefusedWhenNeeded) {
  auto m = MapMegatron(Source(0, 0, 0), Slice("decoder.layers.0.self_attention.linear_qkv.weight", {8, 5}, 0, {16, 5}));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("linear_qkv needs source.num_attention_heads, num_query_groups and head_dim "
                                      "(the model's config.json gives it: set refitd's model_config"),
            std::string::npos)
      << m.status();
  spec::MegatronSource oss = Source(4, 2, 2);
  oss.experts = spec::MegatronSource::Experts::kGptOss;
  auto fc1 = MapMegatron(oss, Slice("decoder.layers.1.mlp.experts.linear_fc1.weight0", {8, 4}, 0, {8, 4}));
  ASSERT_FALSE(fc1.ok());
  EXPECT_NE(fc1.status().message().find("gpt-oss experts need source.num_experts (the model's config.json"),
            std::string::npos)
      << fc1.status();
}

TEST(MegatronSourceTest, Fc1OfATpRankIsItsGateAndUpShards) {
  auto m = MapMegatron(Source(1, 1, 1),
                       Slice("decoder.layers.2.mlp.experts.local_experts.5.linear_fc1.weight", {6, 4}, 12, {24, 4}));
  ASSERT_TRUE(m.ok()) << m.status();
  Expect(**m, {{"model.layers.2.mlp.experts.5.gate_proj.weight", 3, 6, 12, 0},
               {"model.layers.2.mlp.experts.5.up_proj.weight", 3, 6, 12, 3}}, 4);
  auto grouped = MapMegatron(Source(1, 1, 1), Slice("decoder.layers.2.mlp.experts.linear_fc1.weight7", {6, 4}, 0, {6, 4}));
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  Expect(**grouped, {{"model.layers.2.mlp.experts.7.gate_proj.weight", 3, -1, 3, 0},
                     {"model.layers.2.mlp.experts.7.up_proj.weight", 3, -1, 3, 3}}, 4);
  auto uneven = MapMegatron(Source(1, 1, 1), Slice("decoder.layers.2.mlp.linear_fc1.weight", {6, 4}, 3, {24, 4}));
  EXPECT_FALSE(uneven.ok());
}

TEST(MegatronSourceTest, VocabularyPaddingRowsAreDropped) {
  // vocab 10 padded to 16, TP=2: rank 0 rows [0, 8) whole part; rank 1 [8, 16) -> rows [8, 10).
  auto r0 = MapMegatron(Source(1, 1, 1, 10), Slice("embedding.word_embeddings.weight", {8, 2}, 0, {16, 2}));
  auto r1 = MapMegatron(Source(1, 1, 1, 10), Slice("output_layer.weight", {8, 2}, 8, {16, 2}));
  ASSERT_TRUE(r0.ok() && r1.ok());
  Expect(**r0, {{"model.embed_tokens.weight", 8, 0, 10, 0}}, 2);
  Expect(**r1, {{"lm_head.weight", 2, 8, 10, 0}}, 2);
  // A shard that is all padding carries nothing.
  auto pad = MapMegatron(Source(1, 1, 1, 10), Slice("output_layer.weight", {4, 2}, 12, {16, 2}));
  ASSERT_TRUE(pad.ok());
  EXPECT_TRUE((*pad)->empty());
}

TEST(MegatronSourceTest, RenamesKeepTheSliceAndOtherNamesPassThrough) {
  TensorDesc proj = Slice("decoder.layers.1.self_attention.linear_proj.weight", {4, 3}, 3, {4, 6});
  proj.slice.dim = 1;
  auto m = MapMegatron(Source(1, 1, 1), proj);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->size(), 1u);
  EXPECT_EQ((**m)[0].desc.name, "model.layers.1.self_attn.o_proj.weight");
  EXPECT_EQ((**m)[0].desc.slice.dim, 1);
  EXPECT_EQ((**m)[0].desc.slice.start, 3u);
  auto hf = MapMegatron(Source(1, 1, 1), Slice("model.layers.0.mlp.up_proj.weight", {2, 2}, 0, {4, 2}));
  ASSERT_TRUE(hf.ok());
  EXPECT_FALSE(hf->has_value());
  auto unknown = MapMegatron(Source(1, 1, 1), Slice("decoder.layers.0.mlp.linear_fc1.lora_a", {2, 2}, 0, {2, 2}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no checkpoint name"), std::string::npos);
}

TEST(MegatronSourceTest, ManifestEntriesStandForWholeCheckpointTensors) {
  TensorDesc qkv = Slice("decoder.layers.0.self_attention.linear_qkv.weight", {16, 5}, 0, {16, 5});
  qkv.slice = {};
  auto t = MapMegatronManifest(Source(4, 2, 2), qkv);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ((*t)[0].shape, (Shape{8, 5}));
  EXPECT_EQ((*t)[1].shape, (Shape{4, 5}));
  EXPECT_EQ((*t)[2].name, "model.layers.0.self_attn.v_proj.weight");
}

TEST(MegatronSourceTest, SpecSourceSection) {
  auto s = spec::ParseModelSpec(
      "model: m\nsource: {layout: megatron, num_attention_heads: 8, num_query_groups: 2, head_dim: 64, vocab_size: 100}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->source.has_value());
  EXPECT_EQ(s->source->num_query_groups, 2);
  EXPECT_EQ(s->source->vocab_size, 100);
  auto bad = spec::ParseModelSpec("model: m\nsource: {layout: megatron, num_attention_heads: 8, num_query_groups: 3, head_dim: 64}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("source.num_query_groups"), std::string::npos) << bad.status();
  // Sizes left out are the model config's; without one, listed (a push that needs them is refused).
  auto missing = spec::ParseModelSpec("model: m\nsource: {layout: megatron, num_attention_heads: 8}\n");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->unresolved,
            (std::vector<std::string>{"source.num_query_groups (line 2)", "source.head_dim (line 2)"}));
  auto other = spec::ParseModelSpec("model: m\nsource: {layout: fsdp, num_attention_heads: 8}\n");
  ASSERT_FALSE(other.ok());
}

spec::MegatronSource Mla(int64_t q_lora_rank = 0) {
  spec::MegatronSource m;
  m.attention = spec::MegatronSource::Attention::kMla;
  m.q_lora_rank = q_lora_rank;
  return m;
}

std::string NameOf(const spec::MegatronSource& m, const std::string& name) {
  TensorDesc d = Slice(name, {4, 2}, 0, {4, 2});
  d.slice = {};
  auto r = MapMegatron(m, d);
  if (!r.ok()) return "error: " + std::string(r.status().message());
  if (!r->has_value() || (*r)->size() != 1) return "?";
  return (**r)[0].desc.name;
}

TEST(MegatronSourceTest, MlaNamesAreDeepSeekV3s) {
  const spec::MegatronSource m = Mla();
  const std::string a = "decoder.layers.3.self_attention.";
  const std::string h = "model.layers.3.self_attn.";
  EXPECT_EQ(NameOf(m, a + "linear_q_down_proj.weight"), h + "q_a_proj.weight");
  EXPECT_EQ(NameOf(m, a + "linear_q_up_proj.weight"), h + "q_b_proj.weight");
  EXPECT_EQ(NameOf(m, a + "linear_q_up_proj.layer_norm_weight"), h + "q_a_layernorm.weight");
  EXPECT_EQ(NameOf(m, a + "q_layernorm.weight"), h + "q_a_layernorm.weight");  // local spec
  EXPECT_EQ(NameOf(m, a + "linear_q_proj.weight"), h + "q_proj.weight");        // q_lora_rank None
  EXPECT_EQ(NameOf(m, a + "linear_kv_down_proj.weight"), h + "kv_a_proj_with_mqa.weight");
  EXPECT_EQ(NameOf(m, a + "linear_kv_up_proj.weight"), h + "kv_b_proj.weight");
  EXPECT_EQ(NameOf(m, a + "linear_kv_up_proj.layer_norm_weight"), h + "kv_a_layernorm.weight");
  EXPECT_EQ(NameOf(m, a + "kv_layernorm.weight"), h + "kv_a_layernorm.weight");
  EXPECT_EQ(NameOf(m, a + "linear_q_down_proj.layer_norm_weight"), "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(NameOf(m, a + "linear_proj.weight"), h + "o_proj.weight");
  EXPECT_EQ(NameOf(m, "decoder.layers.3.mlp.shared_experts.linear_fc2.weight"),
            "model.layers.3.mlp.shared_experts.down_proj.weight");
  EXPECT_EQ(NameOf(m, "decoder.layers.3.mlp.router.weight"), "model.layers.3.mlp.gate.weight");
  EXPECT_EQ(NameOf(m, "decoder.layers.3.mlp.router.expert_bias"), "model.layers.3.mlp.gate.e_score_correction_bias");
  // Without MLA, q_layernorm is Qwen3's per-head q_norm; MLA names are unknown.
  EXPECT_EQ(NameOf(Source(1, 1, 1), a + "q_layernorm.weight"), h + "q_norm.weight");
  EXPECT_NE(NameOf(Source(1, 1, 1), a + "linear_q_up_proj.weight").find("no checkpoint name"), std::string::npos);
  EXPECT_NE(NameOf(m, a + "linear_qkv.weight").find("no checkpoint name"), std::string::npos);
}

TEST(MegatronSourceTest, MlaUpProjectionShardsKeepTheirRows) {
  auto m = MapMegatron(Mla(), Slice("decoder.layers.0.self_attention.linear_kv_up_proj.weight", {6, 4}, 6, {12, 4}));
  ASSERT_TRUE(m.ok()) << m.status();
  Expect(**m, {{"model.layers.0.self_attn.kv_b_proj.weight", 6, 6, 12, 0}}, 4);
}

TEST(MegatronSourceTest, FusedMlaDownProjectionSplitsAtQLoraRank) {
  // [q_a_proj 8 rows; kv_a_proj_with_mqa 6 rows], pushed as TP shards of 7 rows.
  auto r0 = MapMegatron(Mla(8), Slice("decoder.layers.1.self_attention.linear_qkv_down_proj.weight", {7, 2}, 0, {14, 2}));
  auto r1 = MapMegatron(Mla(8), Slice("decoder.layers.1.self_attention.linear_qkv_down_proj.weight", {7, 2}, 7, {14, 2}));
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status() << r1.status();
  Expect(**r0, {{"model.layers.1.self_attn.q_a_proj.weight", 7, 0, 8, 0}}, 2);
  Expect(**r1, {{"model.layers.1.self_attn.q_a_proj.weight", 1, 7, 8, 0},
                {"model.layers.1.self_attn.kv_a_proj_with_mqa.weight", 6, -1, 6, 1}}, 2);  // whole
  auto none = MapMegatron(Mla(), Slice("decoder.layers.1.self_attention.linear_qkv_down_proj.weight", {7, 2}, 0, {14, 2}));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("q_lora_rank"), std::string::npos);
}

TEST(MegatronSourceTest, SharedExpertsFc1IsGateAndUpShards) {
  auto m = MapMegatron(Mla(), Slice("decoder.layers.2.mlp.shared_experts.linear_fc1.weight", {6, 4}, 6, {12, 4}));
  ASSERT_TRUE(m.ok()) << m.status();
  Expect(**m, {{"model.layers.2.mlp.shared_experts.gate_proj.weight", 3, 3, 6, 0},
               {"model.layers.2.mlp.shared_experts.up_proj.weight", 3, 3, 6, 3}}, 4);
}

spec::MegatronSource GptOss(int64_t experts) {
  spec::MegatronSource m = Source(4, 2, 2);
  m.experts = spec::MegatronSource::Experts::kGptOss;
  m.num_experts = experts;
  return m;
}

TEST(MegatronSourceTest, GptOssExpertsAreReorderedEntriesOfTheStackedTensors) {
  TensorDesc fc1 = Slice("decoder.layers.1.mlp.experts.linear_fc1.weight2", {4, 3}, 0, {4, 3});
  fc1.slice = {};
  auto m = MapMegatron(GptOss(4), fc1);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->size(), 1u);
  const SourcePiece& p = (**m)[0];
  EXPECT_EQ(p.desc.name, "model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(p.desc.shape, (Shape{1, 3, 4}));
  EXPECT_EQ(p.desc.slice.start, 2u);
  EXPECT_EQ(p.desc.slice.full_shape, (Shape{4, 3, 4}));
  EXPECT_EQ(p.reorder, Reorder::kGluInterleaveT);
  // Rows [g0; g1; u0; u1] of 3 columns -> [3, 4] with columns g0 u0 g1 u1.
  std::vector<uint16_t> src(12), dst(12);
  for (uint16_t i = 0; i < 12; ++i) src[i] = i;
  ReorderPiece(p, reinterpret_cast<const uint8_t*>(src.data()), reinterpret_cast<uint8_t*>(dst.data()));
  EXPECT_EQ(dst, (std::vector<uint16_t>{0, 6, 3, 9, 1, 7, 4, 10, 2, 8, 5, 11}));
  // down: [H=2, I=3] transposed into [1, 3, 2]; its bias is entry e as it is.
  TensorDesc fc2 = fc1;
  fc2.name = "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight";
  fc2.shape = {2, 3};
  fc2.nbytes = 12;
  auto d = MapMegatron(GptOss(4), fc2);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((**d)[0].desc.name, "model.layers.1.mlp.experts.down_proj");
  EXPECT_EQ((**d)[0].desc.shape, (Shape{1, 3, 2}));
  EXPECT_EQ((**d)[0].reorder, Reorder::kTranspose);
  TensorDesc b1 = fc1;
  b1.name = "decoder.layers.1.mlp.experts.linear_fc1.bias0";
  b1.shape = {4};
  b1.nbytes = 8;
  auto b = MapMegatron(GptOss(4), b1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((**b)[0].desc.name, "model.layers.1.mlp.experts.gate_up_proj_bias");
  std::vector<uint16_t> bs{0, 1, 2, 3}, bd(4);
  ReorderPiece((**b)[0], reinterpret_cast<const uint8_t*>(bs.data()), reinterpret_cast<uint8_t*>(bd.data()));
  EXPECT_EQ(bd, (std::vector<uint16_t>{0, 2, 1, 3}));
  EXPECT_EQ(NameOf(GptOss(4), "decoder.layers.1.mlp.router.bias"), "model.layers.1.mlp.router.bias");
  EXPECT_EQ(NameOf(GptOss(4), "decoder.layers.1.self_attention.core_attention.softmax_offset"),
            "model.layers.1.self_attn.sinks");
  // A TP shard of an expert, or an expert past num_experts, is refused naming the tensor.
  auto sliced = MapMegatron(GptOss(4), Slice("decoder.layers.1.mlp.experts.linear_fc1.weight0", {2, 3}, 0, {4, 3}));
  ASSERT_FALSE(sliced.ok());
  EXPECT_NE(sliced.status().message().find("linear_fc1.weight0"), std::string::npos);
  fc1.name = "decoder.layers.1.mlp.experts.linear_fc1.weight4";
  EXPECT_FALSE(MapMegatron(GptOss(4), fc1).ok());
}

TEST(MegatronSourceTest, SpecSourceSectionMlaAndGptOss) {
  auto mla = spec::ParseModelSpec("model: m\nsource: {layout: megatron, attention: mla, q_lora_rank: 64}\n");
  ASSERT_TRUE(mla.ok()) << mla.status();
  EXPECT_EQ(mla->source->attention, spec::MegatronSource::Attention::kMla);
  EXPECT_EQ(mla->source->q_lora_rank, 64);
  auto oss = spec::ParseModelSpec(
      "model: m\nsource: {layout: megatron, experts: gpt_oss, num_experts: 4, num_attention_heads: 4, "
      "num_query_groups: 2, head_dim: 8}\n");
  ASSERT_TRUE(oss.ok()) << oss.status();
  EXPECT_EQ(oss->source->num_experts, 4);
  auto no_count = spec::ParseModelSpec(
      "model: m\nsource: {layout: megatron, experts: gpt_oss, num_attention_heads: 4, num_query_groups: 2, head_dim: 8}\n");
  ASSERT_TRUE(no_count.ok()) << no_count.status();
  EXPECT_EQ(no_count->source->num_experts, 0);
  EXPECT_EQ(no_count->unresolved, (std::vector<std::string>{"source.num_experts (line 2)"}));
  EXPECT_FALSE(spec::ParseModelSpec("model: m\nsource: {layout: megatron, attention: mha}\n").ok());
}

// Qwen3-Next / Qwen3.5: 4 heads in 2 query groups of head_dim 2 with an output gate per head;
// gated delta-net of 2 key heads (dim 2) and 4 value heads (dim 1).
spec::MegatronSource Qwen35() {
  spec::MegatronSource m = Source(4, 2, 2);
  m.attention = spec::MegatronSource::Attention::kGated;
  m.linear_num_key_heads = 2;
  m.linear_key_head_dim = 2;
  m.linear_num_value_heads = 4;
  m.linear_value_head_dim = 1;
  return m;
}

TEST(MegatronSourceTest, GatedQkvSplitsQueryAndGatePerHead) {
  // Per group [q h0; q h1; gate h0; gate h1; k; v] = 12 rows; TP rank 1 holds group 1 (heads 2,
  // 3). HF q_proj: per head [q; gate], 4 rows a head.
  auto m = MapMegatron(Qwen35(), Slice("decoder.layers.1.self_attention.linear_qkv.weight", {12, 3}, 12, {24, 3}));
  ASSERT_TRUE(m.ok()) << m.status();
  Expect(**m, {{"model.layers.1.self_attn.q_proj.weight", 2, 8, 16, 0},
               {"model.layers.1.self_attn.q_proj.weight", 2, 10, 16, 4},
               {"model.layers.1.self_attn.q_proj.weight", 2, 12, 16, 2},
               {"model.layers.1.self_attn.q_proj.weight", 2, 14, 16, 6},
               {"model.layers.1.self_attn.k_proj.weight", 2, 2, 4, 8},
               {"model.layers.1.self_attn.v_proj.weight", 2, 2, 4, 10}}, 3);
  // Without the gate the same rows are not explained by the heads.
  auto plain = MapMegatron(Source(4, 2, 2), Slice("decoder.layers.1.self_attention.linear_qkv.weight", {12, 3}, 12, {24, 3}));
  EXPECT_FALSE(plain.ok());
}

TEST(MegatronSourceTest, GatedDeltaNetInProjRegroupsPerKeyHead) {
  // TP rank 1 of 2: key head 1, value heads 2 and 3; local rows [q 2; k 2; v 2; z 2; b 2; a 2].
  // HF in_proj_qkvz per key head [q 2; k 2; v 2; z 2] (16 rows), in_proj_ba per key head [b 2; a 2].
  auto m = MapMegatron(Qwen35(), Slice("decoder.layers.0.self_attention.in_proj.weight", {12, 3}, 12, {24, 3}));
  ASSERT_TRUE(m.ok()) << m.status();
  Expect(**m, {{"model.layers.0.linear_attn.in_proj_qkvz.weight", 2, 8, 16, 0},
               {"model.layers.0.linear_attn.in_proj_qkvz.weight", 2, 10, 16, 2},
               {"model.layers.0.linear_attn.in_proj_qkvz.weight", 2, 12, 16, 4},
               {"model.layers.0.linear_attn.in_proj_qkvz.weight", 2, 14, 16, 6},
               {"model.layers.0.linear_attn.in_proj_ba.weight", 2, 4, 8, 8},
               {"model.layers.0.linear_attn.in_proj_ba.weight", 2, 6, 8, 10}}, 3);
  // Not a whole TP shard, or rows the heads do not explain: refused naming the tensor.
  auto half = MapMegatron(Qwen35(), Slice("decoder.layers.0.self_attention.in_proj.weight", {8, 3}, 4, {24, 3}));
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("in_proj.weight"), std::string::npos);
  EXPECT_FALSE(MapMegatron(Qwen35(), Slice("decoder.layers.0.self_attention.in_proj.weight", {13, 3}, 0, {26, 3})).ok());
  spec::MegatronSource no_dims = Qwen35();
  no_dims.linear_value_head_dim = 0;
  EXPECT_FALSE(MapMegatron(no_dims, Slice("decoder.layers.0.self_attention.in_proj.weight", {12, 3}, 12, {24, 3})).ok());
  // The manifest: the whole in_proj stands for both checkpoint tensors.
  TensorDesc whole = Slice("decoder.layers.0.self_attention.in_proj.weight", {12, 3}, 0, {24, 3});
  auto mf = MapMegatronManifest(Qwen35(), whole);
  ASSERT_TRUE(mf.ok()) << mf.status();
  ASSERT_EQ(mf->size(), 2u);
  EXPECT_EQ((*mf)[0].name, "model.layers.0.linear_attn.in_proj_qkvz.weight");
  EXPECT_EQ((*mf)[0].shape, (Shape{16, 3}));
  EXPECT_EQ((*mf)[1].name, "model.layers.0.linear_attn.in_proj_ba.weight");
  EXPECT_EQ((*mf)[1].shape, (Shape{8, 3}));
}

TEST(MegatronSourceTest, GatedDeltaNetConvIsQkvOfItsHeads) {
  // conv1d [12, 1, 4]: HF channels [q 4; k 4; v 4]; TP rank 1 holds [q 2; k 2; v 2] of its heads.
  TensorDesc c = Slice("decoder.layers.0.self_attention.conv1d.weight", {6, 1, 4}, 6, {12, 1, 4});
  auto m = MapMegatron(Qwen35(), c);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<std::pair<uint64_t, uint64_t>> want = {{2, 0}, {6, 2}, {10, 4}};  // checkpoint row, source row
  ASSERT_EQ((*m)->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const SourcePiece& p = (**m)[i];
    EXPECT_EQ(p.desc.name, "model.layers.0.linear_attn.conv1d.weight");
    EXPECT_EQ(p.desc.shape, (Shape{2, 1, 4}));
    EXPECT_EQ(p.desc.slice.start, want[i].first);
    EXPECT_EQ(p.desc.slice.full_shape, (Shape{12, 1, 4}));
    EXPECT_EQ(p.src_offset, want[i].second * 4 * 2);
  }
}

TEST(MegatronSourceTest, Qwen35RenamesMtpSharedExpertAndTheUnmappedOutNorm) {
  auto one = [](const std::string& name) {
    TensorDesc d = Slice(name, {2, 3}, 2, {4, 3});
    auto m = MapMegatron(Qwen35(), d);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status();
    if (!m.ok() || !m->has_value() || (*m)->size() != 1) return std::string("?");
    EXPECT_EQ((**m)[0].desc.slice.start, 2u) << name;  // the slice as pushed
    return (**m)[0].desc.name;
  };
  EXPECT_EQ(one("decoder.layers.0.self_attention.A_log"), "model.layers.0.linear_attn.A_log");
  EXPECT_EQ(one("decoder.layers.0.self_attention.dt_bias"), "model.layers.0.linear_attn.dt_bias");
  EXPECT_EQ(one("decoder.layers.0.self_attention.out_proj.weight"), "model.layers.0.linear_attn.out_proj.weight");
  EXPECT_EQ(one("decoder.layers.0.self_attention.in_proj.layer_norm_weight"), "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(one("mtp.layers.0.eh_proj.weight"), "mtp.fc.weight");
  EXPECT_EQ(one("mtp.layers.0.enorm.weight"), "mtp.pre_fc_norm_embedding.weight");
  EXPECT_EQ(one("mtp.layers.0.hnorm.weight"), "mtp.pre_fc_norm_hidden.weight");
  EXPECT_EQ(one("mtp.layers.0.final_layernorm.weight"), "mtp.norm.weight");
  EXPECT_EQ(one("mtp.layers.0.transformer_layer.self_attention.linear_qkv.layer_norm_weight"),
            "mtp.layers.0.input_layernorm.weight");
  EXPECT_EQ(one("mtp.layers.0.transformer_layer.mlp.linear_fc2.weight"), "mtp.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(one("decoder.layers.2.mlp.shared_experts.linear_fc2.weight"), "model.layers.2.mlp.shared_expert.down_proj.weight");
  EXPECT_EQ(one("decoder.layers.2.mlp.shared_experts.gate_weight"), "model.layers.2.mlp.shared_expert_gate.weight");
  // The MTP layer's MLP: [gate; up] per TP rank like any linear_fc1.
  auto fc1 = MapMegatron(Qwen35(), Slice("mtp.layers.0.transformer_layer.mlp.linear_fc1.weight", {4, 3}, 4, {8, 3}));
  ASSERT_TRUE(fc1.ok()) << fc1.status();
  Expect(**fc1, {{"mtp.layers.0.mlp.gate_proj.weight", 2, 2, 4, 0}, {"mtp.layers.0.mlp.up_proj.weight", 2, 2, 4, 2}}, 3);
  // Checkpoint names under mtp. pass through.
  auto ckpt = MapMegatron(Qwen35(), Slice("mtp.layers.0.input_layernorm.weight", {2, 3}, 0, {2, 3}));
  ASSERT_TRUE(ckpt.ok());
  EXPECT_FALSE(ckpt->has_value());
  // out_norm holds the checkpoint's norm minus 1: refused, naming both.
  auto norm = MapMegatron(Qwen35(), Slice("decoder.layers.0.self_attention.out_norm.weight", {2, 3}, 0, {2, 3}));
  ASSERT_FALSE(norm.ok());
  EXPECT_NE(norm.status().message().find("decoder.layers.0.self_attention.out_norm.weight"), std::string::npos);
  EXPECT_NE(norm.status().message().find("model.layers.0.linear_attn.norm.weight"), std::string::npos);
  EXPECT_FALSE(MapMegatron(Qwen35(), Slice("decoder.layers.0.self_attention.conv1d.bias", {2, 3}, 0, {2, 3})).ok());
  EXPECT_FALSE(MapMegatron(Qwen35(), Slice("mtp.layers.1.eh_proj.weight", {2, 3}, 0, {2, 3})).ok());
  // Without attention: gated, GDN names are unknown and mtp. names are the checkpoint's.
  EXPECT_FALSE(MapMegatron(Source(4, 2, 2), Slice("decoder.layers.0.self_attention.A_log", {2, 3}, 0, {2, 3})).ok());
  auto mtp = MapMegatron(Source(4, 2, 2), Slice("mtp.layers.0.eh_proj.weight", {2, 3}, 0, {2, 3}));
  ASSERT_TRUE(mtp.ok());
  EXPECT_FALSE(mtp->has_value());
}

TEST(MegatronSourceTest, SpecSourceSectionGated) {
  auto s = spec::ParseModelSpec(
      "model: m\nsource: {layout: megatron, attention: gated, num_attention_heads: 4, num_query_groups: 2, "
      "head_dim: 8, linear_num_key_heads: 2, linear_key_head_dim: 4, linear_num_value_heads: 4, "
      "linear_value_head_dim: 4}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->source->attention, spec::MegatronSource::Attention::kGated);
  EXPECT_EQ(s->source->linear_num_value_heads, 4);
  auto bare = spec::ParseModelSpec("model: m\nsource: {layout: megatron, attention: gated, num_attention_heads: 4}\n");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->unresolved.size(), 6u);  // groups, head_dim and the four gated delta-net sizes
  EXPECT_FALSE(spec::ParseModelSpec("model: m\nsource: {layout: megatron, num_attention_heads: 4, num_query_groups: 2, "
                                    "head_dim: 8, linear_num_key_heads: 2}\n").ok());
  EXPECT_FALSE(spec::ParseModelSpec("model: m\nsource: {layout: megatron, attention: gated, num_attention_heads: 4, "
                                    "num_query_groups: 2, head_dim: 8, linear_num_key_heads: 3, "
                                    "linear_num_value_heads: 4}\n").ok());
}

}  // namespace
}  // namespace refit
