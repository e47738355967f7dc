"""Golden input cases (FORMATS.md §12.3 edge-case matrix plus random data), per format family.

A case is (name, storage dtype "BF16" | "F32", fp32 torch tensor of its exact values). Values of
BF16 cases are exactly representable in bf16 (checked by the writer). Every random draw comes
from numpy's PCG64 seeded by the case name, so the files are reproducible.
"""

import zlib

import numpy as np
import torch

INF = np.float32(np.inf)


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def to_bf16_values(t):
    """RNE to bf16, back to fp32 (the values a BF16 tensor holds)."""
    return t.to(torch.bfloat16).to(torch.float32)


def normal(name, shape, std=0.02, bf16=True):
    t = torch.from_numpy(rng_for(name).standard_normal(shape).astype(np.float32) * np.float32(std))
    return to_bf16_values(t) if bf16 else t


def f32_not_bf16(name, shape, std=0.02):
    """Random fp32 values none of which is exactly representable in bf16."""
    t = normal(name, shape, std, bf16=False)
    bits = t.view(torch.int32)
    bits |= (bits & 0xFFFF == 0).int()  # force a nonzero low half
    return bits.view(torch.float32)


def ulp(v, direction):
    return float(np.nextafter(np.float32(v), np.float32(direction * INF)))


def bf16_ulp(v, direction):
    b = torch.tensor([v], dtype=torch.bfloat16).view(torch.int16)
    b = b + (1 if (direction > 0) == (v >= 0) else -1)
    return b.view(torch.bfloat16).float().item()


def block(name, size, top, specials=(), bf16=True, filler=0.9):
    """One block of `size` values: specials, then `top` (the block's max magnitude), then random
    filler strictly below |top| (so `top` stays the amax)."""
    vals = list(specials) + [top]
    assert len(vals) <= size
    if bf16:
        vals = to_bf16_values(torch.tensor(vals, dtype=torch.float32)).tolist()
    rest = size - len(vals)
    fill = torch.from_numpy(rng_for(name).uniform(-1, 1, rest).astype(np.float32))
    fill = fill * np.float32(abs(top) * filler)
    if bf16:
        fill = to_bf16_values(fill)
    return [float(v) for v in vals] + fill.tolist()


