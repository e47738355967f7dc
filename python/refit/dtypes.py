"""torch dtypes <-> the safetensors dtype names refitd speaks ("BF16", "F32", ...).

refitd converts BF16 and F32 inputs (quantizes, or casts to the engine's dtype); other dtypes
pass through unchanged where the model spec allows it. torch is imported lazily, so the rest of
the package (status, abort) works without it.
"""
from __future__ import annotations

_NAMES = [  # (torch attribute, safetensors name); attributes missing from older torch are skipped
    ("bfloat16", "BF16"), ("float16", "F16"), ("float32", "F32"), ("float64", "F64"),
    ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("float8_e8m0fnu", "F8_E8M0"),
    ("uint8", "U8"), ("int8", "I8"), ("int16", "I16"), ("int32", "I32"), ("int64", "I64"), ("bool", "BOOL"),
]


def _table():
    import torch

    return {getattr(torch, attr): name for attr, name in _NAMES if hasattr(torch, attr)}


def dtype_name(dtype) -> str:
    """The safetensors name of a torch dtype; ValueError for dtypes refitd does not carry."""
    try:
        return _table()[dtype]
    except KeyError:
        raise ValueError(f"refitd does not carry tensors of dtype {dtype}") from None


def torch_dtype(name: str):
    """The torch dtype of a safetensors name."""
    for dtype, n in _table().items():
        if n == name:
            return dtype
    raise ValueError(f"no torch dtype for '{name}' in this torch")


_ELEMENT_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U8": 1, "I8": 1,
                  "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def element_bytes(name: str) -> int:
    """Bytes per element of a safetensors dtype name (ValueError for names refitd does not carry)."""
    try:
        return _ELEMENT_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype '{name}'") from None
