"""Minimal safetensors reader/writer (Python standard library only).

Used by make_goldens.py to write the golden files deterministically (sorted names, fixed
metadata, header padded to 8 bytes) and by compare.py to read them back without numpy/torch.
A tensor is a (dtype, shape, raw little-endian bytes) triple; dtype is the safetensors string
(BF16, F32, F8_E4M3, U8, ...).
"""

import json
import struct

DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def dumps(tensors, metadata=None):
    """tensors: {name: (dtype, shape, bytes)} -> safetensors file bytes."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        expected = numel(shape) * DTYPE_SIZES[dtype]
        if len(data) != expected:
            raise ValueError(f"{name}: {len(data)} bytes, {dtype}{list(shape)} needs {expected}")
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(bytes(data))
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(dumps(tensors, metadata))


def loads(blob, where="<bytes>"):
    """safetensors bytes -> ({name: (dtype, shape, bytes)}, metadata dict)."""
    if len(blob) < 8:
        raise ValueError(f"{where}: shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        raise ValueError(f"{where}: header length {hlen} runs past the end of the file")
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    base = 8 + hlen
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype, shape = info["dtype"], tuple(info["shape"])
        if dtype in DTYPE_SIZES and end - begin != numel(shape) * DTYPE_SIZES[dtype]:
            raise ValueError(f"{where}: tensor {name}: {end - begin} bytes for {dtype}{list(shape)}")
        if base + end > len(blob):
            raise ValueError(f"{where}: tensor {name} runs past the end of the file")
        tensors[name] = (dtype, shape, blob[base + begin:base + end])
    return tensors, metadata


def read(path):
    with open(path, "rb") as f:
        return loads(f.read(), path)
