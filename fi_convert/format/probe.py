"""Where a model's own weight loading puts each byte of a checkpoint tensor, asked of the model.

Each tensor is handed to the model's `load_weights` as a probe: a tensor of the checkpoint
tensor's name, shape and dtype that holds no data. Its views (narrow, slice, split, view,
reshape, ...) are followed on a meta tensor, so a view knows which bytes of the checkpoint
tensor it is; a copy of a view into a tensor the model holds is recorded, not done. Whatever
else the model does with a probe (arithmetic, a dtype conversion, `.item()`, a transpose copied,
a copy into a temporary, an error it raises) stops the probe: that tensor must go through
`load_weights` with its data (where an error of the model's own comes again); so does a write
the model makes into a tensor it holds, beside the tensor's copy into it (vLLM's Inkling router
zeroes its padded weight, then copies the checkpoint's rows in: a read of those rows alone
would find the zeros written again when `load_weights` runs once more). So fused QKV,
stacked gate/up, renames and tensor-parallel row slices all come out as byte ranges of the file
into byte ranges of the model's parameters, as the model itself cut them, and are read there
directly; the rest is left to the model.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class _Stop(BaseException):  # noqa: N818 (not an error: it ends a probe, past any `except Exception`)
    """The model did something with a probe other than a view or a copy into its tensors;
    `involved`: the probes it did it with."""

    def __init__(self, what: str, involved: list[Probed] | None = None) -> None:
        super().__init__(what)
        self.involved = involved or []


@dataclass
class Copy:
    """`dst` (a contiguous view of a tensor the model holds) takes `nbytes` bytes of the
    checkpoint tensor from byte `offset` of its data; with `rows` = (n, size, stride), n rows
    of `size` bytes `stride` apart from there (a column slice: a row-parallel rank's)."""

    dst: torch.Tensor
    offset: int
    nbytes: int
    rows: tuple[int, int, int] | None = None


@dataclass
class Probed:
    """One checkpoint tensor's probe: its copies, or why it must be loaded with its data."""

    name: str
    copies: list[Copy] = field(default_factory=list)
    stopped: str | None = None  # the operation that stopped it
    refs: list[weakref.ref] = field(default_factory=list, repr=False)  # its probes and views

    @property
    def direct(self) -> bool:
        return self.stopped is None


class _Probe(torch.Tensor):
    """A data-less stand-in for a checkpoint tensor (or a view of one)."""

    meta: torch.Tensor
    probed: Probed

    @staticmethod
    def __new__(cls, meta: torch.Tensor, probed: Probed) -> _Probe:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            meta.shape,
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            device=torch.device("cpu"),
        )

    def __init__(self, meta: torch.Tensor, probed: Probed) -> None:
        self.meta, self.probed = meta, probed
        probed.refs.append(weakref.ref(self))

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"probe({self.probed.name}, {tuple(self.shape)}, {self.dtype})"

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is aten.copy_.default:
            return _record(*args, **kwargs)
        found = _probes_in(args, kwargs)
        probed = found[0]
        if len({id(p) for p in found}) != 1:
            raise _Stop("an operation on two checkpoint tensors", found)
        if getattr(func, "is_view", False):
            out = func(*_map(_meta, args), **_map(_meta, kwargs))
            return _map(lambda t: _Probe(t, probed) if isinstance(t, torch.Tensor) else t, out)
        raise _Stop(f"{func}", found)


def _meta(a: Any) -> Any:
    return a.meta if isinstance(a, _Probe) else a


def _map(fn: Callable[[Any], Any], obj: Any) -> Any:
    """`fn` over the leaves of an operator's arguments or results (tuples, lists and dicts of
    tensors and scalars): torch's pytree does the same, at several times the cost, which a
    tensor-parallel load pays for every slice of every tensor twice (probe and replay)."""
    if isinstance(obj, tuple | list):
        return type(obj)([_map(fn, o) for o in obj])
    if isinstance(obj, dict):
        return {k: _map(fn, v) for k, v in obj.items()}
    return fn(obj)


def _probes_in(args: Any, kwargs: Any) -> list[Probed]:
    found: list[Probed] = []
    _map(lambda a: found.append(a.probed) if isinstance(a, _Probe) else a, (args, kwargs))
    return found


def _record(dst: Any, src: Any, non_blocking: bool = False) -> Any:
    """`dst.copy_(src)`: recorded where `src` is a contiguous view of the probe of the same
    dtype and shape as `dst`, a contiguous tensor the model holds."""
    if isinstance(dst, _Probe) or not isinstance(src, _Probe):
        raise _Stop("a copy into a checkpoint tensor", _probes_in((dst, src), {}))
    meta = src.meta
    if dst.dtype != meta.dtype or dst.shape != meta.shape or dst.is_sparse:
        raise _Stop(f"a copy into {dst.dtype} {tuple(dst.shape)}")
    size = meta.element_size()
    rows = None
    if not meta.is_contiguous():  # rows of a column slice, else not a byte range
        if meta.dim() != 2 or meta.stride(1) != 1 or meta.stride(0) < meta.shape[1]:
            raise _Stop("a strided copy", [src.probed])
        rows = (int(meta.shape[0]), int(meta.shape[1]) * size, int(meta.stride(0)) * size)
    if not dst.is_contiguous():
        raise _Stop("a copy into a strided tensor", [src.probed])
    offset = int(meta.storage_offset()) * size
    src.probed.copies.append(Copy(dst, offset, meta.numel() * size, rows))
    return dst


