"""Safetensors dtype names, torch dtypes and their sizes: the one place that knows them."""

from __future__ import annotations

import torch

_BY_NAME: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
for _name, _attr in (
    ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"),
    ("F8_E8M0", "float8_e8m0fnu"),
    ("U16", "uint16"),
    ("U32", "uint32"),
    ("U64", "uint64"),
):
    if hasattr(torch, _attr):  # guards for older torch builds
        _BY_NAME[_name] = getattr(torch, _attr)

_BY_DTYPE = {v: k for k, v in _BY_NAME.items()}

ITEMSIZE: dict[str, int] = {
    name: torch.empty((), dtype=dt, device="cpu").element_size() for name, dt in _BY_NAME.items()
}


def known(name: str) -> bool:
    return name in _BY_NAME


def to_torch(name: str) -> torch.dtype:
    return _BY_NAME[name]


def to_name(dtype: torch.dtype) -> str:
    return _BY_DTYPE[dtype]


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (on the CPU; NaN payloads compare as bytes)."""
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def nbytes(name: str, shape: tuple[int, ...] | list[int]) -> int:
    n = ITEMSIZE[name]
    for d in shape:
        n *= d
    return n
