"""Oracles for the compressed-tensors formats: the compressed-tensors package's own lifecycle and
compressors (pinned in requirements.txt), never refitd's code.

For one BF16 weight the oracle does what llm-compressor's one-shot weight quantization does with
the package: `apply_quantization_config` registers the qparams on a Linear (BF16 scale and zero
point parameters, as a BF16 model gets), the weight observer's statistics are taken (llm-compressor
`memoryless_minmax`: torch.amin/amax of the weight reshaped by the strategy, and for TENSOR_GROUP
the global scale from `generate_gparam` over the absmax), `calculate_qparams` computes the scales,
`update_offload_parameter` stores them in the module's parameters, and the package's
`compress_module` writes the checkpoint tensors. The observer step is the only part taken from
llm-compressor (observers/min_max.py, observers/helpers.py::_flatten_weight,
observers/base.py::get_global_scale, modifiers/quantization/calibration.py::update_qparams), and it
is a plain min/max.

F32 inputs must hold BF16 values (the formats compute in the model's dtype, BF16); they are
quantized as that BF16 tensor.
"""

import copy

import torch
from compressed_tensors.compressors.base import compress_module
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStrategy,
    apply_quantization_config,
)
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from compressed_tensors.utils import update_offload_parameter

FP8_DYNAMIC_TENSOR_INPUT = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True, dynamic=True)

# refitd format -> (scheme arguments, suffixes of the tensors the package writes, in refitd's order)
SCHEMES = {
    "ct_fp8_channel": (PRESET_SCHEMES["FP8_DYNAMIC"], ["weight", "weight_scale"]),
    "ct_fp8_tensor": (dict(weights=PRESET_SCHEMES["FP8"]["weights"], input_activations=FP8_DYNAMIC_TENSOR_INPUT),
                      ["weight", "weight_scale"]),
    "ct_nvfp4": (PRESET_SCHEMES["NVFP4A16"], ["weight_packed", "weight_scale", "weight_global_scale"]),
    "ct_w4a16": (PRESET_SCHEMES["W4A16"], ["weight_packed", "weight_scale", "weight_shape"]),
}


def scheme_for(fmt):
    return QuantizationScheme(targets=["Linear"], **copy.deepcopy(SCHEMES[fmt][0]))


def quantization_config(fmt, ignore=()):
    """The package's QuantizationConfig for a checkpoint of one format (as llm-compressor saves it)."""
    return QuantizationConfig(config_groups={"group_0": scheme_for(fmt)}, ignore=list(ignore),
                              quantization_status="compressed")


def _observe(weight, args):
    """llm-compressor memoryless_minmax for a weight: min/max over the strategy's groups."""
    s = args.strategy
    if s == QuantizationStrategy.TENSOR:
        obs = weight.reshape((1, 1, -1))
    elif s == QuantizationStrategy.CHANNEL:
        obs = weight.unsqueeze(-2).unsqueeze(0)
    elif s in (QuantizationStrategy.GROUP, QuantizationStrategy.TENSOR_GROUP):
        obs = weight.unflatten(-1, (-1, args.group_size)).unsqueeze(0)
    else:
        raise ValueError(f"strategy {s} is not one of refitd's")
    min_vals = torch.amin(obs, dim=(0, -1))
    max_vals = torch.amax(obs, dim=(0, -1))
    global_scale = None
    if s == QuantizationStrategy.TENSOR_GROUP:
        absmax = torch.max(max_vals.max(), -min_vals.min())
        global_scale = generate_gparam(-absmax.reshape(1), absmax.reshape(1))
    scale, zero_point = calculate_qparams(min_vals, max_vals, args, global_scale=global_scale)
    return {"scale": scale, "zero_point": zero_point, "global_scale": global_scale}


def as_bf16(x):
    if x.dtype == torch.bfloat16:
        return x
    b = x.to(torch.bfloat16)
    if not torch.equal(b.to(x.dtype).view(torch.int32), x.view(torch.int32)):
        raise ValueError("a compressed-tensors case holds an F32 value bf16 cannot represent")
    return b


def compress(fmt, x):
    """{package tensor name: tensor} for weight `x` ([N, K]) under format `fmt`."""
    w = as_bf16(x)
    n, k = w.shape
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        model.proj.weight.copy_(w)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme_for(fmt)}))
    lin = model.proj
    for name, value in _observe(lin.weight.data, lin.quantization_scheme.weights).items():
        if value is not None and hasattr(lin, f"weight_{name}"):
            update_offload_parameter(lin, f"weight_{name}", value)
    compress_module(lin)
    state = dict(lin.state_dict())
    return {name: state[name] for name in SCHEMES[fmt][1]}


def triple(t):
    """A tensor as (safetensors dtype, shape, little-endian bytes)."""
    t = t.detach().contiguous()
    names = {torch.bfloat16: ("BF16", torch.int16), torch.float32: ("F32", None), torch.uint8: ("U8", None),
             torch.float8_e4m3fn: ("F8_E4M3", torch.uint8), torch.int32: ("I32", None), torch.int64: ("I64", None)}
    dtype, view = names[t.dtype]
    raw = (t.view(view) if view is not None else t).numpy().tobytes()
    return dtype, tuple(t.shape), raw


def oracle(fmt):
    """The make_goldens.py oracle for `fmt`: tensor -> {refitd suffix: triple}."""
    def run(x, case):
        out = compress(fmt, x)
        return {name[len("weight"):]: triple(t) for name, t in out.items()}
    return run
