"""fi_convert/format/probe.py and dense.py: where a model's own loading puts each byte of the
output's non-expert tensors, asked of it with data-less probes; those it only copies read
straight into its tensors, the rest handed to it with their data. (Whole models of both
servers' own classes: tests/test_vllm_models.py, tests/test_sglang_models.py.)"""

from __future__ import annotations

import contextlib
import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from fi_convert import Backend, Options, SchemeName, child_read, convert
from fi_convert.bulk_read import ReadError
from fi_convert.errors import FiConvertError
from fi_convert.format import dense, manifest, whole_read
from fi_convert.format.dense import DenseLoad
from fi_convert.format.probe import probe
from fi_convert.format.reader import OutputReader
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import files_open, reader_threads

SPEC = Spec("deepseek-v3", layers=3, dense_layers=1, experts=8, quant="fp8-block", vocab=512)
F32 = torch.float32


# -- the probe: what the model does with a tensor ------------------------------------------


class Toy:
    """A model's loading in miniature: a fused QKV parameter, a TP rank's row slice, a plain
    copy, a scalar read with .item(), a transposed copy, a tensor kept, two tensors joined."""

    def __init__(self) -> None:
        self.qkv = torch.zeros(12, 4)
        self.rows = torch.zeros(3, 4)
        self.cols = torch.zeros(6, 2)
        self.plain = torch.zeros(6, 4)
        self.kept: list[torch.Tensor] = []
        self.held: dict[str, torch.Tensor] = {}

    def owned(self, t: torch.Tensor) -> bool:
        mine = (self.qkv, self.rows, self.cols, self.plain)
        return t.untyped_storage().data_ptr() in {m.untyped_storage().data_ptr() for m in mine}

    def load_weights(self, weights) -> None:
        for name, t in weights:
            if name == "q":
                self.qkv[:6].copy_(t)
            elif name == "k":  # two halves into two places
                self.qkv.narrow(0, 6, 3).copy_(t[:3])
                self.qkv.narrow(0, 9, 3).copy_(t.narrow(0, 3, 3))
            elif name == "rank1":  # rank 1 of 2 keeps rows 3..5
                self.rows.copy_(t.narrow(0, 3, 3))
            elif name == "columns":  # a row-parallel rank 1 of 2 keeps columns 2..3
                self.cols.copy_(t.narrow(1, 2, 2))
            elif name == "plain":
                self.plain.data.copy_(t)
            elif name == "scalar":
                self.plain[0, 0] = t.item()
            elif name == "transposed":
                self.plain.copy_(t.t())
            elif name == "kept":
                self.kept.append(t[1:])
            elif name == "temporary":
                torch.empty(6, 4).copy_(t)
            elif name == "numpy":  # (a probe has no data to give)
                self.plain.copy_(torch.from_numpy(t.numpy()))
            elif name == "padded":  # zeroed whole, then the tensor's rows copied in (vLLM's
                # Inkling router weight, padded to a multiple of 8 rows)
                self.plain.zero_()
                self.plain[:3].copy_(t)
            elif name == "after":  # copied in, then scaled in place (a different write)
                self.rows.copy_(t.narrow(0, 3, 3))
                self.cols.mul_(2)
            elif name in ("a", "b"):  # a held until b comes, then both joined
                self.held[name] = t
                if len(self.held) == 2:
                    self.qkv.copy_(torch.cat([self.held.pop("a"), self.held.pop("b")]))


def _probe(toy: Toy, names: list[str], shape=(6, 4)) -> dict:
    shapes = {"scalar": (1,), "transposed": (4, 6), "a": (6, 4), "b": (6, 4), "padded": (3, 4)}
    return {
        p.name: p
        for p in probe(toy.load_weights, [(n, shapes.get(n, shape), F32) for n in names], toy.owned)
    }


def test_copies_become_byte_ranges_of_the_tensor_into_the_models_own():
    toy = Toy()
    got = _probe(toy, ["q", "k", "rank1", "columns", "plain", "unused"])
    assert all(p.direct for p in got.values())
    (cols,) = got["columns"].copies  # 6 rows of 2 floats, a row (4 floats) apart, from col 2
    assert (cols.offset, cols.nbytes, cols.rows) == (2 * 4, 12 * 4, (6, 2 * 4, 4 * 4))
    assert cols.dst.data_ptr() == toy.cols.data_ptr()
    ranges = {
        n: [(c.offset, c.nbytes, c.dst.data_ptr()) for c in p.copies]
        for n, p in got.items()
        if n != "columns"
    }
    q, row = toy.qkv.data_ptr(), 4 * 4
    assert ranges["q"] == [(0, 6 * row, q)]
    assert ranges["k"] == [(0, 3 * row, q + 6 * row), (3 * row, 3 * row, q + 9 * row)]
    assert ranges["rank1"] == [(3 * row, 3 * row, toy.rows.data_ptr())]  # its rows only
    assert ranges["plain"] == [(0, 6 * row, toy.plain.data_ptr())]
    assert ranges["unused"] == []  # the model skips it: not read at all
    assert not toy.qkv.any() and not toy.plain.any()  # nothing was written


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("scalar", "_local_scalar_dense"),
        ("transposed", "a strided copy"),
        ("kept", "kept by the model"),
        ("temporary", "a tensor the model does not hold"),
        ("numpy", "RuntimeError"),
    ],
)
def test_anything_but_a_copy_leaves_the_tensor_to_the_model(name, why):
    got = _probe(Toy(), ["q", name, "plain"])
    assert not got[name].direct and why in got[name].stopped
    assert got["q"].direct and got["plain"].direct  # the others: probed on, in later calls


