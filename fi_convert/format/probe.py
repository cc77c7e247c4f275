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

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_ORDER = itertools.count()  # the order of the copies and writes a probing call sees
# writes whose bytes do not depend on what they write over: made again, they come out the same
_OVERWRITES = {aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.copy_.default}


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
    order: int = field(default_factory=lambda: next(_ORDER))  # of the copies and writes seen


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
            device=_CPU,
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


_CPU = torch.device("cpu")


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
    return [t.probed for t in _tensors(args, kwargs) if isinstance(t, _Probe)]


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
    watched: list[Watch] | None = None,
) -> list[Probed]:
    """Probe each (name, shape, dtype) through `load_weights` (called as a server calls it:
    with an iterator, as often as needed). A copy counts only into a tensor `owned` accepts
    (the model's parameters and buffers); a probe the model keeps a reference to is stopped,
    and so is one copied where the model wrote before, in this call or an earlier one (vLLM's
    Inkling router zeroes its padded weight, then copies the checkpoint's rows in): read
    directly, its bytes would be written over again when `load_weights` runs once more over
    every tensor. (A write after the copy, such as a multiplier folded in after the loop,
    comes out right then: it is made again on the bytes read.) `watched` gets what each call
    saw the model do with its own tensors (`Watch`)."""
    todo = list(tensors)
    # the probes' meta tensors made once, outside any call (where the watch would see them)
    metas = [torch.empty(shape, dtype=dtype, device="meta") for _, shape, dtype in todo]
    done: list[Probed] = []
    calls: list[Watch] = [] if watched is None else watched
    while len(done) < len(todo):
        current: list[Probed] = []
        watch = Watch(owned)
        calls.append(watch)
        try:
            with watch:
                load_weights(_probes(todo[len(done) :], metas[len(done) :], current))
        except (_Stop, Exception) as e:  # (an error a probe caused: its data will tell)
            watch.interrupted = True
            involved = e.involved if isinstance(e, _Stop) else []
            for p in [current[-1], *involved]:
                p.stopped = str(e) if isinstance(e, _Stop) else f"{type(e).__name__}: {e}"
            for p in current:  # maybe held for a later tensor of the interrupted call
                if p.direct and not p.copies:
                    p.stopped = "unused when the model's loading was interrupted"
        for p in current:
            if p.direct and not all(owned(c.dst) for c in p.copies):
                p.stopped = "a copy into a tensor the model does not hold"
            if p.direct and any(r() is not None for r in p.refs):
                p.stopped = "kept by the model"
            p.refs.clear()
        done += current
    for p in done:
        over = [w for c in p.copies for call in calls if (w := call.overlapping(c.dst, c.order))]
        if p.direct and over:
            p.stopped = f"a write into the tensor it is copied into ({over[0]})"
    return done