def probe(
    load_weights: Callable[[Iterable[tuple[str, torch.Tensor]]], Any],
    tensors: Iterable[tuple[str, tuple[int, ...], torch.dtype]],
    owned: Callable[[torch.Tensor], bool],
) -> list[Probed]:
    """Probe each (name, shape, dtype) through `load_weights` (called as a server calls it:
    with an iterator, as often as needed). A copy counts only into a tensor `owned` accepts
    (the model's parameters and buffers); a probe the model keeps a reference to is stopped."""
    todo = list(tensors)
    done: list[Probed] = []
    while len(done) < len(todo):
        current: list[Probed] = []
        writes = _Writes(current, owned)
        try:
            with writes:
                load_weights(_probes(todo[len(done) :], current))
        except (_Stop, Exception) as e:  # (an error a probe caused: its data will tell)
            involved = e.involved if isinstance(e, _Stop) else []
            for p in [current[-1], *involved]:
                p.stopped = str(e) if isinstance(e, _Stop) else f"{type(e).__name__}: {e}"
            for p in current:  # maybe held for a later tensor of the interrupted call
                if p.direct and not p.copies:
                    p.stopped = "unused when the model's loading was interrupted"
        for p in current:
            if p.direct and not all(owned(c.dst) for c in p.copies):
                p.stopped = "a copy into a tensor the model does not hold"
            rewritten = [w for c in p.copies if (w := writes.into(p).get(_storage(c.dst)))]
            if p.direct and rewritten:
                p.stopped = f"a write into the tensor it is copied into ({rewritten[0]})"
            if p.direct and any(r() is not None for r in p.refs):
                p.stopped = "kept by the model"
            p.refs.clear()
        done += current
    return done


class _Writes(TorchDispatchMode):
    """The writes the model makes into the tensors it holds (`owned`) while each probe is the
    latest it was handed, other than a probe's copies: by probe, each written tensor's memory
    and the operation (a `zero_` of a padded parameter before the copy into its rows)."""

    def __init__(self, current: list[Probed], owned: Callable[[torch.Tensor], bool]) -> None:
        super().__init__()
        self.current, self.owned = current, owned
        self.made: dict[int, dict[tuple[str, int], str]] = {}

    def __torch_dispatch__(  # type: ignore[override]
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        copied = func is aten.copy_.default and isinstance(args[1], _Probe)
        if self.current and not copied and func._schema.is_mutable:
            for t in _written(func, args, kwargs):
                if not isinstance(t, _Probe) and t.device.type != "meta" and self.owned(t):
                    where = self.made.setdefault(id(self.current[-1]), {})
                    where.setdefault(_storage(t), str(func))
        return func(*args, **kwargs)

    def into(self, p: Probed) -> dict[tuple[str, int], str]:
        return self.made.get(id(p), {})


def _written(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors an operator writes into (its arguments marked written in its schema)."""
    out = []
    for k, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[k] if k < len(args) else kwargs.get(a.name)
        values = v if isinstance(v, list | tuple) else [v]
        out += [t for t in values if isinstance(t, torch.Tensor)]
    return out


def _storage(t: torch.Tensor) -> tuple[str, int]:
    return t.device.type, t.untyped_storage().data_ptr()


def _probes(
    todo: list[tuple[str, tuple[int, ...], torch.dtype]], current: list[Probed]
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, shape, dtype in todo:
        p = Probed(name)
        current.append(p)
        t = _Probe(torch.empty(shape, dtype=dtype, device="meta"), p)
        yield name, t
        del t


def replay(
    load_weights: Callable[[Iterable[tuple[str, torch.Tensor]]], Any],
    items: Iterable[tuple[str, torch.Tensor | tuple[tuple[int, ...], torch.dtype]]],
    seen: list[Probed] | None = None,
) -> str | None:
    """One call of `load_weights` over `items`: a tensor as it is, a (shape, dtype) as a probe
    whose copies do nothing (its bytes were put in place already), so that the model sees every
    name once, in order, with its tensors in place (what it does after its loop, such as
    SGLang's DeepSeek deriving its MLA weights, comes out right). None, or what stopped a probe
    (the model took a tensor otherwise than when it was probed). `seen` gets each probe's
    copies as the model made them in this call: a copy its loop makes after the last tensor
    from a tensor it kept (SGLang's LFM2-MoE ties lm_head to embed_tokens so) is made only in
    an uninterrupted call over every tensor, which probing cannot be where a tensor stops it."""
    try:
        load_weights(_stand_ins(items, [] if seen is None else seen))
    except _Stop as e:
        return f"{e.involved[0].name if e.involved else 'a tensor'}: {e}"
    return None


def _stand_ins(
    items: Iterable[tuple[str, torch.Tensor | tuple[tuple[int, ...], torch.dtype]]],
    seen: list[Probed],
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, t in items:
        if isinstance(t, torch.Tensor):
            yield name, t
        else:
            shape, dtype = t
            seen.append(Probed(name))
            yield name, _Probe(torch.empty(shape, dtype=dtype, device="meta"), seen[-1])