def test_a_write_into_the_tensor_it_is_copied_into_leaves_it_to_the_model():
    """A parameter the model zeroes and then copies the tensor's rows into (vLLM's Inkling
    router, padded to 8 rows): read directly, its rows would be zeroed again when load_weights
    runs once more over every tensor, so the tensor goes with its data; and so does a later
    tensor copied into the bytes that zeroing wrote ("plain", after "padded"). A write into
    another tensor than the one copied into, or after the copy, leaves the copy direct."""
    got = _probe(Toy(), ["q", "padded", "after", "plain"])
    assert not got["padded"].direct and "aten.zero_" in got["padded"].stopped
    assert not got["plain"].direct and "aten.zero_" in got["plain"].stopped
    assert got["after"].direct and got["q"].direct
    got = _probe(Toy(), ["plain", "padded"])  # zeroed after its copy: the second call redoes it
    assert got["plain"].direct and not got["padded"].direct


def test_a_write_outside_the_rows_copied_leaves_the_copy_direct():
    """vLLM's vocabulary embedding copies the rank's rows, then zeroes the padding rows after
    them (an empty slice where there are none): no byte of the copy is written."""

    class Embedding(Toy):
        def load_weights(self, weights) -> None:
            for _name, t in weights:
                self.plain[:4].copy_(t)
                self.plain[4:].fill_(0)
                self.rows[3:].fill_(0)  # (empty)

    got = _probe(Embedding(), ["embed"], shape=(4, 4))
    assert got["embed"].direct


def test_tensors_the_model_joins_are_both_left_to_it():
    """A tensor held for a later one (SGLang's DeepSeek fuses q_a_proj with
    kv_a_proj_with_mqa so) is left to the model with it, not taken for one it skips."""
    got = _probe(Toy(), ["a", "q", "b", "plain"])
    assert not got["a"].direct and not got["b"].direct
    assert got["q"].direct and got["plain"].direct


