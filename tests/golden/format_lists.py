#!/usr/bin/env python3
"""Checks the lists that must name formats against the format table (stdlib only).

The table (src/formats/format_table.cc) is the list of formats; `refitctl formats --json`
prints it. Some places name formats by hand because each format needs something of its own
there; this fails, naming the format and the place, when one of them lacks a format of the
table or names a format the table does not have:
  - tests/golden/data/: a golden set per quantized format (F.safetensors, F.expected.safetensors,
    the round_to_bf16 pair, reject_F*.safetensors); ctest's golden_<F> tests are made from it;
  - tests/golden/make_goldens.py: formats() (case builder and oracle) and ORACLE_NAMES;
  - tests/golden/README.md: the oracle table;
  - docs/formats.md: the format table, and an arithmetic paragraph per quantized format.

Usage: format_lists.py --refitctl PATH --root REPO_ROOT
"""

import argparse
import ast
import json
import os
import re
import subprocess
import sys


def table_formats(refitctl):
    out = subprocess.run([refitctl, "formats", "--json"], check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    return [r["name"] for r in rows], [r["name"] for r in rows if r["quantized"]]


def golden_sets(data_dir):
    """Format -> the golden files present for it."""
    sets = {}
    for name in os.listdir(data_dir):
        m = re.fullmatch(r"(?:reject_)?(.+?)(?:\.round_to_bf16)?(?:\.expected)?(?:_inf)?\.safetensors", name)
        if m is None:
            continue
        if name.startswith("reject_"):
            base = m.group(1)
            base = base[: -len("_inf")] if base.endswith("_inf") else base
            sets.setdefault(base, set()).add("reject")
        else:
            sets.setdefault(m.group(1), set()).add(name[len(m.group(1)):])
    return sets


GOLDEN_FILES = {".safetensors", ".expected.safetensors", ".round_to_bf16.safetensors",
                ".round_to_bf16.expected.safetensors", "reject"}


def dict_keys(tree, where):
    """Keys of the dict literal assigned to `where` (a module constant) or returned by it (a function)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == where for t in node.targets):
            value = node.value
        elif isinstance(node, ast.FunctionDef) and node.name == where:
            returns = [n.value for n in ast.walk(node) if isinstance(n, ast.Return)]
            value = returns[0] if returns else None
        else:
            continue
        if isinstance(value, ast.Dict):
            return [k.value for k in value.keys if isinstance(k, ast.Constant)]
    raise SystemExit(f"format_lists.py: no dict literal for {where}")


def table_column(text, header):
    """Backquoted names in the first column of the markdown table whose header row starts with `header`."""
    names, inside = [], False
    for line in text.splitlines():
        if line.startswith(header):
            inside = True
            continue
        if inside:
            if not line.startswith("|"):
                break
            names += re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])
    return names


def compare(problems, where, want, have):
    for f in sorted(set(want) - set(have)):
        problems.append(f"{where}: no entry for format {f} (it has a row in src/formats/format_table.cc)")
    for f in sorted(set(have) - set(want)):
        problems.append(f"{where}: format {f} is not in src/formats/format_table.cc")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--refitctl", required=True)
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    every, quantized = table_formats(a.refitctl)
    problems = []

    sets = golden_sets(os.path.join(a.root, "tests/golden/data"))
    compare(problems, "tests/golden/data", quantized, sets)
    for f in sorted(set(quantized) & set(sets)):
        for missing in sorted(GOLDEN_FILES - sets[f]):
            what = f"reject_{f}*.safetensors" if missing == "reject" else f + missing
            problems.append(f"tests/golden/data: format {f} has no {what}")

    with open(os.path.join(a.root, "tests/golden/make_goldens.py")) as fh:
        tree = ast.parse(fh.read())
    compare(problems, "tests/golden/make_goldens.py formats()", quantized, dict_keys(tree, "formats"))
    compare(problems, "tests/golden/make_goldens.py ORACLE_NAMES", quantized, dict_keys(tree, "ORACLE_NAMES"))

    with open(os.path.join(a.root, "tests/golden/README.md")) as fh:
        compare(problems, "tests/golden/README.md oracle table", quantized, table_column(fh.read(), "| format | oracle"))

    with open(os.path.join(a.root, "docs/formats.md")) as fh:
        doc = fh.read()
    compare(problems, "docs/formats.md format table", every, table_column(doc, "| format | producer"))
    paragraphs = re.findall(r"^\*\*([a-z0-9_]+)[ .]", doc, re.MULTILINE)
    compare(problems, "docs/formats.md arithmetic paragraphs (**name.**)", quantized, paragraphs)

    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s): lists out of step with the format table (docs/extending.md, 'Add a format')")
        return 1
    print(f"every list names the table's {len(every)} formats ({len(quantized)} quantized)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
