"""Read one tensor-parallel rank's kernel-ready MoE tensors from an output folder.

`OutputReader` checks the manifest and the shards once, then reads any layer's tensor for a
rank into a caller's buffer (a server's parameter). Reads go through a `BulkRead`: one per
call, or one shared by many calls (`bulk()`, then `run()`), which reads all their byte ranges
at once with several threads, straight into host buffers or, into a GPU, through pinned host
buffers copied on their own streams. `load_moe_layer` is the dict-returning convenience.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from .. import dtypes
from ..bulk_read import BulkRead, HostBuffers
from ..errors import ManifestError
from ..st_io import SourceFiles, TensorInfo, read_header
from . import manifest as mf
from .names import INDEX_NAME


class OutputReader:
    """A finished output, opened for reading rank slices of its MoE tensors."""

    def __init__(
        self, out_dir: str | Path, manifest: dict | None = None, *, library_check: bool = True
    ) -> None:
        # library_check: also the safetensors library's parse of each shard's header
        # (st_io.read_header); the plugins' loads, which read every byte by fi-convert's own
        # strict parse, go without it
        self.library_check = library_check
        self.root = Path(out_dir)
        self.manifest = mf.read(self.root) if manifest is None else manifest
        self.tp_size: int = self.manifest["tp_size"]
        self.layers: dict[str, dict] = self.manifest["layers"]
        try:
            index = json.loads((self.root / INDEX_NAME).read_text())
            self._weight_map: dict[str, str] = index["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ManifestError(
                f"{self.root / INDEX_NAME}: unreadable ({e}); convert again"
            ) from None
        self._headers: dict[str, dict[str, TensorInfo]] = {}
        self._files = SourceFiles()

    def close(self) -> None:
        self._files.close()

    def __enter__(self) -> OutputReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def layer(self, prefix: str) -> dict:
        if prefix not in self.layers:
            some = ", ".join(list(self.layers)[:3])
            raise ManifestError(
                f"{self.root}: no MoE layer {prefix!r} in the manifest (it has "
                f"{len(self.layers)}, e.g. {some}); pass the module prefix of the source checkpoint"
            )
        return self.layers[prefix]

    def shards(self) -> list[str]:
        """The output's shard file names, as the index lists them."""
        return sorted(set(self._weight_map.values()))

    def is_expert_tensor(self, name: str) -> bool:
        """Whether `name` (a full tensor name) is a converted MoE tensor of this output."""
        prefix, _, param = name.rpartition(".")
        return prefix in self.layers and param in self.layers[prefix]["tensors"]

    def info(self, prefix: str, name: str) -> tuple[TensorInfo, tuple[int, ...], torch.dtype]:
        """The stored tensor of `prefix.name`, checked against the manifest: its header entry,
        the per-rank shape and the torch dtype."""
        meta = self.layer(prefix)["tensors"].get(name)
        full = f"{prefix}.{name}"
        if meta is None:
            raise ManifestError(f"{self.root}: the manifest has no tensor {full}")
        shard = self._weight_map.get(full)
        if shard is None:
            raise ManifestError(f"{self.root / INDEX_NAME}: does not list {full}; convert again")
        info = self.header(shard).get(full)
        shape = tuple(meta["shape_per_rank"])
        if info is None or info.dtype != meta["dtype"] or info.shape != (self.tp_size, *shape):
            raise ManifestError(f"{self.root / shard}: {full} disagrees with the manifest")
        return info, shape, dtypes.to_torch(info.dtype)

    def header(self, shard: str) -> dict[str, TensorInfo]:
        """The header of one of the output's shards (read once, from the file kept open)."""
        if shard not in self._headers:
            self._headers[shard] = self._open(self.root / shard)
        return self._headers[shard]

    def _open(self, path: Path) -> dict[str, TensorInfo]:
        """The shard's header, read from the file that stays open for the reads: the header
        checked and the bytes read are one file's, whatever takes its name meanwhile. (The
        library's own check, where asked, opens the name: it must still name that file.)"""
        fd = self._files.fd(path)
        infos = read_header(path, self.library_check, fd)[0]
        if self.library_check:
            st, ft = os.stat(path), os.fstat(fd)
            if (st.st_dev, st.st_ino) != (ft.st_dev, ft.st_ino):
                raise ManifestError(f"{path}: replaced while it was opened; load again")
        return infos

    def bulk(
        self,
        device: str | torch.device,
        *,
        threads: int | None = None,
        host_memory: int | str | None = None,
        buffers: HostBuffers | None = None,
    ) -> BulkRead:
        """A read shared by many `read_into` / `read_experts_into` calls (`bulk=`): their byte
        ranges are read at once by its `run()` (into a GPU through `buffers` when given)."""
        return BulkRead(device, threads=threads, host_memory=host_memory, buffers=buffers)

    def read_into(
        self,
        prefix: str,
        name: str,
        tp_rank: int,
        dst: torch.Tensor,
        bulk: BulkRead | None = None,
    ) -> None:
        """Fill `dst` (contiguous, any shape and dtype of the same byte size, on any device) with
        rank `tp_rank`'s bytes of `prefix.name`. Reads only that rank's byte range: now, or with
        `bulk` when that runs."""
        if not 0 <= tp_rank < self.tp_size:
            raise ManifestError(
                f"{self.root}: tp_rank {tp_rank} out of range; this output was converted for "
                f"--tp-size {self.tp_size} (ranks 0..{self.tp_size - 1})"
            )
        info, _, _ = self.info(prefix, name)
        spans = [(info.start + tp_rank * info.row_bytes, info.row_bytes)]
        self._read_spans(info, spans, dst, bulk)

    def read_experts_into(
        self,
        prefix: str,
        name: str,
        experts: Sequence[int],
        dst: torch.Tensor,
        bulk: BulkRead | None = None,
        tp_rank: int | None = None,
    ) -> None:
        """Expert parallelism: fill `dst` with the bytes of the listed (global) experts of
        `prefix.name`, in that order, from an output converted for one rank (each expert's
        layout is its own, so a rank's experts are whole slices of it). Reads only those.
        With `tp_rank` (a server whose MoE layers split each expert over TP ranks under EP:
        SGLang's `--tp 8 --ep-size 4`): the experts' slices of that TP rank's bytes, from an
        output of any --tp-size."""
        if tp_rank is None and self.tp_size != 1:
            raise ManifestError(
                f"{self.root}: converted for --tp-size {self.tp_size}; expert parallelism "
                "keeps whole experts on each rank: convert again with --tp-size 1"
            )
        if tp_rank is not None and not 0 <= tp_rank < self.tp_size:
            raise ManifestError(
                f"{self.root}: tp_rank {tp_rank} out of range; this output was converted for "
                f"--tp-size {self.tp_size} (ranks 0..{self.tp_size - 1})"
            )
        info, shape, _ = self.info(prefix, name)
        n = self.layer(prefix).get("num_experts")
        if not shape or shape[0] != n:
            raise ManifestError(
                f"{self.root}: {prefix}.{name} has no leading dimension of the layer's "
                f"{n} experts (shape {list(shape)}), so it cannot be split by expert"
            )
        bad = [e for e in experts if not 0 <= e < n]
        if bad:
            raise ManifestError(
                f"{self.root}: {prefix} has experts 0..{n - 1}, not {bad[0]} (the model the server "
                "built has more experts than the output: serve it with its own config.json)"
            )
        per = info.row_bytes // n
        base = info.start + (tp_rank or 0) * info.row_bytes
        spans: list[tuple[int, int]] = []
        for e in experts:  # consecutive experts are one read
            if spans and sum(spans[-1]) == base + e * per:
                spans[-1] = (spans[-1][0], spans[-1][1] + per)
            else:
                spans.append((base + e * per, per))
        self._read_spans(info, spans, dst, bulk)

    def read_bytes_into(
        self, info: TensorInfo, offset: int, dst: torch.Tensor, bulk: BulkRead | None = None
    ) -> None:
        """Fill `dst` with its byte size of the stored tensor `info` (a header entry of one of
        the output's shards) from byte `offset` of its data: now, or with `bulk` when that runs."""
        size = dst.numel() * dst.element_size()
        if not 0 <= offset <= offset + size <= info.nbytes:
            raise ValueError(f"{info.name}: bytes {offset}..{offset + size} out of range")
        self._read_spans(info, [(info.start + offset, size)], dst, bulk)

    def read_rows_into(
        self,
        info: TensorInfo,
        offset: int,
        rows: tuple[int, int, int],
        dst: torch.Tensor,
        bulk: BulkRead,
    ) -> None:
        """Fill `dst` with `rows` = (n, size, stride) of the stored tensor `info`: n rows of
        `size` bytes, `stride` apart, from byte `offset` of its data (a column slice), when
        `bulk` runs."""
        n, size, stride = rows
        if not 0 <= offset <= offset + (n - 1) * stride + size <= info.nbytes:
            raise ValueError(f"{info.name}: rows out of range")
        bulk.add_rows(info.file, self._files.fd(info.file), info.start + offset, rows, dst)

    def _read_spans(
        self,
        info: TensorInfo,
        spans: list[tuple[int, int]],
        dst: torch.Tensor,
        bulk: BulkRead | None,
    ) -> None:
        """dst = the bytes of `info.file` at these (offset, size) spans, one after another:
        read by `bulk` when it runs, else now."""
        total = sum(size for _, size in spans)
        if not dst.is_contiguous() or dst.numel() * dst.element_size() != total:
            raise ValueError(f"{info.name}: destination of wrong size or not contiguous")
        flat = dst.reshape(-1).view(torch.uint8)
        fd = self._files.fd(info.file)
        now = bulk or BulkRead(dst.device)
        if len(spans) == 1:  # (most: no view of a view)
            now.add(info.file, fd, spans[0][0], flat)
        else:
            pos = 0
            for base, size in spans:
                now.add(info.file, fd, base, flat[pos : pos + size])
                pos += size
        if bulk is None:
            now.run()