class Watch(TorchFunctionMode):
    """What the model does with the tensors it holds (`owned`) in one call, other than a
    probe's copies and views of them: each byte span it writes (a `zero_` of a padded
    parameter before the copy into its rows; vLLM's vocabulary embedding zeroes its padding
    rows after the copy into the others) and the first operation that reads one (`read`). A
    call that was not interrupted, read none of them and wrote nowhere a probe is copied into
    did all it does with them already: `format.dense` runs it no second time. Where it runs it
    again, `undo` first puts back what a write that reads the bytes it writes (an in-place
    `add_` or `mul_`: made twice, it would come out otherwise than once) found there.

    Each torch call the model makes comes here first; one that can neither read nor write a
    tensor's bytes (`_KINDS`: a view, the tensor's metadata, a probe's copy) is made as it is;
    every other is made under `_Ops`, which sees each operator it comes to. Most of a load's
    calls are views (`param.data`, a `narrow`); seen by a dispatch mode, each cost 10-15 us."""

    def __init__(self, owned: Callable[[torch.Tensor], bool]) -> None:
        super().__init__()
        self.owned = owned
        # (storage, first byte, end byte, operation, order)
        self.writes: list[tuple[tuple[str, int], int, int, str, int]] = []
        self.read: str | None = None
        self.interrupted = False
        self._found: list[tuple[torch.Tensor, torch.Tensor]] = []  # (written, its bytes before)
        # the writes that set bytes to a number (a `zero_`, a `fill_` of a scalar), each as
        # (storage, dtype, storage offset, shape, stride, number): made again without the model
        # (`plan_cache`); `other_write`: the first write of any other kind
        self.fills: list[tuple[tuple[str, int], torch.dtype, int, tuple, tuple, Any]] = []
        self.other_write: str | None = None
        self._ops = _Ops(self)

    def __torch_function__(  # type: ignore[override]
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kind = _KINDS.get(func)
        if kind is not None and not kwargs:
            # the two calls of nearly every tensor's loading are a probe's and made here, not
            # in torch's dispatch into Python (each costs as much again there): its `narrow`
            # (a view made on the meta tensor), its copy into a tensor (recorded; not where a
            # dispatch mode outside the asking is active: it would not see the copy)
            if kind is _NARROW:  # (a tensor's start is read: `.item()`)
                if not all(type(a) is int for a in args[1:]):
                    kind = _COPY
                elif type(args[0]) is _Probe:
                    return _Probe(args[0].meta.narrow(*args[1:]), args[0].probed)
                else:
                    kind = _VIEW
            elif (
                kind is _COPY
                and len(args) == 2
                and type(args[1]) is _Probe
                and type(args[0]) is not _Probe
                and _plain(type(args[0]))
                and not torch._C._len_torch_dispatch_stack()
            ):
                return _record(args[0], args[1])
            if kind is not _COPY and _own(args, kind):  # (_COPY: any copy but a probe's)
                return func(*args)
        with self._ops:
            return func(*args, **(kwargs or {}))

    def _op(self, func: Any, args: Any, kwargs: Any) -> None:
        """One operator the model's call came to: its writes into the tensors the model holds
        and whether it read one."""
        if func is aten.copy_.default and isinstance(args[1], _Probe):
            return
        if getattr(func, "is_view", False):
            return
        written = _written(func, args, kwargs) if func._schema.is_mutable else []
        for t in written:
            if self._held(t) and (span := _span(t)) is not None:
                self.writes.append((storage_key(t), *span, str(func), next(_ORDER)))
                if func not in _OVERWRITES:  # (in host memory: no more device memory)
                    self._found.append((t, t.detach().to("cpu", copy=True)))
                self._number(func, t, args)
        if self.read is None:
            mine = {id(t) for t in written}
            if any(id(t) not in mine and self._held(t) for t in _tensors(args, kwargs)):
                self.read = str(func)

    def _number(self, func: Any, t: torch.Tensor, args: Any) -> None:
        number = 0 if func is aten.zero_.default else None
        if func is aten.fill_.Scalar and type(args[1]) in (int, float, bool):
            number = args[1]
        if number is None:
            self.other_write = self.other_write or str(func)
            return
        geometry = (int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
        self.fills.append((storage_key(t), t.dtype, *geometry, number))

    def _held(self, t: torch.Tensor) -> bool:
        return not isinstance(t, _Probe) and t.device.type != "meta" and self.owned(t)

    def undo(self) -> None:
        """Put back the bytes that the writes which read them found, last first."""
        for t, was in reversed(self._found):
            t.copy_(was)
        self._found.clear()

    def overlapping(self, dst: torch.Tensor, before: int | None = None) -> str | None:
        """The operation of a write into any of `dst`'s bytes (made before the copy of order
        `before`, where given), or None."""
        if not self.writes:  # (most calls: every tensor only copied)
            return None
        span = _span(dst)
        if span is None:
            return None
        key, (first, end) = storage_key(dst), span
        return next(
            (
                op
                for k, a, b, op, at in self.writes
                if k == key and a < end and first < b and (before is None or at < before)
            ),
            None,
        )


class _Ops(TorchDispatchMode):
    """A `Watch`'s eye on the operators of one call of the model's that is not inert."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Not wrapped in torch's `_disable_dynamo`, as torch wraps a dispatch mode's
        __torch_dispatch__ unless the mode opts out so: the wrapper imports torch._dynamo at
        its first call, which was inside a process's first asking, and the import left the
        frame of the model's load_weights in a reference cycle. With the collector off
        through a load (`whole_read`), that frame kept the last probe it held alive, taken
        as kept by the model (read then with its data, the model called twice). The asking
        never runs under Dynamo."""
        return False

    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(  # type: ignore[override]
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        self.watch._op(func, args, kwargs)
        return func(*args, **kwargs)


# torch calls that neither read nor write a tensor's bytes (views and metadata), given plain
# tensors; a basic index; the calls a probe takes before the dispatch (`Watch`)
_VIEW, _INDEX, _NARROW, _COPY = 1, 2, 3, 4
_KINDS: dict[Any, int] = {
    **{
        getattr(torch.Tensor, name).__get__: _VIEW
        for name in ("data", "shape", "dtype", "device", "ndim", "layout", "is_cuda")
        + ("is_meta", "is_sparse", "requires_grad", "T", "mT")
    },
    **{
        getattr(torch.Tensor, name): _VIEW
        for name in ("view", "view_as", "size", "dim", "numel", "nelement", "stride")
        + ("storage_offset", "is_contiguous", "element_size", "select", "split", "chunk")
        + ("unbind", "unsqueeze", "squeeze", "transpose", "t", "permute", "detach", "expand")
        + ("as_strided", "data_ptr")
    },
    torch.split: _VIEW,
    torch.chunk: _VIEW,
    torch.transpose: _VIEW,
    torch.Tensor.__getitem__: _INDEX,
    torch.Tensor.narrow: _NARROW,
    torch.narrow: _NARROW,
    torch.Tensor.copy_: _COPY,
}
_PLAIN: dict[type, bool] = {torch.Tensor: True}  # a tensor type's calls are torch's own


def _plain(tp: type) -> bool:
    """Whether a tensor type's calls are torch's own: each __torch_function__ of its classes,
    in the order a call takes them, torch's disabled one (a Parameter's, a probe's) or one
    that only hands the call on (`_hands_on`: vLLM's parameter types'); any other could do
    anything."""
    plain = _PLAIN.get(tp)
    if plain is None:
        plain = _PLAIN[tp] = _calls_are_torchs(tp)
    return plain


def _calls_are_torchs(tp: type) -> bool:
    for c in tp.__mro__:
        f = c.__dict__.get("__torch_function__")
        if f is None:
            continue
        if f is torch._C._disabled_torch_function_impl:
            return True
        if not _hands_on(f):
            return False
    return False


class _HandsOn(torch.Tensor):
    """The two forms of a __torch_function__ that only hands each call on to the next one:
    `_hands_on` compares a type's with them, compiled by this Python."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs is None:
            kwargs = {}
        return super().__torch_function__(func, types, args, kwargs)

    @classmethod
    def bare(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs)


def _hands_on(f: Any) -> bool:
    """Whether `f` (a class's own __torch_function__) is one of `_HandsOn`'s: the same code,
    constants, names and defaults."""
    if not isinstance(f, classmethod):
        return False
    code, defaults = getattr(f.__func__, "__code__", None), getattr(f.__func__, "__defaults__", 0)
    return any(
        code is not None
        and (code.co_code, code.co_consts, code.co_names, code.co_varnames, code.co_freevars)
        == (ref.co_code, ref.co_consts, ref.co_names, ref.co_varnames, ref.co_freevars)
        and defaults == ((), None)
        for ref in _HANDS_ON
    )


_HANDS_ON = [_HandsOn.__dict__[name].__func__.__code__ for name in ("__torch_function__", "bare")]


def _own(args: Any, kind: int) -> bool:
    """Whether a view or metadata call (`kind`) of these arguments neither reads nor writes
    any tensor's bytes: its tensors of plain types, an index a basic one (ints and slices)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if not _plain(type(a)):
                return False
        elif type(a) in (list, tuple) and any(
            isinstance(t, torch.Tensor) and not _plain(type(t)) for t in a
        ):
            return False
    return kind is not _INDEX or (len(args) == 2 and _basic_index(args[1]))


def _basic_index(index: Any) -> bool:
    """An index that makes a view: ints, slices of ints, None and Ellipsis, or a tuple of
    them."""
    items = index if type(index) is tuple else (index,)
    for i in items:
        if type(i) is slice:
            if not all(type(v) in (int, type(None)) for v in (i.start, i.stop, i.step)):
                return False
        elif not (type(i) is int or i is None or i is Ellipsis):
            return False
    return True


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """The bytes of its storage a tensor covers, from its first element's to past its last
    (all between, for a strided one); None for an empty tensor."""
    if t.numel() == 0:
        return None
    size, first = t.element_size(), int(t.storage_offset())
    last = first + sum(int(n - 1) * int(s) for n, s in zip(t.shape, t.stride(), strict=True))
    return first * size, (last + 1) * size


def _tensors(args: Any, kwargs: Any) -> Iterator[torch.Tensor]:
    """The tensors among an operator's arguments, and in its lists of them (`cat`'s)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list | tuple):
            yield from (t for t in a if isinstance(t, torch.Tensor))


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


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """A tensor's memory: its device type and its storage's address (shared by its views;
    from the tensor's own address: no storage object made, a tenth of the cost)."""
    return t.device.type, t.data_ptr() - int(t.storage_offset()) * t.element_size()


def _probes(
    todo: list[tuple[str, tuple[int, ...], torch.dtype]],
    metas: list[torch.Tensor],
    current: list[Probed],
) -> Iterator[tuple[str, torch.Tensor]]:
    for (name, _, _), meta in zip(todo, metas, strict=True):
        p = Probed(name)
        current.append(p)
        with torch._C.DisableTorchFunction():  # (the Watch's: this is no call of the model's)
            t = _Probe(meta, p)
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
