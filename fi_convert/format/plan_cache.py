"""Where a model's loading put each byte of an output's non-expert tensors, remembered, so that
a later load of the same output into the same model by the same code skips the asking.

The asking (`probe`: each tensor through the model's own `load_weights` as a probe that holds
no data) is pure Python, 4-10 ms at rank 0 of TP 8 of the bench's models on an H100's host:
the most of what a whole load does before its read, and more than rank 0 of TP 8's whole load
may take beyond the machine's limit (docs/speed.md, the fourteenth session: 1.20 of the limit
asked, 1.08-1.12 with the answer taken). Its answer depends on nothing but what the key below
holds, so a load that finds an entry of its key reads the byte ranges the entry names
(`lookup`) and makes the entry's writes of numbers (vLLM's vocabulary embedding zeroes its
padding rows), as the asking did, without calling the model.

An entry is kept (`record`) only where the asking was the load: one call over every tensor
that only copied them and wrote numbers elsewhere (`DenseLoad.again` False), and left the
model's modules, their attributes and its tensors' attributes as it found them. It stands for
its key, which holds: fi-convert's, torch's and Python's versions; the server, its release,
the model's config as the server holds it and this process's place in each parallel group
(`Context`, from the server's loader); the output's non-expert tensors (names, shapes, dtypes);
the model's modules (names, classes) and tensors (names, classes, dtypes, devices, shapes,
strides, offsets). Beside the key, each Python file whose code ran in the asking (`code_seen`),
by its size and modification time (as Python's own bytecode cache checks a source): a
server upgraded, patched or reinstalled asks again. An entry that is not whole and exactly of
its key (a checksum over its bytes) is asked again and written over. What the key does not see: a
setting read by the loading code that changes where it puts bytes while leaving every tensor's
shape, the config and the code as they were; `FI_CONVERT_PLAN_CACHE=0` turns the cache off.

Entries live in `${FI_CONVERT_PLAN_CACHE:-${FI_CONVERT_CACHE:-~/.cache/fi-convert}/plans}`, one
per model, output and rank (tens of kilobytes). A folder that cannot be written is skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..cache import cache_root, write_atomic
from ..errors import FiConvertError
from ..version import __version__
from . import code_seen
from .probe import Copy, Probed, Watch, storage_key

ENV = "FI_CONVERT_PLAN_CACHE"
VERSION = 1  # of an entry's form
# Whether a load looks for (and keeps) entries: a bench setting (`--alt-bulk
# set:fi_convert.format.plan_cache:REMEMBER=False`: asked at every load, as before)
REMEMBER = True
# Whether a load takes an entry it finds: a bench setting (False: asked at every load, and its
# answer kept each time, as at a server's first start)
TAKE = True


# torch's dtypes by the names an entry gives them ("bfloat16")
_DTYPES = {
    str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}


class PlanCacheError(FiConvertError):
    """FI_CONVERT_PLAN_CACHE is set to something that is not a folder."""


@dataclass(frozen=True)
class Context:
    """What, beside the model's and the output's tensors and the code, decides where the
    model's loading puts each byte: the server and its release ("vllm 0.33.0"), the model's
    config as the server holds it (its fields, in any stable text), and this process's place in
    each of the server's parallel groups ((group, rank, size), ...)."""

    server: str
    config: str
    ranks: tuple[tuple[str, int, int], ...]


def folder() -> Path | None:
    """The entries' folder; None where the cache is off."""
    value = os.environ.get(ENV, "")
    if not REMEMBER or value == "0":
        return None
    if value in ("", "1"):
        return cache_root() / "plans"
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise PlanCacheError(
            f"{ENV}={value}: not a folder; set it to a folder for the plans of loads, or to 0 "
            "to ask the model at every load"
        )
    return path


@dataclass
class Remembered:
    """An entry, found: each tensor's copies (into the model's tensors), the writes of numbers
    to make again, and what the model's load_weights said it loaded."""

    probed: dict[str, Probed]
    fills: list[tuple[torch.Tensor, Any]]
    loaded: set[str] | None  # None: it said nothing (returned None)

    def fill(self) -> None:
        for t, number in self.fills:
            t.fill_(number)


