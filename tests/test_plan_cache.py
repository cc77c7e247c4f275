"""fi_convert/format/plan_cache.py: the model's answer of where each non-expert byte goes, kept
by the load that asked, taken by a later load of the same key instead of asking; asked again
wherever the key, the code or the entry is not as it was. (vLLM's and SGLang's own model
classes, each rank of TP 2: tests/test_vllm_models.py, tests/test_sglang_models.py.)"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.cache import write_atomic
from fi_convert.format import code_seen, plan_cache, whole_read
from fi_convert.format.dense import DenseLoad
from fi_convert.format.plan_cache import Context, PlanCacheError
from fi_convert.format.reader import OutputReader
from fi_convert.testing.synthetic import Spec, write_checkpoint

from . import test_dense
from .test_dense import SPEC, _stored

out = test_dense.out  # (the fixture: a DeepSeek-V3 FP8-block output of TP 2)
CONTEXT = Context("test 1.0", "config", (("tp", 1, 2),))
EMBED = "model.embed_tokens.weight"
KEPT = "asked, kept for the next load"
CPU = torch.device("cpu")
# the model classes, in a file of their own: a test changes it (the code an entry stands on)
MODELS = '''
import torch


class Model(torch.nn.Module):
    """A parameter per tensor, copied whole; the embedding two rows longer, zeroed after the
    tensor's rows (vLLM's vocabulary embedding); `how`: what else its loading does."""

    def __init__(self, stored, how=""):
        super().__init__()
        self.names = {n: n.replace(".", "__") for n in stored}
        self.how, self.notes, self.table = how, [], {"loaded": False, "by": None}
        self.register_buffer("scratch", torch.zeros(4))  # (no tensor of the output's)
        for n, t in stored.items():
            rows = t.shape[0] + 2 if n == "model.embed_tokens.weight" else t.shape[0]
            like = torch.full((rows, *t.shape[1:]), 7, dtype=t.dtype)
            setattr(self, self.names[n], torch.nn.Parameter(like, requires_grad=False))
        self.model__norm__weight.notes = []

    def load_weights(self, weights):
        for n, t in weights:
            dst = getattr(self, self.names[n])
            dst.data[: t.shape[0]].copy_(t)
            if dst.shape[0] > t.shape[0]:
                dst.data[t.shape[0] :].fill_(0)
        if self.how == "copies a constant":
            self.scratch.copy_(torch.ones(4))
        elif self.how == "sets an attribute":
            self.loaded = True
        elif self.how == "adds to a list":
            self.notes.append("loaded")
        elif self.how == "registers a buffer":
            self.register_buffer("seen", torch.ones(1))
        elif self.how == "sets a dict's value":
            self.table["by"] = self
        elif self.how == "renames a dict's key":  # (the same dict, as long, its values alike)
            self.table["from"] = self.table.pop("by")
        elif self.how == "marks a tensor":
            self.model__norm__weight.loaded = True
        elif self.how == "adds to a tensor's list":
            self.model__norm__weight.notes.append("loaded")
        elif self.how == "swaps a parameter":
            was = self._parameters["model__norm__weight"]
            self._parameters["model__norm__weight"] = torch.nn.Parameter(
                torch.zeros(was.shape, dtype=was.dtype), requires_grad=False
            )
        elif self.how == "sets an attribute again":  # (the same object: the dict's order alone)
            notes = self.__dict__.pop("notes")
            self.notes = notes
        elif self.how == "scales in place":
            self.model__norm__weight.data.mul_(2)
        return set(self.names)
'''


@pytest.fixture
def models(tmp_path):
    """The model classes' module, from a file of this test's own."""
    path = tmp_path / "plan_models.py"
    path.write_text(MODELS)
    spec = importlib.util.spec_from_file_location(f"plan_models_{id(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.path = path
    yield module


@pytest.fixture
def plans(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "plans"
    monkeypatch.setenv(plan_cache.ENV, str(folder))
    return folder


class Counted:
    """A model's load_weights, its calls counted (outside the model: its state is the
    entry's business)."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0

    def __call__(self, weights):
        self.calls += 1
        return self.model.load_weights(weights)


def load(out, model, context=CONTEXT) -> tuple[DenseLoad, Counted]:
    asked = Counted(model)
    return test_dense._load(out, model, load_weights=asked, context=context), asked