def rows_of_blocks(name, size, rows, bf16=True):
    """rows: list of rows, each a list of (top, specials) -> fp32 tensor [len(rows), blocks*size]."""
    out = []
    for r, row in enumerate(rows):
        vals = []
        for b, (top, specials) in enumerate(row):
            vals += block(f"{name}/{r}/{b}", size, top, specials, bf16)
        out.append(vals)
    return torch.tensor(out, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Shared structure cases


def passthrough_cases():
    """Tensors no format takes: 1-D. Expected output is the input, unchanged."""
    return [("norm_1d", "BF16", normal("norm_1d", (64,), std=1.0))]


def identity_pair(prefix, shape):
    """A bf16 tensor and its exact fp32 upcast: every format must give identical bytes."""
    t = normal(prefix, shape)
    return [(f"{prefix}_bf16", "BF16", t), (f"{prefix}_bf16_as_f32", "F32", t.clone())]


# ---------------------------------------------------------------------------------------------
# FP8 block-128 (128x128 tiles)


def _tile_row(name, tops, bf16=True, cols=128, specials=None):
    """A [1, 128*len(tops)] tensor: column tile j holds amax tops[j] (plus specials[j])."""
    specials = specials or [()] * len(tops)
    return rows_of_blocks(name, cols, [[(t, s) for t, s in zip(tops, specials)]], bf16)


def fp8_block128_cases():
    cases = []
    cases.append(("rand_bf16", "BF16", normal("fp8/rand_bf16", (130, 260))))
    cases += identity_pair("rand_small", (40, 136))
    cases.append(("rand_f32", "F32", f32_not_bf16("fp8/rand_f32", (40, 136))))
    # 2624 rows (fused q_a + kv_a shape): scale rows = ceil(2624/128) = 21, last tile partial.
    cases.append(("rows_2624", "BF16", normal("fp8/rows_2624", (2624, 8))))
    # A full 128x128 zero tile next to partial nonzero tiles; and a tensor that is all zero.
    z = normal("fp8/zero_tile", (130, 136))
    z[:128, :128] = 0
    cases.append(("zero_tile", "BF16", z))
    cases.append(("all_zero_partial", "BF16", torch.zeros(3, 5)))
    # -0.0 elements (-> 0x80) inside a nonzero tile.
    nz = normal("fp8/neg_zero", (4, 20), std=1.0)
    nz[0, :6] = -0.0
    nz[3, 7] = -0.0
    cases.append(("neg_zero", "BF16", nz))
    # Tile amax exactly 448*2^k: s = 2^k, the top element encodes to 0x7E.
    ks = [0, -3, 5, -20, 40]
    cases.append(("sat_exact", "BF16", _tile_row("fp8/sat_exact", [448.0 * 2.0 ** k for k in ks])))
    cases.append(("sat_ulp_above_f32", "F32",
                  _tile_row("fp8/ulp_above", [ulp(448.0 * 2.0 ** k, +1) for k in ks], bf16=False)))
    cases.append(("sat_ulp_below_f32", "F32",
                  _tile_row("fp8/ulp_below", [ulp(448.0 * 2.0 ** k, -1) for k in ks], bf16=False)))
    cases.append(("sat_ulp_bf16", "BF16", _tile_row(
        "fp8/ulp_bf16", [bf16_ulp(448.0, +1), bf16_ulp(448.0, -1),
                         bf16_ulp(448.0 * 2.0 ** -7, +1), bf16_ulp(448.0 * 2.0 ** -7, -1)])))
    # E4M3 ties with s = 1 (amax 448) and s = 2^-3 (amax 56): RNE to the even code.
    ties = [1.0625, 1.1875, 248.0, -1.0625, -248.0, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -9 * 1.5,
            2.0 ** -10 * (1 + 2.0 ** -7), 13.0, 15.0, 0.0]
    cases.append(("e4m3_ties", "BF16", _tile_row(
        "fp8/ties", [448.0, 56.0], specials=[ties, [v * 2.0 ** -3 for v in ties]])))
    # Subnormal outputs with fp32 inputs one ulp off the tie.
    sub = [2.0 ** -10, ulp(2.0 ** -10, +1), ulp(2.0 ** -10, -1), ulp(1.5 * 2.0 ** -9, +1),
           ulp(1.5 * 2.0 ** -9, -1), ulp(1.0625, +1), ulp(1.0625, -1)]
    cases.append(("subnormal_out_f32", "F32",
                  _tile_row("fp8/sub_f32", [448.0], bf16=False, specials=[sub])))
    # amax below 1e-4: the clamp binds, s = fl(1e-4)/448.
    cases.append(("amax_below_1e-4", "BF16", _tile_row("fp8/clamp", [5e-5, 1e-4, 2e-4])))
    cases.append(("amax_near_1e-4_f32", "F32", _tile_row(
        "fp8/clamp_f32", [ulp(1e-4, -1), float(np.float32(1e-4)), ulp(1e-4, +1)], bf16=False)))
    # UE8M0 canonicalization (§4.4): a tile whose max|q| after the first pass is 224 (amax 228
    # or 232 at s = 1) halves its scale; 233 (-> 240) does not; at s = 2^-22 (amax < 1e-4,
    # clamp binds) nothing changes; at s = 2^-21 it halves to 2^-22.
    cases.append(("ue8m0_canonical", "BF16", _tile_row(
        "fp8/canon", [228.0, 232.0, 233.0, 224.0, 228.0 * 2.0 ** -22, 228.0 * 2.0 ** -21,
                      228.0 * 2.0 ** -30, 228.0 * 2.0 ** 10])))
    cases += passthrough_cases()
    return cases


# ---------------------------------------------------------------------------------------------
# 1-D block formats (MXFP8: 32 / E4M3; MXFP4: 32 / E2M1; NVFP4: 16 / E2M1)


def mxfp8_cases():
    B = 32
    cases = []
    cases.append(("rand_bf16", "BF16", normal("mx8/rand_bf16", (64, 256))))
    cases += identity_pair("rand_small", (8, 64))
    cases.append(("rand_f32", "F32", f32_not_bf16("mx8/rand_f32", (16, 128))))
    z = normal("mx8/zero_block", (3, 64))
    z[0, :32] = 0
    z[2, :] = 0
    cases.append(("zero_block", "BF16", z))
    nz = normal("mx8/neg_zero", (2, 64), std=1.0)
    nz[0, :5] = -0.0
    nz[1, 32:64] = -0.0  # a block of only -0.0: scale 0, data 0x80
    cases.append(("neg_zero", "BF16", nz))
    ks = [0, -3, 5, -20, 100, -110]
    cases.append(("sat_exact", "BF16", rows_of_blocks(
        "mx8/sat_exact", B, [[(448.0 * 2.0 ** k, ()) for k in ks],
                             [(-448.0 * 2.0 ** k, ()) for k in ks]])))
    cases.append(("sat_ulp_below_f32", "F32", rows_of_blocks(
        "mx8/ulp_below", B, [[(ulp(448.0 * 2.0 ** k, -1), ()) for k in ks]], bf16=False)))
    # torchao's float log2 rounds these down (see oracles.TORCHAO_LOG2_CORNER_CASES).
    cases.append(("sat_ulp_above_f32", "F32", rows_of_blocks(
        "mx8/ulp_above", B, [[(ulp(448.0 * 2.0 ** k, +1), ()) for k in ks]], bf16=False)))
    cases.append(("sat_ulp_bf16", "BF16", rows_of_blocks(
        "mx8/ulp_bf16", B, [[(bf16_ulp(448.0 * 2.0 ** k, d), ()) for k in ks[:4] for d in (1, -1)]])))
    ties = [1.0625, 1.1875, 248.0, -1.0625, -248.0, 2.0 ** -10, 3 * 2.0 ** -10, 1.5 * 2.0 ** -9,
            2.0 ** -10 * (1 + 2.0 ** -7), 13.0, 15.0, -15.0, 0.0, 9.5, 10.5]
    cases.append(("e4m3_ties", "BF16", rows_of_blocks(
        "mx8/ties", B, [[(448.0, ties), (14.0, [v * 2.0 ** -5 for v in ties]),
                         (448.0 * 2.0 ** 20, [v * 2.0 ** 20 for v in ties])]])))
    sub = [2.0 ** -10, ulp(2.0 ** -10, +1), ulp(2.0 ** -10, -1), ulp(1.5 * 2.0 ** -9, +1),
           ulp(1.5 * 2.0 ** -9, -1), ulp(1.0625, +1), ulp(1.0625, -1)]
    cases.append(("subnormal_out_f32", "F32",
                  rows_of_blocks("mx8/sub", B, [[(448.0, sub)]], bf16=False)))
    # Subnormal scales: amax/448 below 2^-126. Byte 0 (multiplier 1, data all 0) when
    # amax/448 <= 2^-127; byte 1 (multiplier 2^126) just above; a normal 2^-126 for contrast.
    cases.append(("subnormal_scale", "BF16", rows_of_blocks(
        "mx8/sub_scale", B, [[(2.0 ** -120, ()), (448.0 * 2.0 ** -127, ()),
                              (672.0 * 2.0 ** -127, ()), (448.0 * 2.0 ** -126, ()),
                              (2.0 ** -133, ()), (1.0, [2.0 ** -120, -(2.0 ** -126)])]])))
    # amax < 1e-4 (TE has no amax floor, unlike DeepGEMM's 1e-4 clamp).
    cases.append(("tiny_amax", "BF16", rows_of_blocks(
        "mx8/tiny", B, [[(5e-5, ()), (1e-6, ()), (1e-20, ())]])))
    cases.append(("large_amax", "BF16", rows_of_blocks(
        "mx8/large", B, [[(3.3e38, ()), (-1e38, ()), (6e37, ())]])))
    cases.append(("k_not_multiple_of_32", "BF16", normal("mx8/k48", (4, 48))))
    cases += passthrough_cases()
    return cases


def mxfp4_cases():
    B = 32
    cases = []
    cases.append(("rand_bf16", "BF16", normal("mx4/rand_bf16", (64, 256))))
    cases += identity_pair("rand_small", (8, 64))
    cases.append(("rand_f32", "F32", f32_not_bf16("mx4/rand_f32", (16, 128))))
    z = normal("mx4/zero_block", (3, 64))
    z[0, :32] = 0
    z[2, :] = 0
    cases.append(("zero_block", "BF16", z))
    nz = normal("mx4/neg_zero", (2, 64), std=1.0)
    nz[0, :5] = -0.0
    nz[1, 40] = -0.0
    nz[1, 32:64] = -0.0  # a block of only -0.0: scale 0, codes 8 (sign bit kept)
    cases.append(("neg_zero", "BF16", nz))
    ks = [0, -3, 5, -20, 100, -110]
    cases.append(("sat_exact", "BF16", rows_of_blocks(
        "mx4/sat_exact", B, [[(6.0 * 2.0 ** k, ()) for k in ks],
                             [(-6.0 * 2.0 ** k, ()) for k in ks]])))
    cases.append(("sat_ulp_f32", "F32", rows_of_blocks(
        "mx4/ulp", B, [[(ulp(6.0 * 2.0 ** k, d), ()) for k in ks] for d in (1, -1)], bf16=False)))
    cases.append(("sat_ulp_bf16", "BF16", rows_of_blocks(
        "mx4/ulp_bf16", B, [[(bf16_ulp(6.0 * 2.0 ** k, d), ()) for k in ks[:4] for d in (1, -1)]])))
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0,
            0.5, 0.125, 5.5, -5.5]
    cases.append(("e2m1_ties", "BF16", rows_of_blocks(
        "mx4/ties", B, [[(6.0, ties), (6.0 * 2.0 ** -7, [v * 2.0 ** -7 for v in ties]),
                         (4.0, [v * 0.5 for v in ties])]])))
    near = [ulp(v, d) for v in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0) for d in (1, -1)]
    cases.append(("e2m1_near_ties_f32", "F32",
                  rows_of_blocks("mx4/near", B, [[(6.0, near)]], bf16=False)))
    # Subnormal scales: amax/6 below 2^-126 goes to byte 1 (triton rounds any nonzero up).
    cases.append(("subnormal_scale", "BF16", rows_of_blocks(
        "mx4/sub_scale", B, [[(2.0 ** -126, ()), (2.0 ** -130, ()), (6.0 * 2.0 ** -127, ()),
                              (6.0 * 2.0 ** -126, ()), (2.0 ** -133, ())]])))
    cases.append(("large_amax", "BF16", rows_of_blocks(
        "mx4/large", B, [[(3.3e38, ()), (-1e38, ())]])))
    cases.append(("k_not_multiple_of_32", "BF16", normal("mx4/k48", (4, 48))))
    cases += passthrough_cases()
    return cases


