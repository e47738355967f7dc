#!/usr/bin/env python3
"""Regenerates tests/golden/layout_data/: engine layouts and derived parameters, by their oracles.

Two files, each holding inputs `in.<case>[.<part>]` and expected outputs `out.<case>[.<part>]`:

  layout_data/moe_shuffle.safetensors   TRT-LLM / FlashInfer fused-MoE weight and scale shuffles
  layout_data/mla_absorb.safetensors    SGLang DeepSeek MLA absorbed weights w_kc / w_vc

Oracles (never refitd's code):

* Row permutations: FlashInfer itself (flashinfer-python 0.7.2.post1), run on the CPU:
  `flashinfer/utils.py::get_shuffle_matrix_a_row_indices`, `get_shuffle_matrix_sf_a_row_indices`,
  `flashinfer/fused_moe/core.py::_maybe_get_cached_w3_w1_permute_indices` (reorder rows for the
  gated-activation GEMM, then shuffle, composed as `permute0[permute1]`),
  `get_w2_permute_indices_with_cache`, `reorder_rows_for_gated_act_gemm` and
  `flashinfer/quantization/fp4_quantization.py::shuffle_matrix_a`.
* The block-scale interleave: FlashInfer's `block_scale_interleave` (the second half of
  `shuffle_matrix_sf_a`) runs only as a CUDA op; its bytes here come from a transcription of the
  host implementation FlashInfer ships with that op, `blockScaleInterleaveHost` and
  `computeSFIndex(..., SWIZZLED_128x4)` in
  `flashinfer/data/csrc/nv_internal/tensorrt_llm/thop/fp4Op.cpp` (0.7.2.post1), cross-checked
  against SGLang's torch form of the same layout (reshape (Mp/128, 4, 32, Kp/4, 4), permute
  (0, 3, 2, 1, 4)).
* MLA: a transcription of SGLang `python/sglang/srt/models/deepseek_v2.py`,
  `DeepseekV2ForCausalLM.post_load_weights` (the CUDA branch: BF16 kv_b_proj as is; block-FP8
  128x128 dequantized by `python/sglang/srt/layers/quantization/fp8_utils.py::block_quant_dequant`
  to BF16), then `unflatten` / `split` / `transpose(1, 2).contiguous().transpose(1, 2)` for w_kc and
  `contiguous().transpose(1, 2)` for w_vc. The expected bytes are the storage of those tensors in
  memory order: w_kc as [heads, kv_lora_rank, qk_nope_head_dim], w_vc as
  [heads, v_head_dim, kv_lora_rank]. SGLang itself is not imported (it does not install on a
  machine without CUDA); its torch code is transcribed line for line below.

Deterministic: re-running reproduces the committed files byte for byte; `--check` verifies that.
Needs torch and flashinfer-python==0.7.2.post1 (its Python functions import without a GPU).

Usage: make_layout_goldens.py [--out DIR] [--check]
"""

import argparse
import importlib.metadata
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

FLASHINFER_VERSION = "0.7.2.post1"
EPILOGUE_TILE_M = 128  # every caller's value ("TRTLLM kernel-internal constant")


def raw(t):
    t = t.contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.uint8 else t.numpy().tobytes()


def st_dtype(t):
    return {torch.uint8: "U8", torch.bfloat16: "BF16", torch.float32: "F32",
            torch.float8_e4m3fn: "F8_E4M3"}[t.dtype]


def entry(t):
    return (st_dtype(t), list(t.shape), raw(t))


# ---- FlashInfer block_scale_interleave: transcription of blockScaleInterleaveHost (fp4Op.cpp) ----