def load_moe_layer(
    out_dir: str | Path,
    layer_prefix: str,
    *,
    tp_rank: int = 0,
    device: str | torch.device = "cpu",
    scheme: str | None = None,
    backend: str | None = None,
    experts: Sequence[int] | None = None,
    threads: int | None = None,
    host_memory: int | str | None = None,
) -> dict[str, torch.Tensor]:
    """Tensors of `layer_prefix` (e.g. "model.layers.3.mlp.experts") for rank `tp_rank`.

    Keyed by vLLM's fused-MoE parameter names and shaped as vLLM holds them after its
    load-time processing. Checks the manifest first (and, when given, that it was converted
    with `scheme` and `backend`) and reads only this rank's bytes, straight into tensors on
    `device`. `experts` (expert parallelism, a --tp-size 1 output): only these global experts,
    in this order, as an EP rank holds them. All the layer's tensors are read at once by
    `threads` threads (default: FI_CONVERT_READ_THREADS, else one per CPU, at most 12), into a
    GPU through at most `host_memory` of pinned host memory (default: FI_CONVERT_HOST_MEMORY,
    else 1GiB).
    """
    root = Path(out_dir)
    m = mf.read(root)
    for key, want in (("scheme", scheme), ("backend", backend)):
        if want is not None and m[key] != str(getattr(want, "value", want)):
            raise ManifestError(
                f"{root}: converted with {key} {m[key]!r}, not {want!r}; convert again with "
                f"--{key} {getattr(want, 'value', want)}"
            )
    dev = _device(device)
    with OutputReader(root, m) as reader:
        bulk = reader.bulk(dev, threads=threads, host_memory=host_memory)
        out = {}
        for name in reader.layer(layer_prefix)["tensors"]:
            _, shape, dtype = reader.info(layer_prefix, name)
            if experts is None:
                out[name] = torch.empty(shape, dtype=dtype, device=dev)
                reader.read_into(layer_prefix, name, tp_rank, out[name], bulk)
            else:
                out[name] = torch.empty((len(experts), *shape[1:]), dtype=dtype, device=dev)
                reader.read_experts_into(layer_prefix, name, experts, out[name], bulk)
        bulk.run()
    return out


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ManifestError(
            f"device {device!r}: not a device name; pass 'cpu' or 'cuda[:N]'"
        ) from None
    if dev.type not in ("cpu", "cuda"):
        raise ManifestError(f"device {str(device)!r}: the reader loads to 'cpu' or 'cuda[:N]'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ManifestError(
            f"device {str(device)!r} is not available here (torch.cuda.is_available() is "
            "False); load on 'cpu'"
        )
    n = torch.cuda.device_count() if dev.type == "cuda" else 0
    if dev.type == "cuda" and dev.index is not None and dev.index >= n:
        raise ManifestError(
            f"device {str(device)!r} is not available here (this machine has {n} CUDA "
            f"device{'s' if n != 1 else ''}: cuda:0 to cuda:{n - 1}); load on one of them"
        )
    return dev