def nvfp4_cases():
    """Shared by nvfp4 (ModelOpt) and nvfp4_te. Global amax A = max|x| over the tensor."""
    B = 16
    cases = []
    # FORMATS.md §12.2 golden block.
    golden = [[0.0, -0.0, 0.25, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0, 0.1, -0.1, 3.0,
               -4.0, 2688.0] + [0.0] * 15]
    cases.append(("golden_12_2", "F32", torch.tensor(golden, dtype=torch.float32)))
    cases.append(("rand_bf16", "BF16", normal("nv4/rand_bf16", (64, 128))))
    cases += identity_pair("rand_small", (8, 64))
    cases.append(("rand_f32", "F32", f32_not_bf16("nv4/rand_f32", (16, 64))))
    z = normal("nv4/zero_block", (3, 48))
    z[0, :16] = 0
    z[2, 16:32] = 0
    cases.append(("zero_block", "BF16", z))
    nz = normal("nv4/neg_zero", (2, 32), std=1.0)
    nz[0, :5] = -0.0
    nz[1, 16:32] = -0.0
    cases.append(("neg_zero", "BF16", nz))
    # Ties at a pow2 global scale: A = 2688*2^-4, a block with amax 6*2^-4 gets S = 1.0 exactly.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.75, -5.0, 0.125]
    cases.append(("e2m1_ties", "BF16", rows_of_blocks(
        "nv4/ties", B, [[(2688.0 * 2.0 ** -4, ()), (6.0 * 2.0 ** -4, [v * 2.0 ** -4 for v in ties]),
                         (3.0 * 2.0 ** -4, [v * 2.0 ** -5 for v in ties])]])))
    # Block scale saturation: every block's amax equal to A -> S = 448 (0x7E), top code 7.
    cases.append(("scale_at_448", "BF16", rows_of_blocks(
        "nv4/sat", B, [[(1.5, ()), (-1.5, ()), (1.5, [-1.5])]])))
    # Block scale in the E4M3 subnormal range (b/A * 448 < 2^-6) and near its bottom.
    cases.append(("scale_subnormal", "BF16", rows_of_blocks(
        "nv4/sub", B, [[(1.0, ()), (1e-5, ()), (4e-6, ()), (2.4e-6, ()), (3e-5, ())]])))
    # Block scale underflow (b < ~2.2e-6 * A): ModelOpt's scale byte is 0 and its codes 7/F.
    cases.append(("scale_underflow", "BF16", rows_of_blocks(
        "nv4/underflow", B, [[(1.0, ()), (1e-7, [0.0, -1e-8]), (2.0 ** -20, [-(2.0 ** -21)])]])))
    cases.append(("k_not_multiple_of_16", "BF16", normal("nv4/k40", (4, 40))))
    cases += passthrough_cases()
    return cases


