"""An output's other tensors (attention, embeddings, dense MLPs, shared experts, norms, router
gates) into a server's model, at the speed of the experts' read.

Which bytes go where is asked of the model itself (`probe.py`): each tensor is first handed to
the model's own `load_weights` as a probe holding no data. Where the model only copies it
(whole, or the slices a tensor-parallel rank keeps, or into its shard of a fused QKV or
stacked gate/up parameter, under any name), those byte ranges join the experts' `BulkRead`
and are read straight into the parameters (`add_to`): each rank reads only the bytes it keeps.
Where the model does more (a dtype conversion, a transposed copy, `.item()`, a tensor it keeps),
the tensor is read, in batches, into reused host memory (pinned for a GPU) and handed to
`load_weights` with its data (`load_rest`), while the bulk read runs. A tensor the model skips
is not read at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .. import dtypes
from ..bulk_read import BulkRead, ReadError
from ..st_io import TensorInfo
from .probe import Probed, probe
from .reader import OutputReader

LoadWeights = Callable[[Iterable[tuple[str, torch.Tensor]]], Any]
BATCH = 64 << 20  # host memory of one batch of tensors handed to load_weights (two are held)
ALIGN = 64  # each tensor of a batch starts at a multiple of this


class DenseLoad:
    """The output's non-expert tensors for `model`, planned by probing `load_weights` (the
    model's own loading, as the server calls it). Then `add_to` a bulk read and `load_rest`
    while it runs. `loaded`: the names of the parameters filled (for a server's check)."""

    def __init__(
        self,
        reader: OutputReader,
        model: torch.nn.Module,
        load_weights: LoadWeights,
        device: torch.device,
    ) -> None:
        self.reader, self.device = reader, torch.device(device)
        self._load_weights = load_weights
        self.loaded: set[str] = set()
        self.rest_s = 0.0
        self._batch: BulkRead | None = None
        self.infos = self._infos()
        held = _held(model, self.device)
        t0 = time.perf_counter()
        wanted = [(n, i.shape, dtypes_of(i)) for n, i in self.infos.items()]
        self.probed = {p.name: p for p in probe(self._call, wanted, lambda t: _key(t) in held)}
        self.probe_s = time.perf_counter() - t0
        for p in self.probed.values():
            if p.direct:
                self.loaded |= {held[_key(c.dst)] for c in p.copies}

    def _infos(self) -> dict[str, TensorInfo]:
        r = self.reader
        return {
            name: info
            for shard in r.shards()
            for name, info in r.header(shard).items()
            if not r.is_expert_tensor(name)
        }

    def _call(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        names = self._load_weights(weights)
        if isinstance(names, set):  # vLLM's models say which parameters they loaded
            self.loaded |= {n for n in names if isinstance(n, str)}

    # -- the plan ---------------------------------------------------------------------------

    @property
    def direct_bytes(self) -> int:
        """Bytes read straight into the model's tensors."""
        return sum(c.nbytes for p in self.probed.values() if p.direct for c in p.copies)

    @property
    def rest(self) -> list[str]:
        """The tensors handed to load_weights with their data."""
        return [n for n, p in self.probed.items() if not p.direct]

    @property
    def rest_bytes(self) -> int:
        return sum(self.infos[n].nbytes for n in self.rest)

    @property
    def nbytes(self) -> int:
        return self.direct_bytes + self.rest_bytes

    def add_to(self, bulk: BulkRead) -> None:
        """The direct copies' byte ranges, into `bulk` (on the model's device)."""
        for name, p in self.probed.items():
            for c in p.copies if p.direct else ():
                self.reader.read_bytes_into(self.infos[name], c.offset, c.dst, bulk)

    # -- the rest: through load_weights -----------------------------------------------------

    def load_rest(self) -> None:
        """The other tensors read in batches into host memory, each batch handed to
        load_weights while the next is read."""
        t0 = time.perf_counter()
        pinned = self.device.type == "cuda"
        blocks = _Blocks(min(BATCH, _padded_total(self.rest, self.infos)), pinned)
        batches = list(_batches(self.rest, self.infos, blocks.size))
        ahead = self._read(batches[0], blocks) if batches else None
        for k in range(len(batches)):
            assert ahead is not None
            tensors, bulk = ahead
            bulk.wait()
            self._batch = None
            del bulk  # (its requests hold views of the block)
            ahead = self._read(batches[k + 1], blocks) if k + 1 < len(batches) else None
            self._call(iter(tensors))
            del tensors
            blocks.release(pinned)
        self.rest_s = time.perf_counter() - t0

    def _read(
        self, names: list[str], blocks: _Blocks
    ) -> tuple[list[tuple[str, torch.Tensor]], BulkRead]:
        """Start reading `names` into host memory (a block, or one tensor larger than one)."""
        block = blocks.take(_padded_total(names, self.infos))
        bulk = self.reader.bulk("cpu")
        out, pos = [], 0
        for name in names:
            info = self.infos[name]
            flat = block[pos : pos + info.nbytes]
            t = flat.view(dtypes_of(info)).view(info.shape) if info.nbytes else _empty(info)
            self.reader.read_bytes_into(info, 0, flat, bulk)
            out.append((name, t))
            pos += _aligned(info.nbytes)
        self._batch = bulk
        bulk.start()
        return out, bulk

    def abort(self) -> None:
        """Stop a batch read under way (Ctrl-C, or a fault elsewhere)."""
        if self._batch is not None:
            self._batch.abort()
            self._batch = None

    def summary(self) -> str:
        """What went where, for a load's log line."""
        return (
            f"{_gb(self.direct_bytes)} read straight into the model's tensors, "
            f"{_gb(self.rest_bytes)} through its load_weights ({len(self.rest)} tensors)"
        )


class _Blocks:
    """Two reused host blocks of `size` bytes, taken in turn; a batch larger than a block gets
    one of its own. A block the model kept a view of is left to it (a fresh one replaces it)."""

    def __init__(self, size: int, pinned: bool) -> None:
        self.size, self.pinned = size, pinned
        self._free: list[torch.Tensor] = []
        self._used: list[torch.Tensor] = []
        self._made = 0

    def take(self, nbytes: int) -> torch.Tensor:
        if nbytes > self.size:
            block = torch.empty(nbytes, dtype=torch.uint8)  # too large to pin for one use
        elif self._free:
            block = self._free.pop()
        else:
            block = torch.empty(self.size, dtype=torch.uint8, pin_memory=self.pinned)
            self._made += 1
        self._used.append(block)
        return block

    def release(self, pinned: bool) -> None:
        """The oldest block in use back to the free list, once the model is done with it."""
        block = self._used.pop(0)
        if pinned:  # the model's copies out of it may be asynchronous
            torch.cuda.current_stream().synchronize()
        if block.numel() == self.size and _uses(block) == 1:
            self._free.append(block)


def _uses(block: torch.Tensor) -> int:
    """References to the block's memory besides views that were dropped: 1 = ours alone."""
    return int(torch._C._storage_Use_Count(block.untyped_storage()._cdata))


def _batches(names: list[str], infos: dict[str, TensorInfo], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    used = 0
    for name in names:
        n = _aligned(infos[name].nbytes)
        if batch and used + n > size:
            yield batch
            batch, used = [], 0
        batch.append(name)
        used += n
    if batch:
        yield batch


def _padded_total(names: Iterable[str], infos: dict[str, TensorInfo]) -> int:
    return max(ALIGN, sum(_aligned(infos[n].nbytes) for n in names))


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _empty(info: TensorInfo) -> torch.Tensor:
    return torch.empty(info.shape, dtype=dtypes_of(info))


def dtypes_of(info: TensorInfo) -> torch.dtype:
    """The torch dtype of a stored tensor; one line where torch has none for it."""
    try:
        return dtypes.to_torch(info.dtype)
    except KeyError:
        raise ReadError(
            f"{info.file}: tensor {info.name} has dtype {info.dtype}, which this torch "
            f"({torch.__version__}) cannot hold; upgrade torch or convert again"
        ) from None


def _key(t: torch.Tensor) -> tuple[str, int]:
    return t.device.type, t.untyped_storage().data_ptr()


def _held(model: torch.nn.Module, device: torch.device) -> dict[tuple[str, int], str]:
    """The model's parameters and buffers on `device` (the bulk read's), by their memory."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return {_key(t): name for name, t in named if t.device.type == device.type and t.numel()}


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