def compute_sf_index_128x4(row, col, total_column):
    """computeSFIndex(rowIdx, colIdx, totalRow, totalColumn, SWIZZLED_128x4), fp4Op.cpp."""
    k_column_group0_size = 4
    k_row_group0_size = 32
    k_row_group1_size = k_row_group0_size * 4
    padded_column = (total_column + 3) // 4 * 4
    column_idx_in_group0 = col % k_column_group0_size
    column_group_idx = col // k_column_group0_size
    column_group_stride = k_column_group0_size * k_row_group1_size
    row_idx_in_group0 = row % k_row_group0_size
    row_idx_in_group1 = row % k_row_group1_size // k_row_group0_size
    row_group_idx = row // k_row_group1_size
    row_group1_stride = k_column_group0_size
    row_group0_stride = k_column_group0_size * row_group1_stride
    row_group_stride = k_row_group1_size * padded_column
    return (column_idx_in_group0 + column_group_idx * column_group_stride
            + row_idx_in_group0 * row_group0_stride + row_idx_in_group1 * row_group1_stride
            + row_group_idx * row_group_stride)


def block_scale_interleave_host(sf):
    """blockScaleInterleaveHost<uint8_t>: [E, rows, cols] or [rows, cols] -> flat, per expert
    round_up(rows, 128) * round_up(cols, 4) bytes, zero padding."""
    assert sf.dtype == torch.uint8
    experts = sf.shape[0] if sf.dim() == 3 else 1
    rows, cols = sf.shape[-2], sf.shape[-1]
    rows_padded = (rows + 127) // 128 * 128
    cols_padded = (cols + 3) // 4 * 4
    expert_out_size = rows_padded * cols_padded
    flat = sf.reshape(-1).tolist()
    out = [0] * (experts * expert_out_size)
    for e in range(experts):
        for r in range(rows_padded):
            for c in range(cols_padded):
                v = flat[(e * rows + r) * cols + c] if r < rows and c < cols else 0
                out[e * expert_out_size + compute_sf_index_128x4(r, c, cols)] = v
    return torch.tensor(out, dtype=torch.uint8)