def nvfp4_te_cases():
    # An all-zero tensor: A = 0. TE's kernel sets S_enc = 1, so weight_scale_2 = 1.0, scales 0,
    # codes 0. (ModelOpt's arithmetic gives 0/0 there; FORMATS.md does not define it: not in
    # the nvfp4 set.)
    return nvfp4_cases() + [("all_zero_tensor", "BF16", torch.zeros(2, 32))]


# ---------------------------------------------------------------------------------------------
# compressed-tensors formats: BF16 models (F32 cases only as exact upcasts of BF16 values)


def ct_fp8_channel_cases():
    """Per output channel: s = bf16(amax/448) per row; the whole row is one block (any K)."""
    cases = [("rand_bf16", "BF16", normal("ctfc/rand", (64, 96)))]
    cases += identity_pair("rand_small", (8, 40))
    t = normal("ctfc/specials", (6, 32), std=1.0)
    t[0] = 0.0                                    # zero row: scale = bf16 eps (2^-7)
    t[1, :4] = -0.0                               # -0.0 + zero point -> +0.0 (0x00)
    t[2] = to_bf16_values(t[2] * 1e-36)           # bf16 subnormal-range row
    t[3, 0] = 448.0 * 2.0 ** 10                   # amax exactly 448*2^k: s a power of two
    t[4, 0] = 3e38                                # near bf16 max
    t[5, :8] = torch.tensor([1.0625, 1.1875, 248.0, -248.0, 464.0 / 512, 0.5, -0.5, 2.0 ** -9])
    cases.append(("specials", "BF16", to_bf16_values(t)))
    cases.append(("odd_k", "BF16", normal("ctfc/odd", (3, 7), std=1.0)))
    cases += passthrough_cases()
    return cases


