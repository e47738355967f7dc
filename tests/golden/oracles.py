"""Independent oracles for refitd's quantized formats (FORMATS.md Part A and §12).

Each function takes one 2-D input tensor (torch, BF16 or FP32, as stored in the golden input
file) and returns {suffix: (safetensors dtype, shape, bytes)} in the names `refitctl quantize`
emits (suffix "" is the data tensor). Nothing here uses refitd's own code:

  fp8_block128        transcription of DeepGEMM deep_gemm/utils/math.py::per_block_cast_to_fp8
  fp8_block128_ue8m0  the same with use_ue8m0=True, then SGLang's load-time requant
                      (block_quant_dequant to bf16 + per_block_cast_to_fp8(use_ue8m0=True)),
                      which is the canonicalization of FORMATS.md §4.4
  mxfp8               torchao to_mx(RCEIL), cross-checked against a transcription of TE's
                      float_to_e8m0 / exp2f_rcp (ptx.cuh) arithmetic
  nvfp4               nvidia-modelopt NVFP4QTensor.quantize (pure torch on CPU)
  nvfp4_te            transcription of TE custom_recipes/reference_nvfp4.py, 1-D (1x16) tiles,
                      no RHT, no pow2 scales; S_enc = 1 when amax == 0 (the CUDA kernel's rule)
  mxfp4               transcription of triton_kernels numerics_details/mxfp.py::
                      downcast_to_mxfp_torch(uint8, ROUND_UP)

Element casts that the transcriptions perform themselves (E4M3, E2M1) are cross-checked against
ml_dtypes; a disagreement raises. Not thread-safe only in that torch's global state is shared.
"""

import ml_dtypes
import numpy as np
import torch

FLT_MAX = float(np.finfo(np.float32).max)


class OracleDisagreement(AssertionError):
    """Two independent computations of the same bytes disagree."""


# ---------------------------------------------------------------------------------------------
# Element casts (torch, cross-checked with ml_dtypes)


def e4m3_bytes(t):
    """fp32 tensor -> uint8 tensor of E4M3FN codes, RNE; clamped to +-448 first (FORMATS §2.1)."""
    t = t.to(torch.float32)
    clamped = torch.clamp(t, -448.0, 448.0)
    got = clamped.to(torch.float8_e4m3fn).view(torch.uint8)
    ref = clamped.numpy().astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    if not np.array_equal(got.numpy(), ref):
        raise OracleDisagreement("torch and ml_dtypes E4M3 casts disagree")
    return got


def e2m1_ml_dtypes_codes(t):
    """fp32 tensor -> E2M1 codes (0..15) per ml_dtypes RNE (sign from the sign bit)."""
    arr = np.ascontiguousarray(t.to(torch.float32).numpy())
    return torch.from_numpy(arr.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF)


