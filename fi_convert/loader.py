"""Load one MoE layer's kernel-ready tensors for one tensor-parallel rank from an output folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import dtypes
from . import manifest as mf
from .errors import ManifestError
from .source import INDEX_NAME
from .st_io import SourceFiles, TensorInfo, read_header


def load_moe_layer(
    out_dir: str | Path,
    layer_prefix: str,
    *,
    tp_rank: int = 0,
    device: str | torch.device = "cpu",
    scheme: str | None = None,
    backend: str | None = None,
) -> dict[str, torch.Tensor]:
    """Tensors of `layer_prefix` (e.g. "model.layers.3.mlp.experts") for rank `tp_rank`.

    Keyed by vLLM's fused-MoE parameter names and shaped as vLLM holds them after its
    load-time processing. Checks the manifest first (and, when given, that it was converted
    with `scheme` and `backend`) and reads only this rank's bytes.
    """
    root = Path(out_dir)
    m = mf.read(root)
    for key, want in (("scheme", scheme), ("backend", backend)):
        if want is not None and m[key] != str(getattr(want, "value", want)):
            raise ManifestError(
                f"{root}: converted with {key} {m[key]!r}, not {want!r}; convert again with "
                f"--{key} {getattr(want, 'value', want)}"
            )
    layers = m["layers"]
    if layer_prefix not in layers:
        some = ", ".join(list(layers)[:3])
        raise ManifestError(
            f"{root}: no MoE layer {layer_prefix!r} in the manifest (it has {len(layers)}, "
            f"e.g. {some}); pass the module prefix of the source checkpoint"
        )
    tp = m["tp_size"]
    if not 0 <= tp_rank < tp:
        raise ManifestError(
            f"{root}: tp_rank {tp_rank} out of range; this output was converted for "
            f"--tp-size {tp} (ranks 0..{tp - 1})"
        )
    weight_map = json.loads((root / INDEX_NAME).read_text())["weight_map"]
    headers: dict[str, dict[str, TensorInfo]] = {}
    files = SourceFiles()
    out = {}
    try:
        for name, meta in layers[layer_prefix]["tensors"].items():
            full = f"{layer_prefix}.{name}"
            shard = weight_map.get(full)
            if shard is None:
                raise ManifestError(f"{root / INDEX_NAME}: does not list {full}; convert again")
            if shard not in headers:
                headers[shard] = read_header(root / shard)[0]
            info = headers[shard][full]
            shape = tuple(meta["shape_per_rank"])
            if info.dtype != meta["dtype"] or info.shape != (tp, *shape):
                raise ManifestError(f"{root / shard}: {full} disagrees with the manifest")
            t = torch.empty(shape, dtype=dtypes.to_torch(info.dtype))
            row = TensorInfo(full, info.dtype, info.shape, info.start, info.nbytes, info.file)
            files.read_rows(row, tp_rank, tp_rank + 1, t)
            out[name] = t.to(device)
    finally:
        files.close()
    return out