def ct_fp8_tensor_cases():
    """One amax over the tensor: s = bf16(amax/448)."""
    cases = [("rand_bf16", "BF16", normal("ctft/rand", (48, 80)))]
    cases += identity_pair("rand_small", (8, 40))
    cases.append(("all_zero_tensor", "BF16", torch.zeros(4, 16)))
    o = normal("ctft/outlier", (16, 32))
    o[3, 7] = -100.0                              # one outlier: most values become E4M3 subnormals
    o[5, :3] = -0.0
    cases.append(("outlier", "BF16", o))
    cases.append(("tiny", "BF16", to_bf16_values(normal("ctft/tiny", (4, 32), std=1.0) * 1e-30)))
    cases += passthrough_cases()
    return cases


def ct_nvfp4_cases():
    """G = bf16(2688/A) with A = max|x|; per 16-block S = E4M3(G * bf16(b/6)), 0 -> 0.125."""
    B = 16
    cases = [("rand_bf16", "BF16", normal("ctnv/rand", (64, 128)))]
    cases += identity_pair("rand_small", (8, 64))
    z = normal("ctnv/zero_block", (3, 48))
    z[0, :16] = 0
    z[2, 16:32] = 0
    cases.append(("zero_block", "BF16", z))
    nz = normal("ctnv/neg_zero", (2, 32), std=1.0)
    nz[0, :5] = -0.0
    nz[1, 16:32] = -0.0
    nz[1, 3] = -1e-4                              # a negative value that rounds to zero
    cases.append(("neg_zero", "BF16", to_bf16_values(nz)))
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.75, -5.0, 0.125]
    cases.append(("e2m1_ties", "BF16", rows_of_blocks(
        "ctnv/ties", B, [[(2688.0 * 2.0 ** -4, ()), (6.0 * 2.0 ** -4, [v * 2.0 ** -4 for v in ties]),
                          (3.0 * 2.0 ** -4, [v * 2.0 ** -5 for v in ties])]])))
    cases.append(("scale_at_448", "BF16", rows_of_blocks(
        "ctnv/sat", B, [[(1.5, ()), (-1.5, ()), (1.5, [-1.5])]])))
    cases.append(("scale_subnormal", "BF16", rows_of_blocks(
        "ctnv/sub", B, [[(1.0, ()), (1e-5, ()), (4e-6, ()), (2.4e-6, ()), (3e-5, ())]])))
    # Block scales that round to E4M3 zero: replaced by 0.125 (calculate_qparams' eps).
    cases.append(("scale_underflow", "BF16", rows_of_blocks(
        "ctnv/underflow", B, [[(1.0, ()), (1e-7, [0.0, -1e-8]), (2.0 ** -20, [-(2.0 ** -21)])]])))
    cases.append(("all_zero_tensor", "BF16", torch.zeros(2, 32)))  # A = 0: G = 1
    cases.append(("tiny_tensor", "BF16", to_bf16_values(normal("ctnv/tiny", (2, 32), std=1.0) * 1e-37)))
    cases.append(("k_not_multiple_of_16", "BF16", normal("ctnv/k40", (4, 40))))
    cases += passthrough_cases()
    return cases