def assert_loaded(model, stored) -> None:
    for n, t in stored.items():
        got = getattr(model, model.names[n])
        assert torch.equal(got[: t.shape[0]], t), n
        if n == EMBED:  # the rows past the tensor's, zeroed as the model's loading zeroes them
            assert not got[t.shape[0] :].float().any()


def test_a_later_load_takes_the_models_answer_without_asking(out, models, plans):
    stored = _stored(out)
    first, asked = load(out, models.Model(stored))
    assert first.plan == KEPT and asked.calls == 1
    (entry,) = plans.iterdir()
    model = models.Model(stored)  # (every byte 7 until the load: none is left so)
    second, again = load(out, model)
    assert second.plan == "remembered" and again.calls == 0
    assert_loaded(model, stored)
    assert second.loaded == first.loaded and not second.again and second.rest == []
    assert [p.name for p in second.probed.values()] == list(first.probed)
    assert list(plans.iterdir()) == [entry]  # (nothing written: taken as it was)


def test_the_answer_is_kept_as_the_read_goes_and_not_where_the_load_stops(out, models, plans):
    """The whole load (`whole_read`) keeps it once the read is under way (not on the asking's
    path to the read's requests), before the read is waited for; a load stopped after the
    asking keeps nothing."""
    stored = _stored(out)
    entries: dict[str, list[str]] = {}

    def at(when: str) -> None:
        entries[when] = [p.name for p in plans.iterdir()] if plans.exists() else []

    with OutputReader(out) as reader:
        bulk = reader.bulk("cpu")
        wait = bulk.wait
        bulk.wait = lambda: (at("read waited for"), wait())[1]
        model = models.Model(stored)

        def asked() -> DenseLoad:
            d = DenseLoad(reader, model, model.load_weights, CPU, context=CONTEXT)
            at("asked")
            return d

        read = whole_read.read_whole(bulk, lambda b: None, asked)
    assert read.dense.plan == KEPT and entries["asked"] == []
    assert entries["read waited for"] == [p.name for p in plans.iterdir()] != []
    assert read.dense.loaded >= set(model.names)
    assert_loaded(model, stored)
    shutil.rmtree(plans)
    with OutputReader(out) as reader:
        stopped = DenseLoad(reader, model, model.load_weights, CPU, context=CONTEXT)
        stopped.abort()
        stopped.finish()
    assert stopped.plan == "asked" and not plans.exists()


@pytest.mark.parametrize(
    "other",
    ["rank", "config", "server", "a tensor's dtype", "a module's name", "the output", "off"],
)
def test_a_load_unlike_the_one_that_asked_asks_again(out, models, plans, other, tmp_path):
    """Another rank, config, server release, a model tensor of another dtype, a module of
    another name, an output of other tensors (another vocabulary): the key is another and the
    model is asked; so where the cache is off (FI_CONVERT_PLAN_CACHE=0). (Another output of
    the same tensors takes the entry: it holds ranges of each tensor, not of a file.)"""
    stored = _stored(out)
    load(out, models.Model(stored))
    context, model, output = CONTEXT, models.Model(stored), out
    if other == "rank":
        context = Context(CONTEXT.server, CONTEXT.config, (("tp", 0, 2),))
    elif other == "config":
        context = Context(CONTEXT.server, "another config", CONTEXT.ranks)
    elif other == "server":
        context = Context("test 1.1", CONTEXT.config, CONTEXT.ranks)
    elif other == "a tensor's dtype":
        model.model__norm__weight.data = model.model__norm__weight.data.double()
    elif other == "a module's name":
        model.add_module("extra", torch.nn.Identity())
    elif other == "the output":
        output = tmp_path / "vocab"
        other_spec = Spec(**{**SPEC.__dict__, "vocab": 1024})
        src = write_checkpoint(tmp_path / "src", other_spec)
        convert(src, output, Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 2), device="cpu")
        model = models.Model(_stored(output))
    elif other == "off":
        os.environ[plan_cache.ENV] = "0"
    d, asked = load(output, model, context)
    assert asked.calls >= 1 and d.plan.startswith("asked")
    if other != "a tensor's dtype":
        assert_loaded(model, _stored(output))
    # (a copy into another dtype is more than a copy: that answer is not kept)
    assert len(list(plans.iterdir())) == (1 if other in ("off", "a tensor's dtype") else 2)


