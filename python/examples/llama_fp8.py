"""A Llama-style transformers model served from FP8 block-128 weights, as a rollout engine holds
them, and the pieces the GPU refit example builds on both sides of a refit.

Checkpoint format (docs/formats.md, `fp8_block128`): each attention and MLP projection
`P.weight` [N, K] is stored as float8_e4m3fn bytes `P.weight` [N, K] plus float32
`P.weight_scale_inv` [ceil(N/128), ceil(K/128)]; the dequantized weight of element (n, k) is
e4m3(byte) * scale_inv[n // 128, k // 128]. Every other tensor (embeddings, norms, lm_head) stays
BF16. These are the HF names deploy/models/demo-llama.yaml maps trainer tensors onto, unfused.

FP8 bytes are held as uint8 tensors (torch 1.13 has no float8 dtype) and registered with refitd as
F8_E4M3; decoding is exact: a 256-entry table of the e4m3fn values, or torch's own float8 cast where
torch has it (the same values).

Works with torch 1.13 .. 2.x and transformers 4.46 .. 5.x: only LlamaConfig, LlamaForCausalLM(config)
and model(ids).logits are used; generation is a plain greedy loop without a KV cache.
"""
from __future__ import annotations

import json
import re
import struct

import torch
import torch.nn.functional as F

BLOCK = 128
FP8 = "F8_E4M3"

# The projections the spec quantizes (deploy/models/demo-llama.yaml's two fp8_block128 rules).
PROJECTION = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$")

# Model sizes: "small" is the GPU example's default; "tiny" keeps CPU tests fast and has dims that
# are not multiples of 128 (partial blocks).
SIZES = {
    "small": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2),
    "tiny": dict(vocab_size=320, hidden_size=192, intermediate_size=320, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


def llama_config(size: str):
    from transformers import LlamaConfig

    kw = dict(SIZES[size], max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False,
              mlp_bias=False)
    try:
        return LlamaConfig(attn_implementation="eager", **kw)
    except TypeError:  # a transformers without the argument: its default attention
        return LlamaConfig(**kw)


def build_bf16(size: str, seed: int, device="cpu"):
    """LlamaForCausalLM with random init from `seed` (FP32 init on the CPU, so every device gets
    the same values), in BF16 on `device`, eval mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(size))
    return model.to(dtype=torch.bfloat16).to(device).eval()


# ---- FP8 e4m3fn ---------------------------------------------------------------------------


def e4m3_value(code: int) -> float:
    """The float8_e4m3fn value of a byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
    infinities; S.1111.111 is NaN; exponent 0 is subnormal (m/8 * 2^-6)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * (mantissa / 8.0) * 2.0 ** -6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


_TABLES: dict = {}


def e4m3_table(device) -> torch.Tensor:
    """float32 [256]: the value of every e4m3fn byte (exact: at most 4 significant bits)."""
    key = str(device)
    if key not in _TABLES:
        _TABLES[key] = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float32, device=device)
    return _TABLES[key]


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e4m3fn bytes -> float32 values, exactly."""
    if hasattr(torch, "float8_e4m3fn"):
        return codes.view(torch.float8_e4m3fn).to(torch.float32)
    return e4m3_table(codes.device)[codes.long()]


def scale_shape(shape) -> tuple:
    n, k = int(shape[0]), int(shape[1])
    return ((n + BLOCK - 1) // BLOCK, (k + BLOCK - 1) // BLOCK)


def dequantize(codes: torch.Tensor, scale_inv: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """[N, K] e4m3fn bytes times their block's float32 scale (one float32 product per element),
    then rounded to `dtype`."""
    n, k = codes.shape
    sn, sk = scale_inv.shape
    # Each scale broadcast over its block (expand + reshape: no host sync, so CUDA graphs capture it).
    scales = scale_inv[:, None, :, None].expand(sn, BLOCK, sk, BLOCK).reshape(sn * BLOCK, sk * BLOCK)[:n, :k]
    return (decode_e4m3(codes) * scales).to(dtype)


class Fp8Linear(torch.nn.Module):
    """A bias-free linear layer over FP8 block-128 weights: `weight` (uint8 e4m3fn bytes [N, K])
    and `weight_scale_inv` (float32 [ceil(N/128), ceil(K/128)]) are buffers, so the state names are
    the checkpoint's. Each forward dequantizes to the activation dtype and calls F.linear: nothing
    derived from the weights outlives a call, so a refit between calls needs no cache flush."""

    def __init__(self, weight: torch.Tensor, weight_scale_inv: torch.Tensor):
        super().__init__()
        if weight.dtype != torch.uint8 or weight_scale_inv.dtype != torch.float32:
            raise TypeError("Fp8Linear holds uint8 codes and float32 scales")
        if tuple(weight_scale_inv.shape) != scale_shape(weight.shape):
            raise ValueError(f"scales {tuple(weight_scale_inv.shape)} do not fit weight {tuple(weight.shape)}")
        self.in_features, self.out_features = int(weight.shape[1]), int(weight.shape[0])
        self.register_buffer("weight", weight, persistent=True)
        self.register_buffer("weight_scale_inv", weight_scale_inv, persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, dequantize(self.weight, self.weight_scale_inv, x.dtype))


# ---- What the engine holds ----------------------------------------------------------------


def engine_table(model) -> list:
    """[(name, safetensors dtype, shape)] of every tensor the FP8 engine holds and registers, in
    model order: for each projection P, `P.weight` (F8_E4M3) and `P.weight_scale_inv` (F32); every
    other parameter as it is (BF16). Built from the BF16 model, before fp8_engine_model()."""
    table = []
    projections = {name for name, m in model.named_modules() if PROJECTION.match(name)}
    for name, m in model.named_modules():
        if name in projections:
            if not isinstance(m, torch.nn.Linear) or m.bias is not None:
                raise TypeError(f"'{name}' is not a bias-free nn.Linear")
            table.append((name + ".weight", FP8, tuple(m.weight.shape)))
            table.append((name + ".weight_scale_inv", "F32", scale_shape(m.weight.shape)))
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[0] not in projections:
            if p.dtype != torch.bfloat16:
                raise TypeError(f"'{name}' is {p.dtype}, the engine holds BF16")
            table.append((name, "BF16", tuple(p.shape)))
    return table


_TORCH_DTYPES = {FP8: torch.uint8, "F32": torch.float32, "BF16": torch.bfloat16}


def initial_tensors(model, table) -> dict:
    """CPU tensors of the engine before its first refit: zero FP8 codes, unit scales, and the
    BF16 model's own other parameters."""
    params = dict(model.named_parameters())
    out = {}
    for name, dtype, shape in table:
        if dtype == FP8:
            out[name] = torch.zeros(shape, dtype=torch.uint8)
        elif name.endswith(".weight_scale_inv"):
            out[name] = torch.ones(shape, dtype=torch.float32)
        else:
            out[name] = params[name].detach().to("cpu", copy=True)
    return out


