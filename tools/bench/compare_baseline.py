"""Prints refitd's kernel GB/s next to the plain-PyTorch quantizers of gpu_baseline.py.
Usage: python3 compare_baseline.py KERNELS_JSON BASELINE_JSON"""
import json, sys

k = json.load(open(sys.argv[1]))
b = json.load(open(sys.argv[2]))
pairs = [("fp8_block128", "torch_fp8_block128_GBps(in+out)"),
         ("mxfp8", "torch_mxfp8_GBps(in+out)"),
         ("nvfp4 (amax computed, 2 pass)", "torch_nvfp4_GBps(in+out)"),
         ("nvfp4 (amax given, 1 pass)", "torch_nvfp4_GBps(in+out)")]
print(f"copy: refitd bench {k['copy_GBps']:.1f} GB/s, torch {b['d2d_copy_GBps(read+write)']:.1f} GB/s")
print(f"{'format':34s} {'refitd GB/s':>12s} {'torch GB/s':>11s} {'speedup':>8s}")
for ours, theirs in pairs:
    g = k["kernels"][ours]["GBps"]
    t = b[theirs]
    print(f"{ours:34s} {g:12.1f} {t:11.1f} {g / t:8.1f}x")