def ct_w4a16_cases():
    """Per 128-group: s = bf16(b/7.5); q = round_half_even(clamp(bf16(x/s), -8, 7))."""
    cases = [("rand_bf16", "BF16", normal("ctw4/rand", (32, 256)))]
    cases += identity_pair("rand_small", (4, 128))
    z = normal("ctw4/zero_group", (3, 256))
    z[1, 128:] = 0.0                              # zero group: scale = bf16 eps
    z[2, :5] = -0.0
    cases.append(("zero_group", "BF16", z))
    # b = 7.5 -> s = 1: halves are exact ties (half to even), +-7.5 clamp to 7 / round to -8.
    halves = [0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -7.5, 6.5, -6.5, 4.5, 5.5]
    t = torch.from_numpy(rng_for("ctw4/ties").uniform(-7, 7, (2, 128)).astype("float32"))
    t[0, 0] = 7.5
    t[0, 1:1 + len(halves)] = torch.tensor(halves)
    t[1, 0] = -7.5
    cases.append(("ties", "BF16", to_bf16_values(t)))
    cases.append(("k_not_multiple_of_128", "BF16", normal("ctw4/k64", (4, 64))))
    cases += passthrough_cases()
    return cases


def round_to_bf16_cases(k):
    """For `--fp32-input round_to_bf16`: fp32 masters (incl. exact bf16 rounding ties)."""
    t = f32_not_bf16(f"r2b/{k}", (8, k), std=1.0)
    bits = t.view(torch.int32)
    bits[0, :8] = (bits[0, :8] & ~0xFFFF) | 0x8000  # exactly halfway between two bf16 values
    return [("f32_master", "F32", bits.view(torch.float32)),
            ("bf16_input", "BF16", normal(f"r2b/bf16/{k}", (4, k)))]


def reject_cases(k=64):
    """Non-finite inputs: default policy rejects, naming the tensor (and first bad index)."""
    ok = normal("reject/ok", (2, k))
    nan = normal("reject/nan", (2, k))
    nan[1, 3] = float("nan")
    inf = normal("reject/inf", (2, k), bf16=False)
    inf[0, 5] = float("-inf")
    return {
        "": ([("a_ok", "BF16", ok), ("nan_at_1_3", "BF16", nan)], "in.nan_at_1_3"),
        "_inf": ([("neg_inf_at_0_5", "F32", inf)], "in.neg_inf_at_0_5"),
    }
