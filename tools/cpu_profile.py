#!/usr/bin/env python3
"""Prints where a process's CPU time went, from a REFIT_CPU_PROFILE file (src/common/cpu_profile.h).

    tools/cpu_profile.py PROFILE [--build build] [--thread NAME] [--top 25] [--under FUNC] [--exclude FUNC]

Each sample is one thread's stack at a tick of the process's CPU time. The report: samples per
thread, then the functions by self time (the sampled instruction's function) and by inclusive time
(anywhere on the stack), for all threads or those whose name contains --thread; --under FUNC keeps
the samples whose stack holds a function containing FUNC (e.g. Session::Convert) and reports the
functions below it.

Addresses are symbolized with addr2line against the binaries of --build (a profile taken on another
machine names its own paths: a module is looked up by its file name in the build tree, then at its
own path). A system library found at its own path without debug information (the GPU machine's
libc, the CUDA driver; run the tool there) is named by its exported functions: [libc.so.6:NAME],
or [libc.so.6:after NAME] inside a function it does not export. Others are named by module only.
"""
import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path


def parse(path):
    samples, threads, maps = [], {}, []
    section = "samples"
    with open(path) as f:
        if not f.readline().startswith("refit-cpu-profile"):
            raise SystemExit(f"{path}: not a REFIT_CPU_PROFILE file")
        for line in f:
            if section == "maps":
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and "x" in parts[1]:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    maps.append((lo, hi, int(parts[2], 16), parts[5].strip()))
            elif line.startswith("s "):
                parts = line.split()
                tid = int(parts[1])
                if parts[2] != "-":
                    threads.setdefault(tid, parts[2])
                samples.append((tid, [int(x, 16) for x in parts[3:]]))
            elif line.startswith("t "):
                parts = line.rstrip("\n").split(" ", 2)
                threads.setdefault(int(parts[1]), parts[2] if len(parts) > 2 else "")
            elif line.startswith("maps"):
                section = "maps"
            elif line.startswith("samples ") or line.startswith("clock "):
                print(line.strip())
    return samples, threads, maps


def local_module(device_path, build):
    name = os.path.basename(device_path)
    hits = [h for h in Path(build).rglob(name) if h.is_file()]
    if hits:
        return str(hits[0])
    if ".dev/" in device_path:  # a library carried from this machine's distribution
        for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"):
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
    return device_path if os.path.exists(device_path) and device_path.startswith(str(build)) else None