@dataclass
class PlanCache:
    """The entry of one load's key in `root`: `lookup` it, or `record` the asking."""

    root: Path
    key: str
    # each of the model's tensors' dtype and the elements of its memory it covers
    spans: dict[str, tuple[torch.dtype, int, int]] = field(default_factory=dict)
    # the code objects that ran in the asking, each with its module's file (`__file__`)
    code: dict[Any, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.root / f"{self.key}.json"

    # -- finding an entry ---------------------------------------------------------------------

    def lookup(self, named: dict[str, torch.Tensor], sizes: dict[str, int]) -> Remembered | None:
        """The entry, with its copies as views of `named` (the model's tensors by name), where
        it is whole, of this key, its code unchanged, and every range within its tensor
        (`sizes`: the output's tensors' bytes) and its target; else None."""
        if not TAKE:
            return None
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        digest, _, body = data.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            return None
        try:
            return _remembered(json.loads(body), self.key, named, self.spans, sizes)
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError):
            return None

    # -- keeping one ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def watching_code(self) -> Iterator[None]:
        """The code objects that run meanwhile, into `code` (`code_seen`)."""
        with code_seen.watching() as seen:
            try:
                yield
            finally:
                self.code = dict(seen)

    def record(
        self,
        probed: dict[str, Probed],
        watch: Watch,
        held: dict[tuple[str, int], str],
        loaded: set[str] | None,
    ) -> str | None:
        """Keep the asking's answer (one call, `watch`'s): each tensor's copies and the
        writes of numbers, by the names `held` gives the model's tensors. None, or why it was
        not kept (code in no file that can be checked, or a folder that cannot be written)."""
        try:
            files = code_seen.files(self.code)
        except code_seen.NotInFiles as e:
            return f"its code is not all in files ({e})"
        rec = {
            "version": VERSION,
            "key": self.key,
            "code": files,
            "loaded": None if loaded is None else sorted(loaded),
            "tensors": {
                name: [_copy_record(c, held) for c in p.copies] for name, p in probed.items()
            },
            "fills": [
                [held[k], _name(dt), off, list(shape), list(stride), n]
                for k, dt, off, shape, stride, n in watch.fills
            ],
        }
        body = json.dumps(rec, separators=(",", ":")).encode()
        data = hashlib.sha256(body).hexdigest().encode() + b"\n" + body
        return None if write_atomic(self.path, data) else f"{self.root} cannot be written"


def plan_cache(
    context: Context | None,
    wanted: list[tuple[str, tuple[int, ...], torch.dtype]],
    modules: list[tuple[str, torch.nn.Module]],
    named: dict[str, torch.Tensor],
) -> PlanCache | None:
    """The plan cache of this load (None where the cache is off, or the server gave no
    context)."""
    root = folder() if context is not None else None
    if root is None or context is None:
        return None
    h = hashlib.sha256()
    with torch._C.DisableTorchFunctionSubclass():  # (a server's parameter types' own)
        tensors = [
            (n, type(t).__name__, t.dtype, t.device.type, t.shape, t.stride(), t.storage_offset())
            for n, t in named.items()
        ]
    spans: dict[str, tuple[torch.dtype, int, int]] = {}
    for n, _, dtype, _, shape, stride, first in tensors:
        end = first + sum((k - 1) * s for k, s in zip(shape, stride, strict=True)) + 1
        spans[n] = (dtype, int(first), int(end) if all(shape) else int(first))
    classes = {type(m) for _, m in modules} | {type(t) for t in named.values()}
    for part in (
        (VERSION, __version__, torch.__version__, sys.version, context),
        sorted(f"{c.__module__}.{c.__qualname__}" for c in classes),
        wanted,
        [(p, type(m).__name__) for p, m in modules],
        tensors,
    ):
        h.update(repr(part).encode())
        h.update(b"\0")
    return PlanCache(root, h.hexdigest()[:40], spans)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _copy_record(c: Copy, held: dict[tuple[str, int], str]) -> list:
    d = c.dst
    target = [held[storage_key(d)], _name(d.dtype), int(d.storage_offset())]
    return [*target, list(d.shape), c.offset, c.nbytes, None if c.rows is None else list(c.rows)]


