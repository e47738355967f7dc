"""Models built with the real megatron-core package (PyPI), TP=1 on one GPU, push their
named_parameters() (and the MoE routers' expert_bias buffers) directly through refit.megatron
into refitd: a Llama-shaped GPT model (grouped-query attention, SwiGLU) and a DeepSeek-V3-shaped
one (MLA with q/kv layer norms, a dense first layer, routed and shared experts).

The reference is each model's weights written as a Hugging Face checkpoint by this test's own
Megatron-core -> HF conversion (below; Megatron-Bridge's published name table, not refitd's
mapping): the engine's bytes after the refit equal `refitctl convert --engine-layout` of that
checkpoint, and for the Llama model the HF model (transformers' LlamaForCausalLM) loaded from it
gives the Megatron-core model's logits. Skips, with the reason, without a CUDA GPU or without
megatron-core."""
import json
import uuid
from pathlib import Path

import pytest

from conftest import needs_torch
from test_megatron import MODELS, Node, assert_engine_equals, engine_layout_checksums, family_checkpoint, \
    llama_checkpoint

pytestmark = needs_torch


def _requirements():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: megatron-core builds its layers and MoE router buffers on the device")
    try:
        import megatron.core  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
        pytest.skip(f"megatron-core is not importable ({type(e).__name__}: {e}); pip install megatron-core")


@pytest.fixture(scope="module")
def megatron_tp1(tmp_path_factory):
    """torch.distributed (one rank, NCCL) and Megatron-core's parallel state at TP=PP=EP=1; a gloo
    group for refit.distributed's object collectives."""
    _requirements()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    model_parallel_cuda_manual_seed(1234)
    gloo = dist.new_group([0], backend="gloo")
    yield gloo
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _common_config(**kw):
    import torch

    return dict(num_layers=2, normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=False,
                gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
                bias_dropout_fusion=False, apply_rope_fusion=False, persist_layer_norm=False, **kw)


def llama_model(dtype):
    """make_checkpoints.py's llama3 shapes: hidden 512, 4 heads in 2 query groups of 128, ffn 768,
    vocabulary 256."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(hidden_size=512, num_attention_heads=4, num_query_groups=2, kv_channels=128,
                               ffn_hidden_size=768, params_dtype=dtype, **_common_config())
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    return GPTModel(config, spec, vocab_size=256, max_sequence_length=64, position_embedding_type="rope",
                    share_embeddings_and_output_weights=False).cuda()


def deepseek_model(dtype):
    """make_checkpoints.py's deepseek_v3 shapes: hidden 256, MLA with 2 heads (q_lora 2048, kv_lora
    512, nope 128, rope 64, v 128), layer 0 dense (ffn 256), layer 1 MoE (4 experts of 128, a shared
    expert of 128, sigmoid router with expert bias), vocabulary 256."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        hidden_size=256, num_attention_heads=2, ffn_hidden_size=256, params_dtype=dtype, q_lora_rank=2048,
        kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, rope_type="rope",
        qk_layernorm=True, num_moe_experts=4, moe_ffn_hidden_size=128, moe_shared_expert_intermediate_size=128,
        moe_layer_freq=[0, 1], moe_router_topk=2, moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True, moe_grouped_gemm=False, moe_token_dispatcher_type="alltoall",
        **_common_config())
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for layer_spec in spec.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = _core_attention_for_mla()
    model = GPTModel(config, spec, vocab_size=256, max_sequence_length=64, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False).cuda()
    import torch

    for name, buf in model.named_buffers():
        if name.endswith("expert_bias"):  # zeros at init; a trained bias is not
            buf.copy_(torch.linspace(-0.1, 0.1, buf.numel(), device=buf.device, dtype=buf.dtype))
    return model