class Sneaky(torch.nn.Parameter):
    """A parameter type of a model's own whose views write (vLLM's and SGLang's parameter
    types have a __torch_function__ of their own too): its calls are no mere views."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.narrow:
            with torch._C.DisableTorchFunctionSubclass():
                args[0].add_(1)
        return super().__torch_function__(func, types, args, kwargs or {})


class HandsOn(torch.nn.Parameter):
    """A parameter type whose __torch_function__ only hands each call on (vLLM's form)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        return super().__torch_function__(func, types, args, kwargs)


class HandsOnToSneaky(Sneaky):
    """Hands each call on, to a parameter type's that writes."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        return super().__torch_function__(func, types, args, kwargs)


class Tallies(HandsOn):
    """Hands each call on, in code of its own that does more (counts them)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Tallies.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_type_counts_as_torchs_own_only_where_each_call_it_takes_is():
    """The watch lets a view of a parameter type through unseen only where every
    __torch_function__ of its classes is torch's disabled one or only hands the call on."""
    from fi_convert.format.probe import _plain

    assert _plain(torch.nn.Parameter) and _plain(HandsOn)
    assert not _plain(Sneaky) and not _plain(HandsOnToSneaky) and not _plain(Tallies)


@pytest.mark.parametrize(
    ("call", "read", "wrote"),
    [
        # views, metadata and a basic index: neither a read nor a write
        (lambda toy: (toy.plain.data.narrow(0, 1, 2).t(), toy.plain.shape, toy.qkv[1:, 0]), 0, 0),
        (lambda toy: toy.qkv[torch.tensor([0, 2])], "aten.index", 0),  # a gather reads
        (lambda toy: toy.qkv[[0, 2]], "aten.index", 0),
        (lambda toy: toy.rows[1:].fill_(1), 0, "aten.fill_"),  # a write through a view
        (lambda toy: toy.plain.data.reshape(-1).sum(), "aten.sum", 0),
        (lambda toy: Sneaky(toy.cols, requires_grad=False).narrow(0, 0, 1), 0, "aten.add_"),
        (lambda toy: HandsOnToSneaky(toy.cols, False).narrow(0, 0, 1), 0, "aten.add_"),
        (lambda toy: HandsOn(toy.plain, requires_grad=False).data.narrow(0, 0, 1), 0, 0),
    ],
)
def test_the_watch_sees_each_read_and_write_of_the_models_tensors(call, read, wrote):
    """The asking lets views, metadata and basic indexing of the model's tensors through
    unwatched (most of a load's calls: `param.data`, a `narrow`); any other call, and any call
    on a tensor type with a __torch_function__ of its own, is watched at torch's operators."""

    class Calls(Toy):
        def load_weights(self, weights) -> None:
            for _name, t in weights:
                self.plain.copy_(t)
                call(self)

    toy, calls = Calls(), []
    got = probe(toy.load_weights, [("plain", (6, 4), F32)], toy.owned, calls)
    assert got[0].direct and len(calls) == 1
    assert _op_named(calls[0].read, read)
    assert _op_named(calls[0].writes[0][3] if calls[0].writes else None, wrote)


def _op_named(seen: str | None, want: str | int) -> bool:
    """`seen` (an operator's name, or None) is `want`'s (0: none)."""
    return seen is None if want == 0 else seen is not None and seen.startswith(want)


def test_a_dispatch_mode_around_the_asking_sees_its_copies():
    """A probe's copy is recorded before torch's dispatch, unless a dispatch mode is active
    around the asking (SGLang counts the elements a load copies with one): it sees them as
    before."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Copies.n += func is torch.ops.aten.copy_.default
            return func(*args, **(kwargs or {}))

    toy = Toy()
    with Copies():
        got = _probe(toy, ["q", "k", "plain"])
    assert Copies.n == sum(len(p.copies) for p in got.values()) == 4
    assert all(p.direct for p in got.values())


# -- the load: a model's parameters filled from an output ----------------------------------


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    src = write_checkpoint(tmp_path_factory.mktemp("dense-src") / "ds", SPEC)
    out = tmp_path_factory.mktemp("dense-out") / "ds-fi"
    convert(src, out, Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 2), device="cpu")
    return out


def _stored(out) -> dict[str, torch.Tensor]:
    """Every non-expert tensor of the output, as safetensors itself loads it."""
    with OutputReader(out) as reader:
        want = {}
        for shard in reader.shards():
            with safe_open(out / shard, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118
                    if not reader.is_expert_tensor(name):
                        want[name] = f.get_tensor(name)
    return want


class Plain(torch.nn.Module):
    """A parameter per tensor, copied whole; those named in `convert` held in another dtype
    (FP32, or BF16 for FP32: which leaves them to the model, with their data); `keep` kept as
    it comes."""

    def __init__(self, stored: dict[str, torch.Tensor], convert=(), keep="") -> None:
        super().__init__()
        self.names = {n: n.replace(".", "__") for n in stored}
        for n, t in stored.items():
            other = torch.bfloat16 if t.dtype == F32 else F32
            like = torch.zeros(t.shape, dtype=other if n in convert else t.dtype)
            self.register_parameter(self.names[n], torch.nn.Parameter(like, requires_grad=False))
        self.keep, self.kept = keep, {}
        self.last: list[str] = []

    def load_weights(self, weights):
        self.last = []
        for n, t in weights:
            self.last.append(n)
            if n == self.keep:
                self.kept[n] = t
            getattr(self, self.names[n]).data.copy_(t)  # (converted where the dtypes differ)
        return set(self.names)


def _load(out, model, monkeypatch=None, batch=None, load_weights=None, context=None):
    """The output's non-expert tensors into `model` on this CPU (through `load_weights`, the
    model's own by default; with the plan cache where `context` is given)."""
    asked = model.load_weights if load_weights is None else load_weights
    with OutputReader(out) as reader:
        d = DenseLoad(reader, model, asked, torch.device("cpu"), context=context)
        bulk = reader.bulk("cpu")
        d.add_to(bulk)
        bulk.start()
        d.prefetch()
        bulk.wait()
        d.finish()
    return d


def test_every_tensor_lands_as_the_models_own_loading_puts_it(out):
    stored = _stored(out)
    assert len(stored) > 10 and any(t.dtype == torch.float8_e4m3fn for t in stored.values())
    biases = [n for n in stored if n.endswith("e_score_correction_bias")]
    model = Plain(stored, convert=biases, keep="lm_head.weight")
    d = _load(out, model)
    assert sorted(d.rest) == sorted([*biases, "lm_head.weight"])
    for n, t in stored.items():
        got = getattr(model, model.names[n])
        assert torch.equal(got, t.to(got.dtype)), n
    assert d.direct_bytes + d.rest_bytes == sum(
        t.numel() * t.element_size() for t in stored.values()
    )
    # the model's load_weights saw every tensor once more, in order, with the bytes in place
    assert model.last == list(d.infos) and sorted(model.last) == sorted(stored)
    assert set(model.names) <= d.loaded  # (what it returned, and the parameters filled)


class Silent(Plain):
    """Plain, whose load_weights returns nothing (vLLM's NemotronH_Nano_VL_V2 does so)."""

    def load_weights(self, weights):
        super().load_weights(weights)


def test_a_model_that_says_nothing_of_what_it_loaded_is_untracked(out):
    """vLLM's own loader checks the parameters a model's load_weights returns and nothing where
    it returns None; DenseLoad says which (`untracked`), the load itself the same."""
    stored = _stored(out)
    said, silent = _load(out, Plain(stored)), _load(out, model := Silent(stored))
    assert not said.untracked and silent.untracked
    for n, t in stored.items():
        got = getattr(model, model.names[n])
        assert torch.equal(got, t.to(got.dtype)), n


class Tied(Plain):
    """Plain, with an lm_head that its loading ties to the embedding after its loop, from the
    tensor it kept of it (SGLang's LFM2-MoE does so)."""

    EMBED = "model.embed_tokens.weight"

    def __init__(self, stored: dict[str, torch.Tensor], convert=()) -> None:
        super().__init__(stored, convert)
        like = torch.zeros(stored[self.EMBED].shape, dtype=stored[self.EMBED].dtype)
        self.tied = torch.nn.Parameter(like, requires_grad=False)

    def load_weights(self, weights):
        embed = None
        for n, t in weights:
            self.last.append(n)
            if n == self.EMBED:
                embed = t
            getattr(self, self.names[n]).data.copy_(t)
        if embed is not None:
            self.tied.data.copy_(embed)
        return set(self.names) | {"tied"}


def test_a_copy_the_model_makes_after_its_loop_lands_too(out):
    """A tensor the model copies once more after its loop (a tied lm_head) from the tensor it
    kept: probing, interrupted by a later tensor it leaves to the model (a bias it converts),
    never sees that copy; the one uninterrupted call over every tensor makes it, and the load
    reads it there."""
    stored = _stored(out)
    biases = [n for n in stored if n.endswith("e_score_correction_bias")]
    order = list(stored)
    assert order.index(Tied.EMBED) < max(order.index(b) for b in biases)  # interrupted after
    model = Tied(stored, convert=biases)
    d = _load(out, model)
    assert d.probed[Tied.EMBED].direct and len(d.probed[Tied.EMBED].copies) == 1
    assert torch.equal(model.tied, stored[Tied.EMBED])
    assert torch.equal(getattr(model, model.names[Tied.EMBED]), stored[Tied.EMBED])
    assert "tied" in d.loaded


class FoldsOnce(Plain):
    """Plain, whose loading ends by folding a multiplier into one parameter once, then drops
    the multiplier, and by replacing another parameter with a derived one (vLLM's Muse Spark
    folds its router's output multiplier so; SGLang's DeepSeek derives its MLA weights)."""

    def __init__(self, stored: dict[str, torch.Tensor], folded: str, derived: str) -> None:
        super().__init__(stored)
        self.folded, self.derived = self.names[folded], self.names[derived]
        self.multiplier: float | None = 2.0
        self.loads = 0

    def load_weights(self, weights):
        names = super().load_weights(weights)
        if self.multiplier is not None:
            getattr(self, self.folded).data.mul_(self.multiplier)
            self.multiplier = None
        twice = getattr(self, self.derived).data * 2
        setattr(self, self.derived, torch.nn.Parameter(twice, requires_grad=False))
        self.loads += 1
        return names


def test_what_the_model_does_after_its_loop_is_done_once_on_the_bytes_read(out):
    """Asking the model runs its loading over probes, after-loop code included; the model is
    left as it was found, so that the one call over every tensor with its bytes in place does
    what a single load does: the multiplier folded once into the bytes read, the derived
    parameter derived once from them."""
    stored = _stored(out)
    plain = [n for n, t in stored.items() if t.dtype == torch.bfloat16 and t.dim() == 2]
    folded, derived = plain[0], plain[1]
    model = FoldsOnce(stored, folded, derived)
    d = _load(out, model)
    assert d.probed[folded].direct and d.probed[derived].direct
    assert model.loads == 1  # (the asking's calls left no trace)
    assert torch.equal(getattr(model, model.folded), stored[folded] * 2)
    assert torch.equal(getattr(model, model.derived), stored[derived] * 2)
    assert model.multiplier is None


class ZeroesAhead(Plain):
    """Plain, whose loading zeroes a later tensor's parameter when an earlier tensor comes (a
    padded parameter zeroed whole before its rows are copied in, one tensor ahead)."""

    def __init__(self, stored: dict[str, torch.Tensor], when: str, zeroed: str) -> None:
        super().__init__(stored)
        self.when, self.zeroed = when, self.names[zeroed]

    def load_weights(self, weights):
        def each():
            for n, t in weights:
                if n == self.when:
                    getattr(self, self.zeroed).data.zero_()
                yield n, t

        return super().load_weights(each())


def test_a_tensor_copied_where_the_model_wrote_before_lands_as_a_load_puts_it(out):
    """The zeroing comes before the later tensor's copy: in a load, its bytes win. Read
    directly, they would be zeroed again by the second call over every tensor (the load
    before this fix left that parameter zero); it goes with its data."""
    stored = _stored(out)
    names = [n for n, t in stored.items() if t.dim() == 2]
    model = ZeroesAhead(stored, names[0], names[-1])
    d = _load(out, model)
    assert names[-1] in d.rest and d.again
    for n, t in stored.items():
        got = getattr(model, model.names[n])
        assert torch.equal(got, t.to(got.dtype)), n


class Padded(Plain):
    """Plain, with one parameter two rows longer than its tensor: the loading copies the
    tensor's rows and zeroes the two after them (vLLM's vocabulary embedding and head); it
    counts its calls."""

    def __init__(self, stored: dict[str, torch.Tensor], padded: str) -> None:
        super().__init__(stored)
        t = stored[padded]
        self.padded = self.names[padded]
        like = torch.full((t.shape[0] + 2, *t.shape[1:]), 7, dtype=t.dtype)
        setattr(self, self.padded, torch.nn.Parameter(like, requires_grad=False))
        self.calls = 0

    def load_weights(self, weights):
        self.calls += 1
        self.last = []
        for n, t in weights:
            self.last.append(n)
            dst = getattr(self, self.names[n]).data
            if self.names[n] == self.padded:
                dst[: t.shape[0]].copy_(t)
                dst[t.shape[0] :].fill_(0)
            else:
                dst.copy_(t)
        return set(self.names)


def test_a_call_that_only_copied_is_the_load_and_is_not_made_again(out):
    """Asked in one call that only copied every tensor and wrote elsewhere (the padding
    rows), the model's load_weights is not called again: the read puts the bytes in place,
    the padding stays as that call zeroed it, and what it said it loaded counts."""
    stored = _stored(out)
    embed = "model.embed_tokens.weight"
    model = Padded(stored, embed)
    d = _load(out, model)
    assert not d.again and d.rest == [] and model.calls == 1
    got = getattr(model, model.padded)
    assert torch.equal(got[:-2], stored[embed]) and not got[-2:].float().any()
    for n, t in stored.items():
        assert n == embed or torch.equal(getattr(model, model.names[n]), t), n
    assert set(model.names) <= d.loaded and model.last == list(d.infos)


def test_a_kept_batch_is_left_to_the_model_and_the_blocks_stay_few(out, monkeypatch):
    """A batch per tensor: the one the model keeps a view of is never refilled, and the
    blocks stay at the ring's size however many batches pass."""
    made = []
    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        if k.get("dtype") is torch.uint8 and "pin_memory" in k:
            made.append(t.numel())
        return t

    stored = _stored(out)
    norms = [n for n in stored if n.endswith("norm.weight")]
    keep = norms[1]
    model = Plain(stored, convert=norms, keep=keep)
    one = max(stored[n].numel() * stored[n].element_size() for n in norms)
    monkeypatch.setattr(dense, "BATCH", one)
    with monkeypatch.context() as m:
        m.setattr(torch, "empty", empty)
        d = _load(out, model)
    assert sorted(d.rest) == sorted(norms) and len(norms) > dense.RING + 2
    assert torch.equal(model.kept[keep], stored[keep])  # not refilled by a later batch
    assert len(made) == dense.RING + 1  # one more block, in place of the kept one


@pytest.mark.parametrize("when", ["before the load", "after the headers were read"])
def test_a_truncated_shard_is_one_line_naming_it(out, tmp_path, when):
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    stored = _stored(copy)
    with OutputReader(copy) as reader:
        shard = copy / reader.shards()[-1]

        def cut():
            with open(shard, "r+b") as f:
                f.truncate(shard.stat().st_size // 2)

        model = Plain(stored)
        with pytest.raises(FiConvertError) as e:
            if when == "before the load":
                cut()
            d = DenseLoad(reader, model, model.load_weights, torch.device("cpu"))
            cut()
            bulk = reader.bulk("cpu")
            d.add_to(bulk)
            bulk.start()
    msg = str(e.value)
    assert msg.startswith(f"{shard}: ") and "\n" not in msg and "truncated" in msg


def test_a_dtype_torch_cannot_hold_is_one_line(out, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    with OutputReader(copy) as reader:
        name = "model.norm.weight"
        info = reader.header(
            json.loads((copy / "model.safetensors.index.json").read_text())["weight_map"][name]
        )[name]
        object.__setattr__(info, "dtype", "F4")  # (as a header of a newer format would say)
        with pytest.raises(ReadError) as e:
            dense.dtypes_of(info)
    msg = str(e.value)
    assert msg.startswith(f"{info.file}: tensor {name} has dtype F4") and "\n" not in msg


def test_ctrl_c_in_a_batch_read_stops_its_threads(out, monkeypatch):
    from fi_convert import bulk_read

    stored = _stored(out)
    model = Plain(stored, convert=[n for n in stored if n.endswith("norm.weight")])
    real = bulk_read.BulkRead.wait

    def wait(self):
        raise KeyboardInterrupt

    with OutputReader(out) as reader:
        d = DenseLoad(reader, model, model.load_weights, torch.device("cpu"))
        d.prefetch()
        monkeypatch.setattr(bulk_read.BulkRead, "wait", wait)
        with pytest.raises(KeyboardInterrupt):
            d.finish()
        d.abort()
        monkeypatch.setattr(bulk_read.BulkRead, "wait", real)
    assert not reader_threads()


def test_an_error_of_the_models_own_comes_out_of_the_load(out):
    """A probe that makes the model raise is loaded with its data; where the model raises
    then too (its own error, as with its default load), the load ends with that error."""
    stored = _stored(out)

    class Strict(Plain):
        def load_weights(self, weights):
            for n, t in weights:
                if n == "model.norm.weight":
                    raise ValueError(f"no parameter for {n}")
                getattr(self, self.names[n]).data.copy_(t)
            return set()

    model = Strict(stored)
    with pytest.raises(ValueError, match="no parameter for model.norm.weight"):
        _load(out, model)


@pytest.mark.gpu
def test_on_a_gpu_every_tensor_lands_and_the_batches_are_pinned_within_the_budget(out):
    """Into a model on CUDA: the direct copies through the bulk read's pinned buffers, the
    others in pinned batches within the host memory left to them; then equal to the CPU's."""
    stored = _stored(out)
    norms = [n for n in stored if n.endswith("norm.weight")]
    model = Plain(stored, convert=norms).cuda()
    with OutputReader(out) as reader:
        d = DenseLoad(reader, model, model.load_weights, torch.device("cuda"), 32 << 20)
        bulk = reader.bulk("cuda")
        d.add_to(bulk)
        bulk.start()
        d.prefetch()
        bulk.wait()
        d.finish()
    assert sorted(d.rest) == sorted(norms) and 0 < d.pinned_bytes <= 32 << 20
    for n, t in stored.items():
        got = getattr(model, model.names[n]).cpu()
        assert torch.equal(got, t.to(got.dtype)), n


class ScaledAfter(Padded):
    """Padded, whose loading ends by scaling one parameter in place (a multiplier folded in
    after the loop): a write after the copy, made again on the bytes read."""

    def __init__(self, stored: dict[str, torch.Tensor], padded: str, scaled: str) -> None:
        super().__init__(stored, padded)
        self.scaled = self.names[scaled]

    def load_weights(self, weights):
        names = super().load_weights(weights)
        getattr(self, self.scaled).data.mul_(2)
        return names


class Counts(Plain):
    """Plain, whose loading ends by adding one to a buffer it holds (a write that reads what
    it writes over), and that converts one tensor (so its loading runs a second time)."""

    def __init__(self, stored: dict[str, torch.Tensor], convert) -> None:
        super().__init__(stored, convert=convert)
        self.register_buffer("loads", torch.zeros(1))

    def load_weights(self, weights):
        names = super().load_weights(weights)
        self.loads.add_(1)
        return names


def test_a_write_that_reads_what_it_writes_is_made_once(out):
    """Asking the model makes its writes; where its loading runs a second time, what a write
    that reads its own bytes found is put back first, so that it comes out as one load's."""
    stored = _stored(out)
    norms = [n for n in stored if n.endswith("norm.weight")]
    model = Counts(stored, convert=norms[:1])
    d = _load(out, model)
    assert d.again and model.loads.item() == 1
    for n, t in stored.items():
        got = getattr(model, model.names[n])
        assert torch.equal(got, t.to(got.dtype)), n


def _whole(out, model, device: str) -> DenseLoad:
    """A layer's experts and the model's tensors read at once, as a server's plugin reads an
    output (`format.whole_read`: what it sets up while the server builds the model first); the
    experts' bytes checked against a read of their own."""
    m = manifest.read(out)
    ahead = whole_read.Ahead(device, (out, m))  # (the output opened while it is built, too)
    try:
        with whole_read.open_output(ahead, out, m) as reader:
            prefix = next(iter(reader.layers))
            name = next(iter(reader.layer(prefix)["tensors"]))
            _, shape, dtype = reader.info(prefix, name)
            got = torch.empty(shape, dtype=dtype, device=device)
            read = whole_read.read_whole(
                whole_read.new_read(ahead, reader, device),
                lambda bulk: reader.read_into(prefix, name, 0, got, bulk),
                lambda: DenseLoad(reader, model, model.load_weights, torch.device(device)),
            )
            want = torch.empty(shape, dtype=dtype)
            reader.read_into(prefix, name, 0, want)
    finally:
        ahead.close()
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
    assert read.asked_in_read == (whole_read.ORDER in whole_read.UNDER)
    return read.dense


FIRST_ASKING = """
import gc, sys
import torch
from fi_convert.format.probe import probe, storage_key
assert "torch._dynamo" not in sys.modules
w = torch.zeros(6, 4)
pad = torch.full((3,), 7.0)
held = {storage_key(w), storage_key(pad)}
def load_weights(weights):
    for name, t in weights:
        if name == "pad":
            pad[:2].copy_(t)
            pad[2:].fill_(0)  # a write of the model's own: seen by the watch's dispatch mode
        else:
            w.copy_(t)
gc.disable()  # (as through a whole read)
done = probe(load_weights, [("pad", (2,), torch.float32), ("w", (6, 4), torch.float32)],
             lambda t: storage_key(t) in held)
print({p.name: p.stopped for p in done})
"""


def test_a_processs_first_asking_with_the_collector_off_keeps_no_probe_alive():
    """In a fresh process (torch._dynamo not imported, as in the tests' first asking), the
    watch's first operator imports nothing that would leave the model's load_weights frame,
    and the last probe it held, alive in a reference cycle: with the collector off, as through
    a whole read, that probe was taken as kept by the model (probe.py's `_Ops`)."""
    run = subprocess.run(
        [sys.executable, "-c", FIRST_ASKING], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "{'pad': None, 'w': None}"


@pytest.mark.parametrize("feed", [0, 1])
@pytest.mark.parametrize(
    ("order", "process"),
    [(o, False) for o in whole_read.ORDERS] + [(o, True) for o in whole_read.AT_BUILD],
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_whole_read_lands_every_byte_with_the_models_own_writes(
    out, device, order, feed, process, monkeypatch
):
    """The model's own writes while it is asked (the padding zeroed, on its stream for a GPU)
    come before the bytes read into the same tensors; a write after a copy (the scaling after
    the loop) is made again once they are in place; a call that only copied is not. In each
    order of a load (`whole_read.ORDER`: with the readers started, their requests given after
    the asking's writes), the experts' requests joining the read as they come or all at once
    (`whole_read.FEED`); read in this process or by a child's readers (`child_read.PROCESS`,
    in the orders that start the read while the model is built)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    monkeypatch.setattr(child_read, "PROCESS", process)
    monkeypatch.setattr(whole_read, "ORDER", order)
    monkeypatch.setattr(whole_read, "FEED", feed)
    stored = _stored(out)
    embed = "model.embed_tokens.weight"
    plain = [n for n, t in stored.items() if t.dtype == torch.bfloat16 and t.dim() == 2]
    scaled = next(n for n in plain if n != embed)
    once, twice = Padded(stored, embed).to(device), ScaledAfter(stored, embed, scaled).to(device)
    d1, d2 = _whole(out, once, device), _whole(out, twice, device)
    # one load as each model sees it (the asking call left no trace where it was not the load)
    assert not d1.again and once.calls == 1 and d2.again and twice.calls == 1
    for model in (once, twice):
        got = getattr(model, model.padded).cpu()
        assert torch.equal(got[:-2], stored[embed]) and not got[-2:].float().any()
    assert torch.equal(getattr(twice, twice.scaled).cpu(), stored[scaled] * 2)
    assert torch.equal(getattr(once, once.names[scaled]).cpu(), stored[scaled])


@pytest.mark.parametrize(("under", "prepared"), [(False, "0.002"), (True, "0.005")])
def test_the_load_line_takes_the_asking_off_the_time_before_the_read_once(under, prepared):
    """`LoadReport`: "prepared in" is the time before the read less the asking where the model
    was asked before the read; asked under it (`whole_read.UNDER`), the asking is inside the
    read's time and not taken off the time before it (which then came out below 0)."""
    from types import SimpleNamespace

    from fi_convert.bulk_read import ReadStats
    from fi_convert.format.load_report import LoadReport

    asking = SimpleNamespace(
        probe_s=0.003,
        direct_bytes=0,
        rest_s=0.0,
        rest_bytes=0,
        rest=[],
        pinned_bytes=0,
        plan="asked",
    )
    stats = ReadStats(bytes=1, read_bytes=1, seconds=0.01, threads=2, chunk=1, pinned_peak=0)
    read = whole_read.WholeRead(1, stats, asking, 10.005, 10.02, asked_in_read=under)
    line = LoadReport("TP rank 0/1", Path("OUT"), 1, read, started=10.0).line(10.021)
    assert f"prepared in {prepared} s" in line and "asked where in 0.003 s" in line


@pytest.mark.parametrize("fault", [None, KeyboardInterrupt])
def test_the_asking_under_the_read_sets_the_switch_interval_and_sets_it_back(
    out, monkeypatch, fault
):
    """`whole_read.SWITCH`: the interpreter's switch interval while the model is asked under
    the read, as it was again once it is asked, however the asking ends; in the other orders,
    and where it is None, never changed."""
    stored = _stored(out)
    was = sys.getswitchinterval()
    seen = []

    def asking(reader, model):
        seen.append(sys.getswitchinterval())
        if fault is not None:
            raise fault
        return DenseLoad(reader, model, model.load_weights, torch.device("cpu"))

    for order, switch in (
        ("ask-under-read", 1e-4),
        ("ask-under-read-at-build", 2e-4),
        ("ask-under-read", None),
        ("threads-at-build", 1e-4),
    ):
        monkeypatch.setattr(whole_read, "ORDER", order)
        monkeypatch.setattr(whole_read, "SWITCH", switch)
        model = Padded(stored, "model.embed_tokens.weight")
        _read_whole(
            out, lambda bulk: None, lambda reader, model=model: asking(reader, model), fault
        )
        assert seen.pop() == pytest.approx(switch if "under" in order and switch else was)
        assert sys.getswitchinterval() == was and not reader_threads()


@pytest.mark.parametrize("fault", [None, KeyboardInterrupt])
@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_off_through_a_whole_read(out, fault, enabled):
    """`whole_read._collector_held`: no collection can come due while the experts' requests
    are made, the model is asked and the bytes are read (the collector off); after it, the
    collector is as it was (off where the server had it off), however the read ends."""
    stored = _stored(out)
    model = Padded(stored, "model.embed_tokens.weight")
    seen = []

    def asking(reader):
        seen.append(("asking", gc.isenabled()))
        if fault is not None:
            raise fault
        return DenseLoad(reader, model, model.load_weights, torch.device("cpu"))

    (gc.enable if enabled else gc.disable)()
    try:
        _read_whole(out, lambda bulk: seen.append(("experts", gc.isenabled())), asking, fault)
        want = [("asking", False)] + ([] if fault else [("experts", False)])
        assert sorted(seen) == want and gc.isenabled() == enabled
    finally:
        gc.enable()


def _read_whole(out, add_experts, asking, fault) -> None:
    """`whole_read.read_whole` of `out` into the CPU as a plugin runs it (`Ahead` first),
    `asking(reader)` standing for the model's asking; `fault` (an exception type) expected out
    of it, else none."""
    ahead = whole_read.Ahead("cpu")
    try:
        with (
            OutputReader(out) as reader,
            pytest.raises(fault) if fault else contextlib.nullcontext(),
        ):
            whole_read.read_whole(
                whole_read.new_read(ahead, reader, "cpu"), add_experts, lambda: asking(reader)
            )
    finally:
        ahead.close()


def test_a_load_order_that_is_none_of_them_is_refused(monkeypatch):
    """`whole_read.ORDER` is a bench's setting: a misspelt one is named, before anything is
    asked or read (it would have read in another order, or not at all)."""
    monkeypatch.setattr(whole_read, "ORDER", "first")
    asked = []
    with pytest.raises(ValueError, match="ORDER 'first': not one of threads-at-build, ask-first"):
        whole_read.read_whole(None, asked.append, lambda: asked.append("asked"))
    with pytest.raises(ValueError, match="ORDER 'first'"):
        whole_read.Ahead("cpu")
    assert asked == [] and not reader_threads()


def test_the_readers_started_while_the_model_is_built_take_the_whole_read(out):
    """`whole_read.Ahead` ("threads-at-build", the default order): its threads run before the
    model is built and asked, the load's read is that read, every byte lands, and no reader
    is left once it is done (into a GPU, its pinned block: `test_gpu.py`)."""
    assert whole_read.ORDER == "threads-at-build"
    stored = _stored(out)
    model = Padded(stored, "model.embed_tokens.weight")
    ahead = whole_read.Ahead("cpu")
    started = list(ahead._bulk._threads)
    assert started and all(t in reader_threads() for t in started)  # (waiting for their work)
    took = []
    real = whole_read.read_whole

    def read_whole(bulk, *args):
        took.append(bulk)
        return real(bulk, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(whole_read, "Ahead", lambda device, output=None: ahead)
        mp.setattr(whole_read, "read_whole", read_whole)
        _whole(out, model, "cpu")
    assert took[0]._threads == started and not reader_threads()
    got = getattr(model, model.padded)
    assert torch.equal(got[:-2], stored["model.embed_tokens.weight"])


def test_readers_started_for_a_model_that_never_loads_end():
    """The server's build fails (or is interrupted) before the read: `close` stops the threads
    started ahead; a second close does nothing (into a GPU, the block: `test_gpu.py`)."""
    ahead = whole_read.Ahead("cpu")
    assert reader_threads() and ahead.buffers is None  # (pinned only for a GPU)
    ahead.close()
    assert not reader_threads()
    ahead.close()


def test_a_model_built_elsewhere_gets_a_read_of_its_own(out):
    """The model's parameters are not where the threads started ahead copy to: those stop,
    and the read is one of its own, into the model's device."""
    ahead = whole_read.Ahead("cpu")
    with OutputReader(out) as reader:
        bulk = whole_read.new_read(ahead, reader, "meta")
    assert bulk.device == torch.device("meta") and not bulk.started and not reader_threads()
    ahead.close()


# -- the output opened while the model is built ---------------------------------------------


@pytest.mark.parametrize("ahead_open", [True, False])
def test_the_output_opened_while_the_model_is_built_is_the_loads(out, monkeypatch, ahead_open):
    """`Ahead` given the output opens it and reads every shard's header on a thread of its own
    (`OPEN_AHEAD`, the default; off: the load opens it); the load takes that reader, reads no
    header again, and every byte lands; once the load closes it, none of its files is open."""
    from fi_convert.format import reader as reader_mod

    monkeypatch.setattr(whole_read, "OPEN_AHEAD", ahead_open)
    stored = _stored(out)
    m = manifest.read(out)
    headers = []
    real = reader_mod.read_header
    monkeypatch.setattr(reader_mod, "read_header", lambda *a: headers.append(a[0]) or real(*a))
    ahead = whole_read.Ahead("cpu", (out, m))
    if ahead_open:
        ahead._opening._done.wait()  # (as a model's build outlasts it)
        assert len(headers) == len(OutputReader(out, m).shards())
    headers.clear()
    model = Padded(stored, "model.embed_tokens.weight")
    try:
        with whole_read.open_output(ahead, out, m) as reader:
            assert ahead._opening is None  # (taken: once)
            whole_read.read_whole(
                whole_read.new_read(ahead, reader, "cpu"),
                lambda bulk: None,
                lambda: DenseLoad(reader, model, model.load_weights, torch.device("cpu")),
            )
    finally:
        ahead.close()
    assert len(headers) == (0 if ahead_open else len(reader.shards()))
    for name, t in stored.items():
        got = getattr(model, model.names[name])
        assert torch.equal(got[:-2] if name == "model.embed_tokens.weight" else got, t), name
    assert not files_open(out) and not reader_threads()


def test_an_output_that_fails_to_open_ahead_is_the_loads_one_line(out, tmp_path):
    """A shard whose header is bad, opened while the model is built: the build goes on; the
    load gets the fault as it would opening the output itself (one line naming the shard); no
    file of it is left open."""
    bad = Path(shutil.copytree(out, tmp_path / "bad"))
    shard = bad / OutputReader(bad).shards()[-1]
    with open(shard, "r+b") as f:
        f.write((1 << 40).to_bytes(8, "little"))  # a header longer than the file
    m = manifest.read(bad)
    with pytest.raises(FiConvertError) as own, OutputReader(bad, m, library_check=False) as r:
        r.header(shard.name)
    ahead = whole_read.Ahead("cpu", (bad, m))
    try:
        with pytest.raises(FiConvertError) as e:
            whole_read.open_output(ahead, bad, m)
    finally:
        ahead.close()
    assert str(e.value) == str(own.value) and str(e.value).startswith(f"{shard}: ")
    assert "\n" not in str(e.value)
    assert not files_open(bad) and not reader_threads()


def test_an_output_opened_for_a_build_that_fails_is_closed(out, monkeypatch):
    """The server's build fails (or is interrupted) while the output is still being opened:
    `close` does not wait for it; the opening thread closes what it opened once it is done.
    Asked for another folder than it opens, the load opens that one, and the first is closed
    too."""
    import threading

    from fi_convert.format import reader as reader_mod

    inside, go = threading.Event(), threading.Event()
    real = reader_mod.OutputReader.header

    def header(self, shard):
        inside.set()
        go.wait()
        return real(self, shard)

    monkeypatch.setattr(reader_mod.OutputReader, "header", header)
    m = manifest.read(out)
    ahead = whole_read.Ahead("cpu", (out, m))
    inside.wait()
    opening = ahead._opening
    ahead.close()  # the build failed: it does not wait
    assert not opening._done.is_set()
    go.set()
    opening._done.wait()
    assert not files_open(out) and not reader_threads()
    monkeypatch.setattr(reader_mod.OutputReader, "header", real)
    ahead = whole_read.Ahead("cpu", (out, m))
    opening = ahead._opening
    with pytest.raises(FiConvertError, match="elsewhere"):
        whole_read.open_output(ahead, out.parent / "elsewhere", m)
    opening._done.wait()
    ahead.close()
    assert not files_open(out) and not reader_threads()