def _remembered(
    rec: dict,
    key: str,
    named: dict[str, torch.Tensor],
    spans: dict[str, tuple[torch.dtype, int, int]],
    sizes: dict[str, int],
) -> Remembered | None:
    """The entry `rec` as views of the model's tensors; None where it is not this key's, its
    code changed, or one of its ranges reaches outside its tensor or its target's memory (an
    entry whole by its checksum and of this key holds none such: looked at all the same, as
    the read writes there)."""
    if rec["version"] != VERSION or rec["key"] != key or not code_seen.unchanged(rec["code"]):
        return None
    if set(rec["tensors"]) != set(sizes):
        return None
    memory = _Memory(named, spans)
    probed = {}
    for name, size in sizes.items():  # (in the output's order)
        p = probed[name] = Probed(name)
        for target, dt, off, shape, offset, nbytes, rows in rec["tensors"][name]:
            dst, dst_bytes = memory.view(target, dt, off, shape)
            if dst is None or not _within(offset, nbytes, rows, size, dst_bytes):
                return None
            p.copies.append(Copy(dst, offset, nbytes, None if rows is None else tuple(rows)))
    fills = []
    for target, dt, off, shape, stride, number in rec["fills"]:
        t = memory.strided(target, dt, off, shape, stride)
        if t is None or type(number) not in (int, float, bool):
            return None
        fills.append((t, number))
    loaded = rec["loaded"]
    if loaded is not None and not all(isinstance(n, str) for n in loaded):
        return None
    return Remembered(probed, fills, None if loaded is None else set(loaded))


class _Memory:
    """The memory of the model's tensors (`named`), viewed as an entry says (values of
    another type than an entry's make torch raise TypeError or RuntimeError). `spans`: each
    tensor's dtype and the elements of its memory it covers, first to past its last."""

    def __init__(
        self, named: dict[str, torch.Tensor], spans: dict[str, tuple[torch.dtype, int, int]]
    ) -> None:
        self._named, self._spans = named, spans
        self._flat: dict[tuple[str, str], tuple[torch.Tensor, int]] = {}

    def view(
        self, target: str, dt: str, off: int, shape: list[int]
    ) -> tuple[torch.Tensor | None, int]:
        """A flat view of `target`'s memory as dtype `dt` from element `off`, of `shape`'s
        elements, and its bytes; None where it would reach outside that memory."""
        numel = math.prod(shape)
        dtype, first, end = self._spans[target]
        if _DTYPES[dt] is dtype and first <= off and off + numel <= end:  # (within the tensor)
            with torch._C.DisableTorchFunctionSubclass():  # (a server's parameter types')
                return self._named[target].as_strided((numel,), (1,), off), numel * dtype.itemsize
        flat, count = self._of(target, dt)
        if off < 0 or off + numel > count:
            return None, 0
        return flat[off : off + numel], numel * flat.element_size()

    def strided(
        self, target: str, dt: str, off: int, shape: list[int], stride: list[int]
    ) -> torch.Tensor | None:
        flat, count = self._of(target, dt)
        if len(stride) != len(shape) or min((off, *shape, *stride)) < 0:
            return None
        last = off + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        if math.prod(shape) and last >= count:
            return None
        return flat.as_strided(shape, stride, off)

    def _of(self, target: str, dt: str) -> tuple[torch.Tensor, int]:
        """`target`'s whole memory as a flat tensor of dtype `dt`, and its length (KeyError:
        no such tensor or dtype)."""
        flat = self._flat.get((target, dt))
        if flat is None:
            base, dtype = self._named[target], _DTYPES[dt]
            with torch._C.DisableTorchFunctionSubclass():  # (a server's parameter types')
                storage = base.untyped_storage()
                count = storage.nbytes() // dtype.itemsize
                t = torch.empty(0, dtype=dtype, device=base.device)
                t.set_(storage, 0, (count,), (1,))
            flat = self._flat[(target, dt)] = (t, count)
        return flat


def _within(offset: int, nbytes: int, rows: list[int] | None, size: int, dst_bytes: int) -> bool:
    """A copy's source range inside its tensor's `size` bytes, of the bytes its target
    takes."""
    if offset < 0 or nbytes != dst_bytes:
        return False
    if rows is None:
        return offset + nbytes <= size
    n, row, step = rows
    return n > 0 and 0 < row <= step and n * row == nbytes and offset + (n - 1) * step + row <= size