@pytest.mark.parametrize("change", ["its text", "its time"])
def test_a_change_to_a_file_of_the_loadings_code_asks_again(out, models, plans, change):
    """The model's module file changed (its text, or only its modification time, as a
    reinstall leaves it): the entry is not taken."""
    stored = _stored(out)
    load(out, models.Model(stored))
    assert load(out, models.Model(stored))[0].plan == "remembered"
    st = models.path.stat()
    if change == "its text":
        models.path.write_text(MODELS + "\n# a patch\n")
    else:
        os.utime(models.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    d, asked = load(out, models.Model(stored))
    assert asked.calls == 1 and d.plan == KEPT  # (and kept again, for the code as it is)
    assert load(out, models.Model(stored))[0].plan == "remembered"


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("copies a constant", "writes otherwise than numbers (aten.copy_.default)"),
        ("sets an attribute", "changes its Model module"),
        ("adds to a list", "changes its Model module"),
        ("sets a dict's value", "changes its Model module"),
        ("registers a buffer", "changes its Model module"),
        ("renames a dict's key", "changes its Model module"),
        ("marks a tensor", "changes an attribute of one of its tensors"),
        ("adds to a tensor's list", "changes an attribute of one of its tensors"),
        ("swaps a parameter", "changes its Model module"),
        ("scales in place", "does more than copy each tensor in one call"),
    ],
)
def test_a_loading_that_does_more_than_an_entry_makes_again_is_asked_every_time(
    out, models, plans, how, why
):
    """A loading whose every effect an entry cannot make again (a write of a tensor's values,
    a change to the model's modules or tensors, more than one call): no entry is kept, and
    each load asks the model, which loads right."""
    stored = _stored(out)
    for _ in range(2):
        model = models.Model(stored, how)
        d, asked = load(out, model)
        assert d.plan == f"asked, not kept for the next load: its loading {why}"
        assert asked.calls >= 1
        for n, t in stored.items():
            if n != "model.norm.weight":
                assert torch.equal(getattr(model, model.names[n])[: t.shape[0]], t), n
    assert not plans.exists() or list(plans.iterdir()) == []


def test_a_loading_that_sets_an_attribute_to_what_it_was_is_kept(out, models, plans):
    """An attribute taken out and set again to the same object moves it in its module's dict
    (what the quick look at the model compares, in order): the item-by-item look finds nothing
    changed, and the answer is kept and taken."""
    stored = _stored(out)
    d, asked = load(out, models.Model(stored, "sets an attribute again"))
    assert d.plan == KEPT and asked.calls == 1
    model = models.Model(stored, "sets an attribute again")
    d, asked = load(out, model)
    assert d.plan == "remembered" and asked.calls == 0
    assert_loaded(model, stored)


def _entry(plans: Path) -> tuple[Path, dict]:
    (path,) = plans.iterdir()
    digest, _, body = path.read_bytes().partition(b"\n")
    return path, json.loads(body)


def _write(path: Path, rec: dict) -> None:
    """An entry of `rec`, whole by its checksum (as only fi-convert writes one)."""
    body = json.dumps(rec).encode()
    path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def _forged(rec: dict, how: str) -> dict:
    rec = json.loads(json.dumps(rec))
    first = next(n for n, cs in rec["tensors"].items() if cs)
    copy = rec["tensors"][first][0]  # [target, dtype, offset, shape, src offset, nbytes, rows]
    if how == "past its target":
        copy[2] += 1 << 20
    elif how == "past its tensor":
        copy[4] += 1 << 20
    elif how == "a negative offset":
        copy[2] = -1
    elif how == "another target":
        copy[0] = "no.such.tensor"
    elif how == "a string offset":
        copy[4] = "0"
    elif how == "a tensor left out":
        del rec["tensors"][first]
    elif how == "another dtype":
        copy[1] = "no_such_dtype"
    elif how == "a fill past its target":
        rec["fills"][0][2] += 1 << 20
    elif how == "a fill of a string":
        rec["fills"][0][5] = "0"
    elif how == "another key":
        rec["key"] = "0" * 40
    elif how == "a list for an object":
        rec["tensors"] = []
    return rec


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "empty",
        "a byte of its body flipped",
        "a byte of its checksum flipped",
        "not JSON",
        "past its target",
        "past its tensor",
        "a negative offset",
        "another target",
        "a string offset",
        "a tensor left out",
        "another dtype",
        "a fill past its target",
        "a fill of a string",
        "another key",
        "a list for an object",
    ],
)
def test_an_entry_not_whole_or_not_of_its_key_is_asked_again_and_written_over(
    out, models, plans, damage
):
    """Damaged (its checksum), or whole but not such as a load of its key could keep (a range
    outside its tensor or its target, a name or dtype the model lacks, values of other types):
    the model is asked, loads right, and its answer is written over the entry."""
    stored = _stored(out)
    load(out, models.Model(stored))
    path, rec = _entry(plans)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "a byte of its body flipped":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    elif damage == "a byte of its checksum flipped":
        path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    elif damage == "not JSON":
        path.write_bytes(hashlib.sha256(b"{").hexdigest().encode() + b"\n{")
    else:
        _write(path, _forged(rec, damage))
    model = models.Model(stored)
    d, asked = load(out, model)
    assert asked.calls == 1 and d.plan == KEPT
    assert_loaded(model, stored)
    assert _entry(plans)[1] == rec  # (written over, as the asking found it)