def block_scale_interleave_torch(sf):
    """The same layout as SGLang's torch swizzle (cross-check only)."""
    experts = sf.shape[0] if sf.dim() == 3 else 1
    rows, cols = sf.shape[-2], sf.shape[-1]
    mp, kp = (rows + 127) // 128 * 128, (cols + 3) // 4 * 4
    padded = torch.zeros((experts, mp, kp), dtype=torch.uint8)
    padded[:, :rows, :cols] = sf.reshape(experts, rows, cols)
    return padded.reshape(experts, mp // 128, 4, 32, kp // 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(-1)


def interleave(sf):
    a = block_scale_interleave_host(sf)
    b = block_scale_interleave_torch(sf)
    if not torch.equal(a, b):
        sys.exit("block_scale_interleave transcription and the torch layout disagree")
    return a


# ---- MoE cases ----

def moe_cases(gen):
    from flashinfer.fused_moe.core import (_maybe_get_cached_w3_w1_permute_indices,
                                           get_w2_permute_indices_with_cache,
                                           reorder_rows_for_gated_act_gemm)
    from flashinfer.quantization.fp4_quantization import shuffle_matrix_a
    from flashinfer.utils import get_shuffle_matrix_a_row_indices

    def rand_u8(*shape):
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.int64).to(torch.uint8)

    out = {}

    def w13(name, experts, inter, hidden, sf_vec):
        """[w1; w3] per expert (the checkpoint / SGLang order) -> FlashInfer trtllm FC1:
        [w3; w1], reordered for the gated-activation GEMM, shuffled; scales the same rows, then
        interleaved (prepare_static_weights_for_trtllm_fp4_moe in FlashInfer's tests)."""
        data = rand_u8(experts, 2 * inter, hidden // 2)
        scale = rand_u8(experts, 2 * inter, hidden // sf_vec)
        cache = {}
        data_out, scale_out = [], []
        for e in range(experts):
            w31 = torch.cat([data[e, inter:], data[e, :inter]], dim=0)
            s31 = torch.cat([scale[e, inter:], scale[e, :inter]], dim=0)
            p = _maybe_get_cached_w3_w1_permute_indices(cache, w31, EPILOGUE_TILE_M)
            data_out.append(w31[p])
            ps = _maybe_get_cached_w3_w1_permute_indices(cache, s31, EPILOGUE_TILE_M, num_elts_per_sf=sf_vec)
            scale_out.append(s31[ps])
        out[f"in.{name}.data"] = data
        out[f"in.{name}.scale"] = scale
        out[f"out.{name}.data"] = torch.stack(data_out)
        out[f"out.{name}.scale"] = interleave(torch.stack(scale_out))

    def w2(name, experts, inter, hidden, sf_vec):
        """FC2 (down): shuffle only; scales shuffled then interleaved."""
        data = rand_u8(experts, hidden, inter // 2)
        scale = rand_u8(experts, hidden, inter // sf_vec)
        cache = {}
        data_out, scale_out = [], []
        for e in range(experts):
            p = get_w2_permute_indices_with_cache(cache, data[e], EPILOGUE_TILE_M)
            data_out.append(data[e][p])
            ps = get_w2_permute_indices_with_cache(cache, scale[e], EPILOGUE_TILE_M, num_elts_per_sf=sf_vec)
            scale_out.append(scale[e][ps])
        out[f"in.{name}.data"] = data
        out[f"in.{name}.scale"] = scale
        out[f"out.{name}.data"] = torch.stack(data_out)
        out[f"out.{name}.scale"] = interleave(torch.stack(scale_out))

    w13("nvfp4_w13", 2, 128, 256, 16)
    w2("nvfp4_w2", 2, 128, 256, 16)
    w13("mxfp4_w13", 2, 128, 256, 32)
    w2("mxfp4_w2", 2, 128, 256, 32)
    # Scale columns not a multiple of 4 (NVFP4 hidden 3*16*... = 48 columns -> 3 of 4: padded).
    w2("nvfp4_w2_padcols", 1, 96, 128, 16)

    # gpt-oss on the TRT-LLM MXFP4 MoE (SGLang mxfp4.py): gate_up already interleaved (g, u);
    # every row pair swapped to (u, g), then shuffle_matrix_a only (no gated reorder).
    experts, inter, hidden = 2, 128, 256
    data = rand_u8(experts, 2 * inter, hidden // 2)
    scale = rand_u8(experts, 2 * inter, hidden // 32)
    idx = torch.arange(2 * inter).view(-1, 2).flip(1).reshape(-1)
    d_out, s_out = [], []
    for e in range(experts):
        d_out.append(shuffle_matrix_a(data[e][idx], EPILOGUE_TILE_M))
        s = scale[e][idx]
        s_out.append(s[get_shuffle_matrix_a_row_indices(s, EPILOGUE_TILE_M)])
    out["in.gptoss_w13.data"] = data
    out["in.gptoss_w13.scale"] = scale
    out["out.gptoss_w13.data"] = torch.stack(d_out)
    out["out.gptoss_w13.scale"] = interleave(torch.stack(s_out))

    # shuffle_matrix_a with an epilogue tile that is not a multiple of 128 (blocks of 16 rows).
    data = rand_u8(48, 8)
    out["in.shuffle_tile64.data"] = data
    out["out.shuffle_tile64.data"] = shuffle_matrix_a(data, 64)
    # reorder_rows_for_gated_act_gemm alone.
    data = rand_u8(64, 4)
    out["in.gated_reorder.data"] = data
    out["out.gated_reorder.data"] = reorder_rows_for_gated_act_gemm(data)
    return {k: entry(v) for k, v in out.items()}


# ---- MLA: transcription of SGLang deepseek_v2.py post_load_weights ----

def block_quant_dequant(x_q_block, x_s, block_size, dtype):
    """sglang/srt/layers/quantization/fp8_utils.py::block_quant_dequant."""
    block_n, block_k = block_size[0], block_size[1]
    *_, n, k = x_q_block.shape
    x_scale_repeat = x_s.repeat_interleave(block_n, dim=-2).repeat_interleave(block_k, dim=-1)
    x_scale_repeat = x_scale_repeat[..., :n, :k]
    return (x_q_block.to(torch.float32) * x_scale_repeat).to(dtype)


def post_load_weights_mla(w, weight_scale_inv, qk_nope_head_dim, v_head_dim):
    """The kv_b_proj -> w_kc / w_vc part of DeepseekV2ForCausalLM.post_load_weights (CUDA,
    weight_block_size [128, 128], SGL_USE_DEEPGEMM_BMM unset)."""
    if w.dtype == torch.float8_e4m3fn:
        w = block_quant_dequant(w, weight_scale_inv, [128, 128], torch.bfloat16)
    w_kc, w_vc = w.unflatten(0, (-1, qk_nope_head_dim + v_head_dim)).split([qk_nope_head_dim, v_head_dim], dim=1)
    w_kc = w_kc.transpose(1, 2).contiguous().transpose(1, 2)
    w_vc = w_vc.contiguous().transpose(1, 2)
    # The storage, in memory order.
    kc_mem, vc_mem = w_kc.transpose(1, 2), w_vc.transpose(1, 2)
    assert kc_mem.is_contiguous() and vc_mem.is_contiguous()
    return kc_mem, vc_mem


def mla_cases(gen):
    # DeepSeek-V3 per-head geometry (config.json: qk_nope_head_dim 128, v_head_dim 128,
    # kv_lora_rank 512); 2 heads (one rank's share of kv_b_proj at tensor parallel 64) keeps the
    # file small; the arithmetic does not depend on the head count.
    heads, nope, v, lora = 2, 128, 128, 512
    out = {}
    w = (torch.randn(heads * (nope + v), lora, generator=gen) * 0.05).to(torch.bfloat16)
    kc, vc = post_load_weights_mla(w, None, nope, v)
    out["in.bf16.weight"] = w
    out["out.bf16.w_kc"] = kc
    out["out.bf16.w_vc"] = vc
    # FP8 block 128x128: any finite E4M3 codes and positive scales.
    codes = torch.randint(0, 256, (heads * (nope + v), lora), generator=gen, dtype=torch.int64)
    codes[(codes & 0x7F) == 0x7F] = 0x00  # no NaN codes
    wq = codes.to(torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.exp2(torch.randint(-14, -4, (heads * (nope + v) // 128, lora // 128), generator=gen).float())
    scale = scale * (1.0 + torch.rand(scale.shape, generator=gen))
    kc, vc = post_load_weights_mla(wq, scale, nope, v)
    out["in.fp8.weight"] = wq
    out["in.fp8.weight_scale_inv"] = scale
    out["out.fp8.w_kc"] = kc
    out["out.fp8.w_vc"] = vc
    # A partial last tile along K and rows: 1 head, nope 64, v 96, lora 200 (scales 2 x 2).
    heads, nope, v, lora = 1, 64, 96, 200
    codes = torch.randint(0, 256, (heads * (nope + v), lora), generator=gen, dtype=torch.int64)
    codes[(codes & 0x7F) == 0x7F] = 0x00
    wq = codes.to(torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.rand((2, 2), generator=gen) * 0.01 + 0.001
    kc, vc = post_load_weights_mla(wq, scale, nope, v)
    out["in.fp8_partial.weight"] = wq
    out["in.fp8_partial.weight_scale_inv"] = scale
    out["out.fp8_partial.w_kc"] = kc
    out["out.fp8_partial.w_vc"] = vc
    return {k: entry(t) for k, t in out.items()}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(here, "layout_data"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    have = importlib.metadata.version("flashinfer-python")
    if have != FLASHINFER_VERSION:
        sys.exit(f"flashinfer-python {have}; the goldens are made with {FLASHINFER_VERSION}")
    files = {
        "moe_shuffle.safetensors": moe_cases(torch.Generator().manual_seed(47)),
        "mla_absorb.safetensors": mla_cases(torch.Generator().manual_seed(3)),
    }
    meta = {"oracle": f"flashinfer-python {FLASHINFER_VERSION}, torch {torch.__version__.split('+')[0]}; "
                      "see make_layout_goldens.py"}
    bad = []
    out_dir = args.out
    if args.check:
        out_dir = tempfile.mkdtemp()
    os.makedirs(out_dir, exist_ok=True)
    for name, tensors in files.items():
        blob = st_io.dumps(tensors, meta)
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(blob)
        if args.check:
            with open(os.path.join(args.out, name), "rb") as f:
                if f.read() != blob:
                    bad.append(name)
    if bad:
        sys.exit("differs from the committed file: " + ", ".join(bad))
    print("ok" if args.check else f"wrote {', '.join(files)} to {out_dir}")


if __name__ == "__main__":
    main()
