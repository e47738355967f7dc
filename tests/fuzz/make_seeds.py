#!/usr/bin/env python3
"""Writes the generated seeds of the corpora under tests/fuzz/corpus/ (kept in the repository; rerun
after a schema or format change): valid inputs plus hostile ones (overflowing shapes, offsets past
the end, unknown dtypes, huge lengths, deep nesting, truncation). Seeds added by hand (a crashing
input with its fix, a spec using new layout ops) stay. The shipped specs, daemon configs and golden
sets are not copied here: they seed the fuzz runs where they live (tests/fuzz/CMakeLists.txt), and
check_corpus.py refuses a copy. Needs the `capnp` tool for the wire seeds.
Usage: tests/fuzz/make_seeds.py"""
import json
import struct
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def capnp_encode(struct_name, text):
    return subprocess.run(["capnp", "encode", "-I/usr/include", str(ROOT / "proto/refit.capnp"), struct_name],
                          input=text.encode(), capture_output=True, check=True).stdout


def wire():
    manifests = {
        "manifest_ok": '(model = "demo-llama", tensors = [(name = "model.embed_tokens.weight", dtype = "BF16", '
                       'shape = [256, 64], nbytes = 32768)])',
        "manifest_bad_dtype": '(model = "m", tensors = [(name = "w", dtype = "F128", shape = [2], nbytes = 4)])',
        "manifest_overflow": '(model = "m", tensors = [(name = "w", dtype = "F32", '
                             'shape = [4611686018427387904, 4611686018427387904], nbytes = 0)])',
        "manifest_negative": '(model = "m", tensors = [(name = "w", dtype = "BF16", shape = [-1, 8], nbytes = 16)])',
        "manifest_rank": '(model = "m", tensors = [(name = "w", dtype = "BF16", '
                         'shape = [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], nbytes = 2)])',
        "manifest_long_name": '(model = "m", tensors = [(name = "' + "x" * 5000 + '", dtype = "BF16", shape = [1], nbytes = 2)])',
        "manifest_empty": '()',
    }
    for name, text in manifests.items():
        write("wire", name, capnp_encode("Manifest", text))
    headers = {
        "header_ok": '(seq = 0, nbytes = 64, checksum = 1, tensors = [(name = "w", dtype = "BF16", shape = [4, 8], '
                     'offset = 0, nbytes = 64)])',
        "header_offset_past_end": '(seq = 3, nbytes = 64, tensors = [(name = "w", dtype = "BF16", shape = [4, 8], '
                                  'offset = 18446744073709551600, nbytes = 64)])',
        "header_zero_dim": '(seq = 1, nbytes = 0, tensors = [(name = "w", dtype = "F8_E4M3", shape = [0, 9], nbytes = 0)])',
    }
    for name, text in headers.items():
        write("wire", name, capnp_encode("BucketHeader", text))
    ok = capnp_encode("Manifest", manifests["manifest_ok"])
    write("wire", "truncated", ok[: len(ok) // 2])
    # A far pointer chain and a list pointer claiming 2^29 elements.
    write("wire", "huge_list", struct.pack("<IIQQ", 0, 2, 0x0000000100000001, (0x1FFFFFFF << 35) | 0x05))
    write("wire", "zeros", bytes(64))


def model_spec():
    bad = {
        "tabs.yaml": "model: x\n\trules: []\n",
        "unknown_key.yaml": "model: x\nrules:\n  - match: \"a.{L}.b\"\n    format: fp8_block128\n    bogus: 1\n",
        "bad_pattern.yaml": "model: x\nrules:\n  - match: \"a.{L.b\"\n    format: nvfp4\n",
        "alias_bomb.yaml": "a: &a [x, x, x, x]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nmodel: *c\n",
        "deep.yaml": "model: " + "[" * 200 + "]" * 200 + "\n",
        "huge_block.yaml": "model: x\ndefaults:\n  format: fp8_block128\n  block: [99999999999, 128]\n",
        "empty.yaml": "",
    }
    for name, text in bad.items():
        write("model_spec", name, text)


def safetensors():
    def st(header, data=b""):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data

    write("safetensors", "ok.safetensors",
          st({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}, "__metadata__": {"k": "v"}}, bytes(8)))
    write("safetensors", "offsets_past_end.safetensors",
          st({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 800]}}, bytes(8)))
    write("safetensors", "offsets_reversed.safetensors",
          st({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 0]}}, bytes(8)))
    write("safetensors", "shape_overflow.safetensors",
          st({"w": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 0]}}))
    write("safetensors", "size_mismatch.safetensors",
          st({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)))
    write("safetensors", "overlap.safetensors",
          st({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
              "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}, bytes(12)))
    write("safetensors", "header_len_huge.safetensors", struct.pack("<Q", 2**63) + b"{}")
    write("safetensors", "not_json.safetensors", struct.pack("<Q", 4) + b"{{{{")
    write("safetensors", "short.safetensors", b"\x01\x02")


def config():
    bad = {
        "bad_mode.yaml": 'socket_mode: "99x"\n',
        "bad_limits.yaml": "limits:\n  bucket_slots: 0\n  bucket_bytes: -5\n  max_message_words: 1\n",
        "access.yaml": "access:\n  allowed_uids: [0, 1000, -1]\n  token_file: /nonexistent\n",
        "wrong_types.yaml": "listen: [1, 2]\nlimits: 5\n",
        "unknown.yaml": "listen: unix:/tmp/x\nfoo: bar\n",
    }
    for name, text in bad.items():
        write("config", name, text)


if __name__ == "__main__":
    wire()
    model_spec()
    safetensors()
    config()
    print("\n".join(sorted(str(p.relative_to(HERE)) for p in CORPUS.rglob("*") if p.is_file())))