def exported_symbols(path):
    """A lookup from a file offset of `path` (a system library without debug information, such as
    the GPU machine's libc or CUDA driver) to the exported function it falls in, by the library's
    dynamic symbol table: "[libc.so.6:memcpy]". An offset past the function's size (a function the
    library does not export) gets "[lib:after NAME]", which only bounds where it is. None when
    the tools cannot read the library."""
    try:
        segs = []  # (file offset, virtual address, file size) of each LOAD segment
        for line in subprocess.run(["readelf", "-lW", path], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            f = line.split()
            if f and f[0] == "LOAD":
                segs.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
        syms = []
        for line in subprocess.run(["nm", "-D", "-S", "--defined-only", path], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            f = line.split()
            if len(f) == 4 and f[2] in "TtWi":
                syms.append((int(f[0], 16), int(f[1], 16), f[3].split("@")[0]))
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None
    if not syms:
        return None
    syms.sort()
    starts = [a for a, _, _ in syms]
    base = os.path.basename(path)
    import bisect

    def lookup(off):
        vaddr = next((v + off - o for o, v, n in segs if o <= off < o + n), off)
        i = bisect.bisect_right(starts, vaddr) - 1
        if i < 0:
            return f"[{base}]"
        a, size, name = syms[i]
        return f"[{base}:{name}]" if vaddr < a + max(size, 1) else f"[{base}:after {name}]"

    return lookup


def symbolize(samples, maps, build):
    """{pc: function name} for every pc of the samples."""
    maps.sort()
    starts = [m[0] for m in maps]
    import bisect
    by_module = collections.defaultdict(set)
    where = {}
    for _, stack in samples:
        for pc in stack:
            if pc in where:
                continue
            i = bisect.bisect_right(starts, pc) - 1
            if i >= 0 and maps[i][0] <= pc < maps[i][1]:
                lo, _, off, mod = maps[i]
                # A return address points after the call: look up the call itself (pc - 1), except
                # for the sampled instruction, which the tool cannot tell apart here (one byte off
                # stays in the same function).
                where[pc] = (mod, pc - 1 - lo + off)
                by_module[mod].add(pc - 1 - lo + off)
            else:
                where[pc] = (None, pc)
    names = {}
    for mod, offs in by_module.items():
        local = local_module(mod, build)
        if local is None:
            exported = exported_symbols(mod) if os.path.exists(mod) else None
            for o in offs:
                names[(mod, o)] = exported(o) if exported else f"[{os.path.basename(mod) or mod}]"
            continue
        offs = sorted(offs)
        out = subprocess.run(["addr2line", "-f", "-C", "-e", local] + [hex(o) for o in offs], capture_output=True,
                             text=True).stdout.splitlines()
        for k, o in enumerate(offs):
            fn = out[2 * k] if 2 * k < len(out) else "??"
            names[(mod, o)] = fn if fn != "??" else f"[{os.path.basename(mod)}+{o:#x}]"
    return {pc: (names.get(w, f"[{w[1]:#x}]") if w[0] is not None else f"[{pc:#x}]") for pc, w in where.items()}


def short(name, width=110):
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--build", default="build")
    ap.add_argument("--thread", default="", help="only threads whose name contains this")
    ap.add_argument("--under", default="", help="only samples with this function on the stack; below it")
    ap.add_argument("--exclude", action="append", default=[],
                    help="drop samples with this function on the stack (e.g. a first refit's allocations); repeatable")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    samples, threads, maps = parse(a.profile)
    names = symbolize(samples, maps, Path(a.build).resolve())
    per_name = collections.Counter(threads.get(t, "?") for t, _ in samples)
    per_thread = collections.Counter(f"{threads.get(t, '?')} [{t}]" for t, _ in samples)
    print(f"{len(samples)} samples; per thread name:")
    for t, n in per_name.most_common():
        print(f"  {n:7d} {100.0 * n / max(len(samples), 1):5.1f}%  {t}")
    print(f"the {min(a.top, len(per_thread))} busiest threads of {len(per_thread)}:")
    for t, n in per_thread.most_common(a.top):
        print(f"  {n:7d} {100.0 * n / max(len(samples), 1):5.1f}%  {t}")
    chosen = [(t, s) for t, s in samples if a.thread in threads.get(t, f"tid {t}")]
    if a.under:
        kept = []
        for t, s in chosen:
            fns = [names[pc] for pc in s]
            for k, fn in enumerate(fns):
                if a.under in fn:
                    kept.append((t, s[:k + 1]))
                    break
        chosen = kept
    if a.exclude:
        chosen = [(t, s) for t, s in chosen if not any(x in names[pc] for pc in s for x in a.exclude)]
    total = max(len(chosen), 1)
    self_c, incl_c, own_c = collections.Counter(), collections.Counter(), collections.Counter()
    for _, s in chosen:
        if not s:
            continue
        self_c[names[s[0]]] += 1
        # The innermost of refitd's own functions: where a wait in a library (libc, the driver) was
        # entered from.
        own_c[next((names[pc] for pc in s if names[pc].startswith("refit::")), names[s[-1]])] += 1
        for fn in {names[pc] for pc in s}:
            incl_c[fn] += 1
    what = (f"threads '{a.thread}'" if a.thread else "all threads") + (f", under '{a.under}'" if a.under else "")
    print(f"\n{len(chosen)} samples of {what}; by self time:")
    for fn, n in self_c.most_common(a.top):
        print(f"  {n:7d} {100.0 * n / total:5.1f}%  {short(fn)}")
    print("\nby the innermost refit:: function (where time in libraries was entered from):")
    for fn, n in own_c.most_common(a.top):
        print(f"  {n:7d} {100.0 * n / total:5.1f}%  {short(fn)}")
    print("\nby inclusive time:")
    for fn, n in incl_c.most_common(a.top):
        print(f"  {n:7d} {100.0 * n / total:5.1f}%  {short(fn)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
