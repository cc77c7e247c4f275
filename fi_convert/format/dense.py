"""An output's other tensors (attention, embeddings, dense MLPs, shared experts, norms, router
gates) into a server's model, at the speed of the experts' read.

Which bytes go where is asked of the model itself (`probe.py`): each tensor is first handed to
the model's own `load_weights` as a probe holding no data. Where the model only copies it
(whole, or the slices a tensor-parallel rank keeps, or into its shard of a fused QKV or
stacked gate/up parameter, under any name), those byte ranges join the experts' `BulkRead`
and are read straight into the parameters (`add_to`): each rank reads only the bytes it keeps.
Where the model does more (a dtype conversion, a transposed copy, `.item()`, a tensor it keeps
or joins to another), the tensor is read in batches into reused host memory (pinned for a GPU,
the first batch while the bulk read runs). Once the bulk read is done, `load_weights` runs once
over every tensor in the output's order (`finish`): those read directly as probes that copy
nothing, the others with their data; so what the model does after its loop sees every byte in
place. That second call is left out where the first, asking, was one call over every tensor
that only copied them and read none of the model's tensors (writes elsewhere, such as vLLM's
vocabulary embedding zeroing its padding rows, it made then, as a load makes them): it was the
load, but for the bytes the read puts in place. A tensor the model skips is not read at all.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .. import dtypes
from ..bulk_read import BulkRead, ReadError, default_host_memory
from ..st_io import TensorInfo
from .as_found import Found, as_found
from .plan_cache import Context, PlanCache, plan_cache
from .probe import Probed, Watch, probe, replay, storage_key
from .reader import OutputReader

LoadWeights = Callable[[Iterable[tuple[str, torch.Tensor]]], Any]
BATCH = 64 << 20  # host memory of one batch of tensors handed to load_weights
MIN_BATCH = 1 << 20  # pinned batches smaller than this are not worth it: host memory instead
RING = 3  # batches held at once: one read ahead, one handed out, one the model may still hold
ALIGN = 64  # each tensor of a batch starts at a multiple of this


class DenseLoad:
    """The output's non-expert tensors for `model`, planned by probing `load_weights` (the
    model's own loading, as the server calls it). Then `add_to` a bulk read and `load_rest`
    while it runs. `loaded`: the names of the parameters filled (for a server's check);
    `untracked`: the model's load_weights said nothing of what it loaded (returned None), which
    vLLM's own loader takes as no list to check."""

    def __init__(
        self,
        reader: OutputReader,
        model: torch.nn.Module,
        load_weights: LoadWeights,
        device: torch.device,
        host_memory: int | None = None,
        context: Context | None = None,
    ) -> None:
        """`context`: what the server says of this load beside the model (`plan_cache`):
        given, the answer of an earlier asking with the same key is taken, and this one's
        kept."""
        self.reader, self.device = reader, torch.device(device)
        # the pinned memory its batches may take (the budget's share the bulk read leaves)
        self.host_memory = default_host_memory() if host_memory is None else host_memory
        self._load_weights = load_weights
        self.loaded: set[str] = set()
        self.untracked = False
        self.rest_s = 0.0
        self._pinned = self.device.type == "cuda"  # batches pinned, within host_memory
        self._batch: BulkRead | None = None
        self._blocks = _Blocks(0, False)
        self._batches: list[list[str]] = []
        self._ahead: tuple[list[tuple[str, torch.Tensor]], BulkRead] | None = None
        self._keeping: tuple | None = None  # (this asking's answer, until `keep`)
        self.infos = self._infos()
        modules = list(model.named_modules())  # (one walk of a model of thousands)
        held, named = _held(modules, self.device)
        self._held, self._named = held, named
        t0 = time.perf_counter()
        wanted = [(n, i.shape, dtypes_of(i)) for n, i in self.infos.items()]
        plans = plan_cache(context, wanted, modules, named)
        sizes = {n: i.nbytes for n, i in self.infos.items()}
        remembered = plans.lookup(named, sizes) if plans else None
        # "asked", "remembered" (an earlier asking's answer), or why this one was not kept
        self.plan = "remembered" if remembered is not None else "asked"
        if remembered is not None:
            self.probed, self.again = remembered.probed, False
            remembered.fill()  # (as the asking wrote them: where the read puts no byte)
            if remembered.loaded is None:
                self.untracked = True
            else:
                self.loaded |= remembered.loaded
        else:
            self._ask(modules, held, wanted, plans)
        self.probe_s = time.perf_counter() - t0
        for p in self.probed.values():
            if p.direct:
                self.loaded |= {held[storage_key(c.dst)] for c in p.copies}

    def _ask(
        self,
        modules: list[tuple[str, torch.nn.Module]],
        held: dict[tuple[str, int], str],
        wanted: list[tuple[str, tuple[int, ...], torch.dtype]],
        plans: PlanCache | None,
    ) -> None:
        """Ask the model where each tensor goes (`probe`); where its answer may stand for a
        later load's, what `keep` needs to keep it in `plans` (`plan_cache`)."""
        calls: list[Watch] = []
        look = list(self._named.values()) if plans else None
        with as_found([m for _, m in modules], look) as found:
            with plans.watching_code() if plans else contextlib.nullcontext():
                self.probed = {
                    p.name: p
                    for p in probe(self._call, wanted, lambda t: storage_key(t) in held, calls)
                }
            # once is enough where the one call asked did all the model does with its tensors
            # (copies alone, and writes elsewhere): it stands as the load's, the model as it
            # left it, and the read puts the bytes in place
            self.again = not _once(calls, self.probed.values())
            found.keep = not self.again
            for call in reversed(calls) if self.again else ():
                call.undo()  # (before the read: it writes over some of those bytes)
            if plans is None:
                return
            # (the model's state looked at now: the experts' install, next, changes their
            # layers, as SGLang's derived scale parameters)
            why = self._not_kept(calls, found)
            if why is not None:
                self.plan = f"asked, not kept for the next load: {why}"
            else:  # (`loaded`: what load_weights said it loaded, yet)
                said = None if self.untracked else set(self.loaded)
                self._keeping = (plans, calls[0], held, said)

    def _not_kept(self, calls: list[Watch], found: Found) -> str | None:
        """Why this asking's answer may not stand for a later load's (None where it may)."""
        if self.again:
            return "its loading does more than copy each tensor in one call"
        if calls[0].other_write is not None:
            return f"its loading writes otherwise than numbers ({calls[0].other_write})"
        if (changed := found.changed()) is not None:
            return f"its loading changes {changed}"
        return None

    def keep(self) -> None:
        """This load's asking's answer written for later loads, where it may stand for theirs,
        or `plan` says why not (`plan_cache`). Run as the bulk read goes (`whole_read`): the
        entry's making and write are off the path to the read's last requests. `finish` runs
        it where nothing did; `abort` drops it."""
        if self._keeping is None:
            return
        plans, watch, held, said = self._keeping
        self._keeping = None
        why = plans.record(self.probed, watch, held, said)
        self.plan = (
            "asked, kept for the next load"
            if why is None
            else f"asked, not kept for the next load: {why}"
        )

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
        elif names is None:  # (as vLLM's NemotronH_Nano_VL_V2: it loads more than it says)
            self.untracked = True

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

    @property
    def pinned_bytes(self) -> int:
        """Pinned host memory of the batches handed to load_weights (allocated so far)."""
        return self._blocks.made * self._blocks.size if self._blocks.pinned else 0

    def add_to(self, bulk: BulkRead) -> None:
        """The direct copies' byte ranges, into `bulk` (on the model's device)."""
        for name, p in self.probed.items():
            for c in p.copies if p.direct else ():
                info = self.infos[name]
                if c.rows is None:
                    self.reader.read_bytes_into(info, c.offset, c.dst, bulk)
                else:
                    self.reader.read_rows_into(info, c.offset, c.rows, c.dst, bulk)

    # -- then load_weights over every tensor ------------------------------------------------

    def prefetch(self) -> None:
        """Start reading the first batch of the tensors load_weights takes with their data
        (call as the bulk read starts)."""
        size = min(BATCH, _padded_total(self.rest, self.infos))
        pinned = self._pinned and self.host_memory >= RING * size
        if self._pinned and not pinned and self.host_memory >= RING * MIN_BATCH:
            size, pinned = self.host_memory // RING, True
        self._blocks = _Blocks(size, pinned)
        self._batches = list(_batches(self.rest, self.infos, self._blocks.size))
        self._ahead = self._read(self._batches[0]) if self._batches else None

    def finish(self) -> None:
        """Once the bulk read is done: the model's load_weights over every tensor in the
        output's order, the directly read ones as probes that copy nothing (their bytes are in
        place), the others with their data, read in batches ahead of it. Not where the one
        call that asked did all the model does with its tensors (`again` False)."""
        self.keep()
        if not self.again:
            return
        t0 = time.perf_counter()
        seen: list = []
        stopped = replay(self._call, self._replayed(), seen)
        if stopped is not None:
            raise ReadError(
                f"{self.reader.root}: the model's load_weights took {stopped} otherwise than "
                "when it was asked where each tensor goes; report this to fi-convert"
            )
        self._late_copies(seen)
        self.rest_s = time.perf_counter() - t0

    def _late_copies(self, seen: list) -> None:
        """The copies the model made in the whole call that probing did not see (it made them
        after its loop, from a tensor it kept: a tied lm_head), read now."""
        bulk, late = self.reader.bulk(self.device), False
        for p in seen:
            planned = {
                (storage_key(c.dst), c.dst.storage_offset()) for c in self.probed[p.name].copies
            }
            for c in p.copies:
                if (storage_key(c.dst), c.dst.storage_offset()) in planned:
                    continue
                if storage_key(c.dst) not in self._held:
                    raise ReadError(
                        f"{self.reader.root}: the model's load_weights copied {p.name} into a "
                        "tensor it does not hold; report this to fi-convert"
                    )
                info = self.infos[p.name]
                if c.rows is None:
                    self.reader.read_bytes_into(info, c.offset, c.dst, bulk)
                else:
                    self.reader.read_rows_into(info, c.offset, c.rows, c.dst, bulk)
                self.loaded.add(self._held[storage_key(c.dst)])
                late = True
        if late:
            bulk.run()

    def _replayed(self) -> Iterator[tuple[str, torch.Tensor | tuple[tuple[int, ...], Any]]]:
        batch: dict[str, torch.Tensor] = {}
        k = 0
        for name, info in self.infos.items():
            if self.probed[name].direct:
                yield name, (info.shape, dtypes_of(info))
                continue
            if name not in batch:
                batch = self._next_batch(k)
                k += 1
            yield name, batch.pop(name)

    def _next_batch(self, k: int) -> dict[str, torch.Tensor]:
        """Batch k, once read; batch k+1 starts reading."""
        assert self._ahead is not None
        tensors, bulk = self._ahead
        bulk.wait()
        self._batch = None
        del bulk  # (its requests hold views of the block)
        more = k + 1 < len(self._batches)
        self._ahead = self._read(self._batches[k + 1]) if more else None
        return dict(tensors)

    def _read(self, names: list[str]) -> tuple[list[tuple[str, torch.Tensor]], BulkRead]:
        """Start reading `names` into host memory (a block, or one tensor larger than one)."""
        block = self._blocks.take(_padded_total(names, self.infos))
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
        """Stop a batch read under way (Ctrl-C, or a fault elsewhere); nothing kept."""
        self._keeping = None
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
    """RING reused host blocks of `size` bytes, taken in turn (a batch larger than a block gets
    memory of its own). A block is refilled only once nothing but this holds its memory: one
    the model kept a view of is left to it, and a fresh one takes its place."""

    def __init__(self, size: int, pinned: bool) -> None:
        self.size, self.pinned = size, pinned
        self._ring: list[torch.Tensor] = []
        self.made = 0  # blocks allocated

    def take(self, nbytes: int) -> torch.Tensor:
        if nbytes > self.size:
            return torch.empty(
                nbytes, dtype=torch.uint8, device="cpu"
            )  # too large to pin for one use
        if len(self._ring) == RING:
            oldest = self._ring.pop(0)
            if self.pinned:  # the model's copies out of it may still run
                torch.cuda.current_stream().synchronize()
            if not _shared(oldest):
                self._ring.append(oldest)
                return oldest
        block = torch.empty(self.size, dtype=torch.uint8, device="cpu", pin_memory=self.pinned)
        self.made += 1
        self._ring.append(block)
        return block


def _once(calls: list[Watch], probed: Iterable[Probed]) -> bool:
    """Whether the model's load_weights was asked in one call, not interrupted, that read
    none of the model's tensors, wrote none of the bytes a tensor is copied into, and left
    every tensor to be read directly."""
    probed = list(probed)
    return (
        len(calls) == 1
        and not calls[0].interrupted
        and calls[0].read is None
        and all(p.direct for p in probed)
        and not any(calls[0].overlapping(c.dst) for p in probed for c in p.copies)
    )


def _shared(block: torch.Tensor) -> bool:
    """Whether anything but this tensor holds the block's memory (a view the model kept)."""
    storage = block.untyped_storage()
    return int(torch._C._storage_Use_Count(storage._cdata)) > 2  # the tensor, and `storage`


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
    return torch.empty(info.shape, dtype=dtypes_of(info), device="cpu")


def dtypes_of(info: TensorInfo) -> torch.dtype:
    """The torch dtype of a stored tensor; one line where torch has none for it."""
    try:
        return dtypes.to_torch(info.dtype)
    except KeyError:
        raise ReadError(
            f"{info.file}: tensor {info.name} has dtype {info.dtype}, which this torch "
            f"({torch.__version__}) cannot hold; upgrade torch or convert again"
        ) from None


def _held(
    modules: list[tuple[str, torch.nn.Module]], device: torch.device
) -> tuple[dict[tuple[str, int], str], dict[str, torch.Tensor]]:
    """The parameters and buffers of the model's `modules` (its `named_modules`) on `device`
    (the bulk read's), by their memory, and by name: each tensor once, by its first name, the
    parameters first (as `named_parameters` and `named_buffers` name them, without walking the
    model twice more)."""
    out: dict[tuple[str, int], str] = {}
    named: dict[str, torch.Tensor] = {}
    # (a server's parameter types' own __torch_function__ would take each query: vLLM's)
    with torch._C.DisableTorchFunctionSubclass():
        for entries in ("_parameters", "_buffers"):
            seen: set[int] = set()
            for prefix, m in modules:
                for name, t in getattr(m, entries).items():
                    if t is None or id(t) in seen:
                        continue
                    seen.add(id(t))
                    if t.device.type == device.type and t.numel():
                        key = storage_key(t)
                        if key not in out:
                            out[key] = f"{prefix}.{name}" if prefix else name
                            named[out[key]] = t
    return out, named


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