def test_damaged_entries_are_never_taken(out, models, plans):
    """A fuzzer's entries (bytes flipped, cut or added at random, 40 of them): each is asked
    again, and the load is right."""
    stored = _stored(out)
    load(out, models.Model(stored))
    path, _ = _entry(plans)
    good = path.read_bytes()
    rng = random.Random(14)
    for _ in range(40):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            op = rng.choice(("flip", "cut", "add"))
            if op == "flip":
                data[at] ^= 1 << rng.randrange(8)
            elif op == "cut":
                del data[at : at + rng.randint(1, 30)]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        path.write_bytes(bytes(data))
        model = models.Model(stored)
        d, asked = load(out, model)
        assert asked.calls == 1 and d.plan == KEPT
        assert_loaded(model, stored)


def test_a_plan_cache_setting_that_is_not_a_folder_is_one_line(out, models, tmp_path, monkeypatch):
    path = tmp_path / "a-file"
    path.write_text("")
    monkeypatch.setenv(plan_cache.ENV, str(path))
    with pytest.raises(PlanCacheError) as e:
        load(out, models.Model(_stored(out)))
    assert str(e.value) == (
        f"{plan_cache.ENV}={path}: not a folder; set it to a folder for the plans of loads, "
        "or to 0 to ask the model at every load"
    )


def test_a_folder_that_cannot_be_written_is_skipped(out, models, tmp_path, monkeypatch):
    """Under a file (no folder can be made there, whoever runs it): asked, not kept, loaded."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(plan_cache.ENV, str(blocker / "plans"))
    stored = _stored(out)
    for _ in range(2):
        model = models.Model(stored)
        d, asked = load(out, model)
        assert asked.calls == 1 and d.plan == (
            f"asked, not kept for the next load: {blocker / 'plans'} cannot be written"
        )
        assert_loaded(model, stored)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "plan_models.py"]


def test_writers_of_one_entry_at_once_leave_one_whole_and_nothing_else(tmp_path):
    """Eight threads write the same entry at once (each its own bytes, held at a barrier
    before): one writer's bytes are the entry, and no temporary file is left."""
    path = tmp_path / "plans" / "entry.json"
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def write(k: int) -> None:
        barrier.wait()
        results.append(write_atomic(path, bytes([k]) * 100_000))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 8
    assert path.read_bytes() in {bytes([k]) * 100_000 for k in range(8)}
    assert [p.name for p in path.parent.iterdir()] == ["entry.json"]


def test_a_tracer_set_before_the_asking_goes_on_as_it_was(out, models, plans):
    """A coverage tool's or debugger's tracer sees the asking's calls too, and is set again
    after it."""
    seen: list[str] = []

    def tracer(frame, event, arg):
        seen.append(frame.f_code.co_name)

    sys.settrace(tracer)
    try:
        d, _ = load(out, models.Model(_stored(out)))
        after = sys.gettrace()
    finally:
        sys.settrace(None)
    assert after is tracer and d.plan == KEPT and "load_weights" in seen