def _core_attention_for_mla():
    """Megatron-core's local DotProductAttention, accepting the k_channels / v_channels that
    MLASelfAttention passes (only Transformer Engine's attention takes them). It has no
    parameters, and this test pushes parameters without running attention."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class CoreAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)

    return CoreAttention


# This test's Megatron-core -> HF names (Megatron-Bridge src/megatron/bridge/models/llama and
# deepseek/common.py name tables; the local spec keeps input_layernorm, pre_mlp_layernorm,
# q_layernorm and kv_layernorm as modules of their own).
_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
}


def to_hf(model, *, groups=0, heads=0, head_dim=0) -> dict:
    import torch

    out = {}
    tensors = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if n.endswith("expert_bias"))
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = t
            continue
        if name == "output_layer.weight":
            out["lm_head.weight"] = t
            continue
        if name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = t
            continue
        assert name.startswith("decoder.layers."), name
        layer, rest = name[len("decoder.layers."):].split(".", 1)
        h = f"model.layers.{layer}."
        if rest in _RENAMES:
            out[h + _RENAMES[rest]] = t
        elif rest == "self_attention.linear_qkv.weight":
            # attention.py: per query group [heads/groups q heads; k; v] of head_dim rows
            qpg = heads // groups
            view = t.view(groups, (qpg + 2) * head_dim, -1)
            out[h + "self_attn.q_proj.weight"] = view[:, :qpg * head_dim].reshape(-1, t.shape[1]).contiguous()
            out[h + "self_attn.k_proj.weight"] = view[:, qpg * head_dim:(qpg + 1) * head_dim].reshape(-1, t.shape[1]).contiguous()
            out[h + "self_attn.v_proj.weight"] = view[:, (qpg + 1) * head_dim:].reshape(-1, t.shape[1]).contiguous()
        elif rest.endswith("linear_fc1.weight"):  # mlp.py: [gate; up]
            prefix = rest[:-len("linear_fc1.weight")]
            hf_prefix = {"mlp.": "mlp.", "mlp.shared_experts.": "mlp.shared_experts."}.get(prefix)
            if hf_prefix is None:  # mlp.experts.local_experts.{e}.
                hf_prefix = "mlp.experts." + prefix.split(".")[3] + "."
            gate, up = torch.chunk(t, 2)
            out[h + hf_prefix + "gate_proj.weight"] = gate.contiguous()
            out[h + hf_prefix + "up_proj.weight"] = up.contiguous()
        elif rest.startswith("mlp.experts.local_experts.") and rest.endswith("linear_fc2.weight"):
            out[h + f"mlp.experts.{rest.split('.')[3]}.down_proj.weight"] = t
        else:
            raise AssertionError(f"no HF name for {name}")
    return out


def write_checkpoint(tensors: dict, out: Path, family: str, like: Path) -> Path:
    """The reference checkpoint in the dtypes of checkpoint `like` (the one the engine registered
    from, so `refitctl convert --engine-layout` gives the engine's dtypes): Megatron-core keeps
    some parameters in FP32 in a BF16 model (its torch RMSNorm weights), which the engine holds
    in BF16."""
    import struct

    import torch
    from safetensors.torch import save_file

    raw = (like / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    tensors = {n: t.to(dtypes[header[n]["dtype"]]).contiguous() for n, t in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text((like / "config.json").read_text())  # the same model: its sizes
    return out


def push(group, node, model_name, model):
    import refit
    import refit.distributed
    import refit.megatron

    shards = refit.megatron.shards(model.named_parameters(), tp_rank=0, tp_size=1,
                                   named_buffers=model.named_buffers())
    with refit.TrainerClient(node.address) as client:
        return refit.distributed.refit(group, client, model_name, shards)


@pytest.fixture(scope="module")
def llama(megatron_tp1):
    """The Llama-shaped model in FP32 with values a BF16 checkpoint holds exactly (as after
    loading one), and its HF tensors."""
    import torch

    model = llama_model(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    return model, to_hf(model, groups=2, heads=4, head_dim=128)


def test_megatron_core_llama_pushes_named_parameters(megatron_tp1, llama, tmp_path):
    model, hf = llama
    ckpt0 = llama_checkpoint(tmp_path / "ckpt0", 0)
    ref = write_checkpoint(hf, tmp_path / "reference", "llama3", like=ckpt0)
    spec = MODELS / "llama3_fp8.yaml"
    expected = engine_layout_checksums(spec, ref, tmp_path / "conv")
    node = Node(_dir(tmp_path, "node"), spec, ckpt0)
    try:
        report = push(megatron_tp1, node, "llama3-fp8", model)  # FP32 CUDA parameters, as they are
        assert report.outcome == "committed", report
        assert_engine_equals(node, expected, report.version)
    finally:
        node.close()


def test_megatron_core_llama_reference_checkpoint_is_the_model(llama):
    """The reference checkpoint is the model: transformers' Llama gives Megatron-core's logits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model, hf = llama
    cfg = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=768, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5,
                      max_position_embeddings=64, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    hf_model = LlamaForCausalLM(cfg).to(torch.float32)
    missing, unexpected = hf_model.load_state_dict(hf, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    hf_model = hf_model.cuda().eval()
    model.eval()
    tokens = torch.randint(0, 256, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    positions = torch.arange(16, device="cuda").unsqueeze(0).expand(2, -1)
    with torch.no_grad():
        ours = model(tokens, positions, None)
        theirs = hf_model(tokens).logits
    if ours.shape != theirs.shape:
        ours = ours.transpose(0, 1)
    err = (ours.float() - theirs.float()).abs().max().item()
    scale = theirs.abs().max().item()
    print(f"megatron-core vs transformers logits: max |diff| {err:.3g}, max |logit| {scale:.3g}")
    assert err <= 1e-3 * max(1.0, scale), err


def test_megatron_core_deepseek_v3_pushes_named_parameters(megatron_tp1, tmp_path):
    import torch

    model = deepseek_model(torch.bfloat16)
    names = [n for n, _ in model.named_parameters()]
    print("megatron-core DeepSeek-V3 parameters:", len(names), names[:40])
    hf = to_hf(model)
    ckpt0 = family_checkpoint("deepseek_v3")(tmp_path / "ckpt0", 0)
    ref = write_checkpoint(hf, tmp_path / "reference", "deepseek_v3", like=ckpt0)
    spec = MODELS / "deepseek_v3_fp8_ue8m0.yaml"
    expected = engine_layout_checksums(spec, ref, tmp_path / "conv")
    node = Node(_dir(tmp_path, "node"), spec, ckpt0)
    try:
        report = push(megatron_tp1, node, "deepseek-v3-fp8-ue8m0", model)
        assert report.outcome == "committed", report
        assert_engine_equals(node, expected, report.version)
    finally:
        node.close()


def _dir(tmp: Path, name: str) -> Path:
    d = tmp / f"{name}-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    return d