def fp8_engine_model(model, tensors: dict):
    """Points `model` at `tensors` (name -> tensor of the engine table, e.g. views of registered
    storage): each projection becomes an Fp8Linear over its two tensors, every other parameter's
    data becomes its tensor (the Parameter objects stay). Returns the model."""
    for name, m in list(model.named_modules()):
        for child_name, child in list(m.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if PROJECTION.match(full):
                setattr(m, child_name, Fp8Linear(tensors[full + ".weight"], tensors[full + ".weight_scale_inv"]))
    for name, p in model.named_parameters():
        t = tensors[name]
        if t.dtype != p.dtype or tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"'{name}': {t.dtype}{tuple(t.shape)} for a {p.dtype}{tuple(p.shape)} parameter")
        p.data = t
    return model


def registered_dtypes(table) -> dict:
    """{name: "F8_E4M3"} for the uint8-held FP8 tensors (what refit's `dtypes=` arguments take)."""
    return {name: dtype for name, dtype, _ in table if dtype == FP8}


# ---- safetensors without torch's float8 (torch 1.13 cannot load F8_E4M3 through safetensors) --


def read_safetensors(path) -> dict:
    """{name: (safetensors dtype, shape, bytes)} of a .safetensors file."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        out[name] = (meta["dtype"], tuple(meta["shape"]), data[begin:end])
    return out


def tensor_from_bytes(dtype: str, shape, raw: bytes, device="cpu") -> torch.Tensor:
    """A tensor of the engine's representation (uint8 codes for F8_E4M3) from safetensors bytes."""
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return t.view(_TORCH_DTYPES[dtype]).view(tuple(shape)).to(device)


def load_checkpoint(path, table, device="cpu") -> dict:
    """The engine table's tensors from a converted checkpoint (refitctl convert's
    model.safetensors); ValueError naming every missing or mismatched tensor."""
    ckpt = read_safetensors(path)
    problems, out = [], {}
    for name, dtype, shape in table:
        if name not in ckpt:
            problems.append(f"'{name}' missing")
            continue
        got_dtype, got_shape, raw = ckpt[name]
        if got_dtype != dtype or tuple(got_shape) != tuple(shape):
            problems.append(f"'{name}' is {got_dtype}{list(got_shape)}, the engine holds {dtype}{list(shape)}")
            continue
        out[name] = tensor_from_bytes(dtype, shape, raw, device)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return out


# ---- Inference ----------------------------------------------------------------------------


@torch.no_grad()
def greedy(model, prompt: list, new_tokens: int, device) -> tuple:
    """Greedy generation without a KV cache: (prompt + new token ids, float32 logits of the last
    step). Every step reruns the whole sequence, so nothing from an older step is reused."""
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    logits = None
    for _ in range(new_tokens):
        logits = model(ids).logits[0, -1].float()
        ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return ids[0].tolist(), logits.cpu()