@pytest.mark.parametrize("fault", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_a_write_cut_short_leaves_no_temporary_file(tmp_path, monkeypatch, fault):
    """Ctrl-C (raised on) or a full disk (skipped) as an entry is put in place: the folder holds
    what it held, and no temporary file."""
    path = tmp_path / "plans" / "entry.json"
    assert write_atomic(path, b"old")
    monkeypatch.setattr(os, "replace", mock.Mock(side_effect=fault))
    if isinstance(fault, OSError):
        assert write_atomic(path, b"new") is False
    else:
        with pytest.raises(KeyboardInterrupt):
            write_atomic(path, b"new")
    assert [p.name for p in path.parent.iterdir()] == ["entry.json"]
    assert path.read_bytes() == b"old"


# A fresh interpreter's check of code_seen (a file of the standard library alone): each
# function run inside is seen, a dataclass's written __init__ with its class's module file; a
# namedtuple's written __new__ in no file is left out of the files, and code in a file that is
# not there is named; another thread's code is not seen; a second watching sees what ran again,
# and only its own code: a module file seen by an earlier watching and then deleted is not named
# by a later one; the monitoring tool id is given back (3.12 on), and with every free tool id
# taken the tracer stands in.
CODE_SEEN = """
import collections, dataclasses, importlib.util, pathlib, sys, tempfile, threading
spec = importlib.util.spec_from_file_location("code_seen", sys.argv[1])
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)
cs.MONITORING = sys.argv[2] == "monitoring"

@dataclasses.dataclass
class P:
    a: int

Pair = collections.namedtuple("Pair", "a b")  # (its __new__ written at run time, no file)

def f(x):
    return P(x), Pair(x, x)

def elsewhere():
    return 1

namespace = {}
exec(compile("def g():\\n    return 2\\n", "/no/such/file.py", "exec"), namespace)

def names(seen):
    return {c.co_name: m for c, m in seen.items()}

for taken in (False, True):
    mon = getattr(sys, "monitoring", None)
    if taken and mon is not None:
        for tool in (3, 4, 5):
            mon.use_tool_id(tool, "another")
    for _ in range(2):
        started, go = threading.Event(), threading.Event()
        other = threading.Thread(target=lambda: (started.set(), go.wait(), elsewhere()))
        other.start()
        started.wait()
        with cs.watching() as seen:
            f(1)
            go.set()
            other.join()  # (another thread's code, run meanwhile)
        got = names(seen)
        assert "f" in got and got["__init__"] == __file__ and None in got.values(), got
        assert "elsewhere" not in got, got
        files = [name for name, *_ in cs.files(seen)]
        assert __file__ in files and not any(n.startswith("<") for n in files), files
    gone = pathlib.Path(tempfile.mkdtemp()) / "gone.py"
    gone.write_text("def h():\\n    return 3\\n")
    spec = importlib.util.spec_from_file_location("gone", gone)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with cs.watching() as seen:
        module.h()
        f(1)
    assert {"h", "f"} <= set(names(seen)), names(seen)
    gone.unlink()
    gone.parent.rmdir()
    with cs.watching() as seen:
        elsewhere()
    assert "elsewhere" in names(seen) and not {"h", "f"} & set(names(seen)), names(seen)
    assert str(gone) not in [name for name, *_ in cs.files(seen)]
    with cs.watching() as seen:
        namespace["g"]()
    try:
        cs.files(seen)
    except cs.NotInFiles as e:
        assert str(e) == "/no/such/file.py: g", e
    else:
        raise AssertionError("a file that is not there")
    if mon is not None:
        assert [mon.get_tool(t) for t in (3, 4, 5)] == (["another"] * 3 if taken else [None] * 3)
print("ok", sys.version_info[:2], cs.MONITORING and hasattr(sys, "monitoring"))
"""


def _python312() -> str | None:
    """A Python 3.12 that runs here (pyenv's shims may name one that does not)."""
    pyenv = sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python"))
    for exe in [*pyenv, shutil.which("python3.12")]:
        if exe and subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    return None


@pytest.mark.parametrize(
    ("python", "how"), [("this", "tracer"), ("3.12", "tracer"), ("3.12", "monitoring")]
)
def test_the_code_seen_is_each_function_run_inside(python, how, tmp_path):
    exe = sys.executable if python == "this" else _python312()
    if exe is None:
        pytest.skip("no Python 3.12 on this machine (sys.monitoring's path)")
    script = tmp_path / "check.py"
    script.write_text(CODE_SEEN)
    module = Path(code_seen.__file__)
    r = subprocess.run([exe, str(script), str(module), how], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")
    assert r.stdout.strip().endswith(str(how == "monitoring"))  # (the path it took)