def _u8(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _f32(t):
    return t.contiguous().to(torch.float32).numpy().astype("<f4").tobytes()


def _pack_nibbles(codes):
    """[N, K] codes -> [N, K/2] bytes, element 2i in the low nibble."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _align(x, y):
    return (x + y - 1) // y * y


# ---------------------------------------------------------------------------------------------
# FP8 block-128 (DeepGEMM)


def ceil_to_ue8m0(x):
    # DeepGEMM deep_gemm/utils/math.py::ceil_to_ue8m0
    bits = x.abs().float().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
    return (exp.clamp(1, 254) << 23).view(torch.float32)


def per_block_cast_to_fp8(x, use_ue8m0, gran_k=128):
    """DeepGEMM per_block_cast_to_fp8: returns (uint8 E4M3 codes [m, n], fp32 scales)."""
    assert x.dim() == 2
    m, n = x.shape
    padded = torch.zeros((_align(m, gran_k), _align(n, gran_k)), dtype=x.dtype)
    padded[:m, :n] = x
    view = padded.view(-1, gran_k, padded.size(1) // gran_k, gran_k)
    amax = view.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = amax / 448.0
    sf = ceil_to_ue8m0(sf) if use_ue8m0 else sf
    scaled = view * (1.0 / sf)
    assert scaled.dtype == torch.float32
    # DeepGEMM casts without a clamp; |scaled| <= 448*(1+3eps) < 464 rounds to 448 either way.
    unclamped = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    codes = e4m3_bytes(scaled)
    if not torch.equal(unclamped, codes):
        raise OracleDisagreement("FP8-128: a scaled element reached the E4M3 overflow range")
    return codes.view(padded.shape)[:m, :n].contiguous(), sf.view(view.size(0), view.size(2))


def block_quant_dequant_bf16(codes, sf, m, n):
    """SGLang fp8_utils.block_quant_dequant(..., torch.bfloat16)."""
    q = codes.view(torch.float8_e4m3fn).to(torch.float32)
    rep = sf.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:m, :n]
    return (q * rep).to(torch.bfloat16)


def fp8_block128(x):
    codes, sf = per_block_cast_to_fp8(x, use_ue8m0=False)
    return {"": ("F8_E4M3", tuple(codes.shape), _u8(codes)),
            "_scale_inv": ("F32", tuple(sf.shape), _f32(sf))}


def _canonical_rule(codes, sf, m, n):
    """FORMATS.md §4.4 spelled as a rule: a tile with max|q| == 224 and s >= 2^-21 gets s/2, 2q."""
    q = codes.view(torch.float8_e4m3fn).to(torch.float32)
    out_q, out_s = q.clone(), sf.clone()
    for i in range(sf.shape[0]):
        for j in range(sf.shape[1]):
            tile = (slice(i * 128, min((i + 1) * 128, m)), slice(j * 128, min((j + 1) * 128, n)))
            if q[tile].abs().max().item() == 224.0 and sf[i, j].item() >= 2.0 ** -21:
                out_s[i, j] = sf[i, j] / 2
                out_q[tile] = q[tile] * 2
    return e4m3_bytes(out_q), out_s


def fp8_block128_ue8m0(x):
    m, n = x.shape
    codes, sf = per_block_cast_to_fp8(x, use_ue8m0=True)
    # Blackwell load path (SGLang requant_weight_ue8m0): dequantize to bf16, quantize again.
    deq = block_quant_dequant_bf16(codes, sf, m, n)
    codes2, sf2 = per_block_cast_to_fp8(deq, use_ue8m0=True)
    rule_codes, rule_sf = _canonical_rule(codes, sf, m, n)
    if not (torch.equal(rule_codes, codes2) and torch.equal(rule_sf, sf2)):
        raise OracleDisagreement("UE8M0: SGLang requant and the FORMATS.md §4.4 rule disagree")
    codes3, sf3 = per_block_cast_to_fp8(block_quant_dequant_bf16(codes2, sf2, m, n), True)
    if not (torch.equal(codes3, codes2) and torch.equal(sf3, sf2)):
        raise OracleDisagreement("UE8M0: the requant is not idempotent")
    return {"": ("F8_E4M3", tuple(codes2.shape), _u8(codes2)),
            "_scale_inv": ("F32", tuple(sf2.shape), _f32(sf2))}


# ---------------------------------------------------------------------------------------------
# MXFP8 (TE RCEIL; torchao to_mx RCEIL)


def mxfp8_torchao(x):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scale, data = to_mx(x.contiguous(), torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    return data.view(torch.uint8), scale.view(torch.uint8)


def mxfp8_te(x):
    """TE quantize_mxfp8 arithmetic: e = float_to_e8m0(amax * fl(1/448)), q = E4M3(x * exp2f_rcp(e))."""
    n, k = x.shape
    xf = x.to(torch.float32).view(n, k // 32, 32)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    rcp448 = torch.tensor(np.float32(1.0) / np.float32(448.0), dtype=torch.float32)
    descale = amax * rcp448
    bits = descale.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    # ptx_arch_spec.cuh float_to_e8m0 (non-Blackwell path; cvt.rp.satfinite.ue8m0x2 agrees).
    inc = torch.where(exp == 0, man > 0x400000, man != 0) & (exp != 0xFE)
    e = exp + inc.int()
    e = torch.where(torch.isinf(descale), torch.full_like(e, 0xFE), e)
    e = torch.where(torch.isnan(descale), torch.full_like(e, 0xFF), e)
    # ptx.cuh exp2f_rcp: 1 for e == 0, else 2^(127 - e) built from its bits.
    mult = torch.where(e == 0, torch.ones_like(descale),
                       ((254 - e).clamp(min=0) << 23).view(torch.float32))
    codes = e4m3_bytes(xf * mult).view(n, k)
    return codes, e.view(n, k // 32).to(torch.uint8)


# Inputs on which torchao's eager RCEIL (ceil(log2(amax/448)) in fp32) is known to round the
# exponent down where TE's integer rule rounds up: amax one fp32 ulp above 448*2^k for large |k|
# (FORMATS.md P16, the float-log2 pitfall). For these tensors the TE transcription defines the
# expected bytes; everywhere else torchao and the transcription must agree exactly.
TORCHAO_LOG2_CORNER_CASES = set()


def mxfp8(x, case_name=""):
    data, scale = mxfp8_torchao(x)
    te_data, te_scale = mxfp8_te(x)
    agree = torch.equal(data, te_data) and torch.equal(scale, te_scale)
    if not agree:
        if case_name not in TORCHAO_LOG2_CORNER_CASES:
            raise OracleDisagreement(f"{case_name}: torchao RCEIL and the TE transcription disagree")
        data, scale = te_data, te_scale
    return {"": ("F8_E4M3", tuple(data.shape), _u8(data)),
            "_scale_inv": ("U8", tuple(scale.shape), _u8(scale))}


# ---------------------------------------------------------------------------------------------
# NVFP4 (ModelOpt)


def nvfp4(x):
    from modelopt.torch.quantization.qtensor import nvfp4_tensor

    qt, scale, scale_2 = nvfp4_tensor.NVFP4QTensor.quantize(x, 16)
    data = qt._quantized_data.view(torch.uint8)
    return {"": ("U8", tuple(data.shape), _u8(data)),
            "_scale": ("F8_E4M3", tuple(scale.shape), _u8(scale)),
            "_scale_2": ("F32", (), _f32(scale_2.reshape(())))}


# ---------------------------------------------------------------------------------------------
# NVFP4, TE flavour


def te_cast_to_fp4(x):
    """TE reference_nvfp4.py cast_to_fp4x2 before packing (mask-based, NaN -> 0), except -0.0 -> 8."""
    r = torch.zeros_like(x, dtype=torch.uint8)
    r[(x >= 0.0) & (x <= 0.25)] = 0
    r[(x > 0.25) & (x < 0.75)] = 1
    r[(x >= 0.75) & (x <= 1.25)] = 2
    r[(x > 1.25) & (x < 1.75)] = 3
    r[(x >= 1.75) & (x <= 2.5)] = 4
    r[(x > 2.5) & (x < 3.5)] = 5
    r[(x >= 3.5) & (x <= 5.0)] = 6
    r[x > 5.0] = 7
    r[(x >= -0.25) & (x < -0.0)] = 8
    r[(x < -0.25) & (x > -0.75)] = 9
    r[(x <= -0.75) & (x >= -1.25)] = 10
    r[(x < -1.25) & (x > -1.75)] = 11
    r[(x <= -1.75) & (x >= -2.5)] = 12
    r[(x < -2.5) & (x > -3.5)] = 13
    r[(x <= -3.5) & (x >= -5.0)] = 14
    r[x < -5.0] = 15
    # refitd's nvfp4_te follows TE's CUDA kernel, whose conversion keeps the sign of zero
    # (cvt.rn.satfinite.e2m1x2.f32; the sm_90 software path measured -0.0 -> 8), not the Python
    # reference's mask, which sends -0.0 to 0. Both decode to zero. See docs/formats.md.
    r[(x == 0.0) & torch.signbit(x)] = 8
    return r


def nvfp4_te(x):
    m, n = x.shape
    f32 = torch.float32
    xf = x.to(f32).view(m, n // 16, 16)
    vec_max = xf.abs().amax(dim=-1, keepdim=True)
    amax = x.to(f32).abs().amax()
    fp4_max = torch.tensor(6.0, dtype=f32)
    e4m3_max = torch.tensor(448.0, dtype=f32)
    flt_max = torch.tensor(FLT_MAX, dtype=f32)
    s_enc = torch.min(torch.div(e4m3_max * fp4_max, amax), flt_max)
    if amax.item() == 0.0 or s_enc.item() == 0.0:
        s_enc = torch.tensor(1.0, dtype=f32)  # CUDA kernel; the Python reference keeps FLT_MAX
    s_dec = torch.div(1.0, s_enc)
    multiplier = s_enc * torch.reciprocal(fp4_max)
    sf = torch.min(vec_max * multiplier, flt_max)
    sf = torch.clamp(sf, min=-448.0, max=448.0)
    sf_codes = e4m3_bytes(sf)
    sf_val = sf_codes.view(torch.float8_e4m3fn).to(f32)
    enc = torch.min(torch.div(1.0, sf_val * s_dec), flt_max)
    scaled = torch.clamp(xf * enc, -6.0, 6.0).reshape(m, n)
    codes = te_cast_to_fp4(scaled)
    ref = e2m1_ml_dtypes_codes(scaled)
    if not torch.equal(ref, codes):
        raise OracleDisagreement("TE NVFP4: cast_to_fp4x2 and ml_dtypes E2M1 disagree")
    packed = _pack_nibbles(codes)
    sf_codes = sf_codes.view(m, n // 16)
    return {"": ("U8", tuple(packed.shape), _u8(packed)),
            "_scale": ("F8_E4M3", tuple(sf_codes.shape), _u8(sf_codes)),
            "_scale_2": ("F32", (), _f32(s_dec.reshape(())))}


# ---------------------------------------------------------------------------------------------
# MXFP4 (triton_kernels, ROUND_UP)


def _rshift_u(x, shift):
    return (x >> shift) & ((1 << (32 - shift)) - 1)


def mxfp4(x):
    m, k = x.shape
    src = x.to(torch.float32)
    groups = src.view(m, k // 32, 32)
    max_val = groups.abs().amax(dim=-1, keepdim=True)
    dequant_scale = max_val / 6.0
    ds_int = dequant_scale.view(torch.int32)
    ds_int_rounded = (ds_int + 0x007FFFFF) & 0x7F800000
    ds_rounded = ds_int_rounded.view(torch.float32)
    quant_scale = torch.where(ds_rounded == 0, torch.tensor(0.0), 1.0 / ds_rounded)
    q = (groups * quant_scale).view(m, k)

    q_int = q.contiguous().view(torch.int32)
    signs = q_int & 0x80000000
    exponents = _rshift_u(q_int, 23) & 0xFF
    mant_orig = q_int & 0x7FFFFF
    E8_BIAS, E2_BIAS = 127, 1
    is_sub = exponents < E8_BIAS
    shift = E8_BIAS - exponents - 1
    mant_pre = 0x400000 | _rshift_u(mant_orig, 1)
    bit0_dropped = (mant_orig & 0x1) != 0
    mask = (1 << shift.clamp(max=31)) - 1
    dropped_post = (mant_pre & mask) != 0
    sticky = is_sub & (bit0_dropped | dropped_post)
    mants = torch.where(is_sub, mant_pre >> shift, mant_orig)
    exponents = torch.maximum(exponents, torch.tensor(E8_BIAS - E2_BIAS)) - (E8_BIAS - E2_BIAS)
    m2bits = _rshift_u(mants, 21) & 0x3
    lsb_keep = _rshift_u(m2bits, 1) & 0x1
    guard = m2bits & 0x1
    sticky |= (mants & ((1 << 21) - 1)) != 0
    round_inc = guard & (sticky.to(torch.int32) | lsb_keep)
    e2m1 = _rshift_u(((exponents << 2) | m2bits) + round_inc, 1)
    e2m1 = torch.minimum(e2m1, torch.tensor(0x7))
    codes = (_rshift_u(signs, 28) | e2m1).to(torch.uint8)

    ref = e2m1_ml_dtypes_codes(torch.clamp(q, -6.0, 6.0))
    if not torch.equal(ref, codes):
        raise OracleDisagreement("MXFP4: triton bit conversion and ml_dtypes E2M1 disagree")
    blocks = _pack_nibbles(codes).view(m, k // 32, 16)
    scales = (ds_int_rounded.view(m, k // 32) >> 23).to(torch.uint8)
    return {"_blocks": ("U8", tuple(blocks.shape), _u8(blocks)),
            "_scales": ("U8", tuple(scales.shape), _u8(scales))}
