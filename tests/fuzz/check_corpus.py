#!/usr/bin/env python3
"""Fails when a seed corpus under tests/fuzz/corpus/ holds a copy of a shipped file: a model spec of
deploy/models/, a daemon config of deploy/systemd/ or a golden set of tests/golden/data/. Those
files seed the fuzz runs where they live (tests/fuzz/CMakeLists.txt passes their directories to
each fuzz_<target>_regression), so a copy could only drift from them, as copies did when the
shipped specs changed. A copy is a corpus file with a shipped file's name, its bytes, or its
opening comment line (a stale copy keeps its header). Standard library only.
Usage: tests/fuzz/check_corpus.py [REPO_ROOT]"""
import sys
from pathlib import Path

# Corpus target -> the shipped files that seed it in place (globs relative to the repository root).
SHIPPED = {
    "model_spec": ["deploy/models/*.yaml"],
    "config": ["deploy/systemd/refitd.yaml", "deploy/systemd/*/refitd.yaml"],
    "safetensors": ["tests/golden/data/*.safetensors"],
}


def first_comment_line(data: bytes):
    line = data.split(b"\n", 1)[0].strip()
    return line if line.startswith(b"#") and len(line) > 1 else None


def copies(root: Path):
    """(corpus file, shipped file it copies, how) for every copy found."""
    found = []
    for target, globs in SHIPPED.items():
        shipped = sorted({p for g in globs for p in root.glob(g) if p.is_file()})
        by_name = {p.name: p for p in shipped}
        by_bytes = {p.read_bytes(): p for p in shipped}
        by_header = {}
        for p in shipped:
            header = first_comment_line(p.read_bytes())
            if header is not None:
                by_header.setdefault(header, p)
        corpus = root / "tests/fuzz/corpus" / target
        for f in sorted(corpus.rglob("*")) if corpus.is_dir() else []:
            if not f.is_file():
                continue
            data = f.read_bytes()
            header = first_comment_line(data)
            if f.name in by_name:
                found.append((f, by_name[f.name], "same name"))
            elif data in by_bytes:
                found.append((f, by_bytes[data], "same bytes"))
            elif header is not None and header in by_header:
                found.append((f, by_header[header], "same opening comment"))
    return found


def main():
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    found = copies(root)
    for f, shipped, how in found:
        stale = "" if f.read_bytes() == shipped.read_bytes() else ", and it differs from it"
        print(f"{f.relative_to(root)}: a copy of {shipped.relative_to(root)} ({how}{stale})")
    if found:
        print(f"{len(found)} corpus file(s) copy shipped files; delete them: the shipped files seed the fuzz "
              "runs from where they live (tests/fuzz/CMakeLists.txt)")
        return 1
    print("no corpus file copies a shipped spec, config or golden set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
