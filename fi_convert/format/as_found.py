"""A model's modules as they were before it was asked where its tensors go (`dense`), and
whether its asking changed them.

What a model's loading does after its loop is done again when `DenseLoad.finish` calls it over
every tensor, and must find the model as a single load would: vLLM's Muse Spark folds its
router's output multiplier into the router's weight once, then sets the multiplier to None (a
second call would skip the fold of the bytes read meanwhile). So each module's attributes and
its parameters', buffers' and submodules' entries are copied before the asking and put back
after it, unless the asking stands as the load (`Found.keep`). Tensors' data is not kept: the
read overwrites what the model wrote into the tensors it holds.

Where the asking's answer may be kept for a later load (`plan_cache`), `Found.changed` says
what of the model it changed: a module's attribute, parameter, buffer or submodule, an
attribute of a tensor it holds, or an item of a list, dict or set among those attributes (each
compared by identity). The look is a few passes of the interpreter's own loops over every
module's dicts at once (`chain`, `map`), not a Python loop per module: a model of 681 modules
and 628 tensors (vLLM's Qwen3-MoE class at 48 layers, rank 0 of TP 8) holds about 25,000 such
items, looked at in 1.8 ms instead of 3.7 on a 2-core VM, and copied in 2.8 instead of 3.0
(docs/speed.md, the sixteenth session). Where that quick look finds any difference, even of
order alone, the item-by-item one says whether it is one and names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import chain, compress
from operator import gt, is_
from typing import Any

import torch

ENTRIES = ("_parameters", "_buffers", "_modules")  # (a module's dicts of its entries)
_HELD = (list, dict, set)  # the containers whose items are looked at


class Found:
    """The model's modules and (`look`) tensors as they were found; `changed` compares."""

    keep = False  # the model as the call left it, not as it was found

    def __init__(self, modules: list[torch.nn.Module], look: list[torch.Tensor] | None) -> None:
        self._modules, self._tensors = modules, look
        dicts = self._dicts()
        self._copies = list(map(dict, dicts))
        # the lists, dicts and sets among the modules' attributes (their entries aside: their
        # dicts are copied whole above) and the tensors', with their items
        n = len(modules)
        self._held = [] if look is None else _held(dicts[:n], ENTRIES) + _held(dicts[4 * n :])
        self._items = list(map(_items, self._held))

    def _dicts(self) -> list[dict[str, Any]]:
        """Every module's attributes, then their entries (three a module), then the tensors'
        attributes (where looked at)."""
        own = [m.__dict__ for m in self._modules]
        tensors = [t.__dict__ for t in self._tensors or ()]
        return own + [d.get(k, _GONE) for d in own for k in ENTRIES] + tensors

    def restore(self) -> None:
        """Each module's attributes and entries as they were found."""
        n = len(self._modules)
        for i, m in enumerate(self._modules):
            m.__dict__.clear()
            m.__dict__.update(self._copies[i])
            for k, was in zip(ENTRIES, self._copies[n + 3 * i : n + 3 * i + 3], strict=True):
                if (now := m.__dict__.get(k)) is not None:
                    now.clear()
                    now.update(was)

    def changed(self) -> str | None:
        """What of the model is not as it was found (with `look`): its module, or an attribute
        of one of its tensors; None where nothing is."""
        now = self._dicts()
        if self._same(now):
            return None
        n = len(self._modules)
        for i, (was, d) in enumerate(zip(self._copies, now, strict=True)):
            if d.keys() != was.keys() or any(d[k] is not v for k, v in was.items()):
                return self._where(i if i < n else (i - n) // 3 if i < 4 * n else i - 3 * n)
        for v, held in zip(self._held, self._items, strict=True):
            if len(c := _items(v)) != len(held) or not all(map(is_, c, held)):
                owners = now[:n] + now[4 * n :]
                return self._where(next(i for i, d in enumerate(owners) if _holds(d, v)))
        return None

    def _same(self, now: list[dict[str, Any]]) -> bool:
        """Whether every dict holds the same keys, in the same order, of the same objects, and
        every list, dict and set the same items (a quick look: False may be order alone)."""
        was = self._copies
        if list(map(len, now)) != list(map(len, was)):
            return False
        if not all(map(is_, chain.from_iterable(now), chain.from_iterable(was))) and list(
            chain.from_iterable(now)
        ) != list(chain.from_iterable(was)):
            return False
        if not all(map(is_, _values(now), _values(was))):
            return False
        items = list(map(_items, self._held))
        return list(map(len, items)) == list(map(len, self._items)) and all(
            map(is_, chain.from_iterable(items), chain.from_iterable(self._items))
        )

    def _where(self, i: int) -> str:
        """The thing of the model at index `i` of its modules, then tensors."""
        if i < len(self._modules):
            return f"its {type(self._modules[i]).__name__} module"
        return "an attribute of one of its tensors"


_GONE: dict[str, Any] = {}  # (an entry's dict a module no longer has: empty, and never changed)


def _held(dicts: list[dict[str, Any]], skip: tuple[str, ...] = ()) -> list[Any]:
    """The lists, dicts and sets among the values of `dicts` but those of the keys `skip`, in
    the interpreter's own loops."""
    held, skipped = frozenset(_HELD).__contains__, frozenset(skip).__contains__
    chosen = map(gt, map(held, map(type, _values(dicts))), map(skipped, chain.from_iterable(dicts)))
    return list(compress(_values(dicts), chosen))  # (True > False: held, not skipped)


def _values(dicts: list[dict[str, Any]]) -> Iterator[Any]:
    return chain.from_iterable(map(dict.values, dicts))


def _holds(d: dict[str, Any], v: Any) -> bool:
    return any(x is v for x in d.values())


def _items(v: list | dict | set) -> list:
    """A container's items, a dict's keys and values one after the other."""
    return [*chain.from_iterable(v.items())] if type(v) is dict else [*v]


@contextlib.contextmanager
def as_found(
    modules: list[torch.nn.Module], look: list[torch.Tensor] | None = None
) -> Iterator[Found]:
    """The model's `modules` put back as they were found once the block ends, unless it sets
    `keep` (and on any exception); with `look` (the model's tensors), `changed` can say what
    the block changed."""
    found = Found(modules, look)
    try:
        yield found
    except BaseException:
        found.keep = False
        raise
    finally:
        if not found.keep:
            found.restore()
