"""`fi-convert verify`: prove an output folder is what its manifest says, and optionally that
its bytes are what the source gives (re-derived with our code, or with FlashInfer's)."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import dtypes
from . import manifest as mf
from .errors import FiConvertError
from .pipeline import resolve_device
from .plan import Options, make_plan
from .schemes.base import Ctx
from .source import INDEX_NAME, open_checkpoint
from .st_io import SourceFiles, TensorInfo, read_header


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def count(self, what: str, n: int = 1) -> None:
        self.checked[what] = self.checked.get(what, 0) + n

    def as_dict(self) -> dict:
        return {"ok": self.ok, "checked": self.checked, "problems": self.problems}


def verify(
    out_dir: str | Path,
    *,
    source: str | Path | None = None,
    full: bool = False,
    against_flashinfer: bool = False,
    device: str = "auto",
) -> Report:
    """Check files, index and manifest; with `source`, re-derive a sample of experts (all
    with `full`) and compare bytes; `against_flashinfer` re-derives them with FlashInfer."""
    root = Path(out_dir)
    m = mf.read(root)
    rep = Report()
    rep.problems += mf.check_files(root, m)
    rep.count("files", len(m["files"]))
    headers = _check_index(root, m, rep)
    if source is not None and rep.ok:
        _check_source(root, m, headers, Path(source), full, against_flashinfer, device, rep)
    return rep


def _check_index(root: Path, m: dict, rep: Report) -> dict[str, TensorInfo]:
    """The index names exactly the shards' tensors, its total size adds up, and every layer
    tensor of the manifest is in the shards with its dtype and [tp, *shape_per_rank]."""
    try:
        index = json.loads((root / INDEX_NAME).read_text())
        wm = index["weight_map"]
        if not isinstance(wm, dict):
            raise TypeError("weight_map is not a map")
    except (OSError, ValueError, KeyError, TypeError) as e:
        what = "missing" if isinstance(e, FileNotFoundError) else f"unreadable ({e})"
        rep.problems.append(f"{root / INDEX_NAME}: {what}")
        return {}
    tensors: dict[str, TensorInfo] = {}
    for shard in sorted(set(wm.values())):
        if shard not in m["files"]:
            rep.problems.append(f"{root / INDEX_NAME}: names {shard}, which the manifest lacks")
            continue
        for name, info in read_header(root / shard)[0].items():
            tensors[name] = info
            if wm.get(name) != shard:
                rep.problems.append(f"{root / shard}: holds {name}, which the index puts elsewhere")
    for name in wm:
        if name not in tensors:
            rep.problems.append(f"{root / INDEX_NAME}: lists {name}, which no shard holds")
    total = sum(t.nbytes for t in tensors.values())
    if index.get("metadata", {}).get("total_size") != total:
        rep.problems.append(f"{root / INDEX_NAME}: metadata.total_size is not {total}")
    tp = m["tp_size"]
    for prefix, layer in m["layers"].items():
        for pname, meta in layer["tensors"].items():
            found = tensors.get(f"{prefix}.{pname}")
            want = (tp, *meta["shape_per_rank"])
            if found is None:
                rep.problems.append(f"{root}: manifest tensor {prefix}.{pname} is in no shard")
            elif found.dtype != meta["dtype"] or found.shape != want:
                rep.problems.append(
                    f"{found.file}: {found.name} is {found.dtype} {list(found.shape)}, the "
                    f"manifest says {meta['dtype']} {list(want)}"
                )
            rep.count("tensors")
    rep.count("index_entries", len(wm))
    return tensors


def _sample(n: int, full: bool) -> list[int]:
    return list(range(n)) if full else sorted({0, n // 2, n - 1})


def _check_source(root, m, tensors, source, full, against_flashinfer, device, rep) -> None:
    if open_checkpoint(source).fingerprint != m["source"]["fingerprint"]:
        rep.problems.append(
            f"{source}: not the checkpoint this output was converted from (source fingerprint "
            "differs); pass the original model folder"
        )
        return
    plan = make_plan(source, Options(m["scheme"], m["backend"], m["tp_size"]))
    dev = resolve_device(device)
    files = SourceFiles()
    try:
        if against_flashinfer:
            _against_oracle(plan, tensors, files, full, dev, rep)
        else:
            _against_ours(plan, tensors, files, full, dev, rep)
    finally:
        files.close()


def _stored(files: SourceFiles, info: TensorInfo, rank: int) -> torch.Tensor:
    """One rank's slice of a stored tensor."""
    t = torch.empty(info.shape[1:], dtype=dtypes.to_torch(info.dtype))
    files.read_rows(info, rank, rank + 1, t)
    return t


def _produce(ctx: Ctx, out, rank: int, experts: range, dst: torch.Tensor) -> None:
    """`out.produce`, then its staging buffers free again (as the converter does per chunk:
    kept, they would pile up with every expert checked)."""
    out.produce(ctx, rank, experts, dst)
    if dst.is_cuda:  # the copies from the staging buffers must be done before their reuse
        torch.cuda.current_stream(dst.device).synchronize()
    ctx.release()


def _against_ours(plan, tensors, files, full, dev, rep) -> None:
    ctx = Ctx(files, dev)
    tp = plan.options.tp_size
    for lp in plan.layers:
        experts = _sample(lp.info["num_experts"], full)
        for out in lp.outputs:
            info = tensors[f"{lp.prefix}.{out.name}"]
            for rank in range(tp):
                stored = _stored(files, info, rank)
                got = torch.empty(out.rank_shape, dtype=stored.dtype, device=dev)
                if not out.chunked:
                    _produce(ctx, out, rank, range(lp.info["num_experts"]), got)
                    pairs = [(got, stored)]
                else:
                    pairs = []
                    for e in experts:
                        one = got[e : e + 1]
                        _produce(ctx, out, rank, range(e, e + 1), one)
                        pairs.append((one, stored[e : e + 1]))
                for a, b in pairs:
                    if not dtypes.same_bytes(a, b):
                        rep.problems.append(
                            f"{info.file}: {info.name} rank {rank} differs from the source "
                            "re-derived; convert again"
                        )
                        break
                rep.count("rank_tensors_rederived")
        rep.count("experts_rederived", len(experts) * tp)


def _against_oracle(plan, tensors, files, full, dev, rep) -> None:
    try:
        oracle = importlib.import_module("fi_convert.oracle")
    except ImportError as e:
        raise FiConvertError(
            f"--against-flashinfer needs FlashInfer ({e.name} is missing); install it with "
            "`pip install 'fi-convert[flashinfer]'` (or `make install`), or verify without it"
        ) from None
    tp = plan.options.tp_size
    layers = plan.layers if full else [plan.layers[0], plan.layers[-1]]
    for lp in {id(x): x for x in layers}.values():
        for rank in range(tp):
            want = oracle.expected(
                plan.ckpt.root,
                lp.prefix,
                lp.info["num_experts"],
                plan.scheme.value,
                plan.options.backend.value,
                tp,
                rank,
                str(dev),
            )
            for name, t in want.items():
                info = tensors.get(f"{lp.prefix}.{name}")
                if info is None or not dtypes.same_bytes(_stored(files, info, rank), t):
                    rep.problems.append(
                        f"{plan.ckpt.root}: {lp.prefix}.{name} rank {rank} differs from "
                        "FlashInfer's own pipeline"
                    )
                rep.count("tensors_vs_flashinfer")
