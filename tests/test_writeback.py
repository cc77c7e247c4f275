"""fi_convert/st_io.py (`Writeback`), early writeback: the disk starts writing a durable output's
bytes behind the writes (`st_io.Writeback`, `sync_file_range`), never in the writers' way, and
without changing a byte or leaving a file descriptor open."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from itertools import pairwise
from pathlib import Path

import pytest

from fi_convert import Options, SchemeName, convert, st_io
from fi_convert.st_io import ShardWriter, Writeback
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .test_reliability import _files

pytestmark = pytest.mark.skipif(
    st_io.WRITEBACK.fn is None, reason="the kernel has no sync_file_range (not Linux)"
)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _settles(fds: set[str], timeout: float = 10.0) -> bool:
    """The writeback thread closed its descriptors: none are open beyond `fds`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _open_fds() <= fds:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, int, int]]:
    """Every range given to the kernel, as (the file it belongs to, offset, length)."""
    seen: list[tuple[str, int, int]] = []
    real = st_io.WRITEBACK.fn

    def record(fd: int, offset: int, nbytes: int, flags: int) -> int:
        assert flags == Writeback.START_WRITE
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), offset, nbytes))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(st_io.WRITEBACK, "fn", record)
    monkeypatch.setattr(Writeback, "STEP", 4096)
    return seen


def _entry(name: str, nbytes: int) -> st_io.OutEntry:
    return st_io.OutEntry(name, "U8", (nbytes,))


def test_a_writer_gives_its_ranges_in_order_and_closes_its_descriptor(tmp_path, calls):
    fds = _open_fds()
    sizes = [10_000, 3_000, 50_000]
    w = ShardWriter(
        tmp_path / "a.safetensors",
        [_entry(f"t{k}", n) for k, n in enumerate(sizes)],
        writeback=True,
    )
    for n in sizes:
        w.write_bytes(bytes([n % 251]) * n)
    w.finish()
    assert _settles(fds)
    assert calls, "no range was given to the kernel"
    # the file under its temporary name, or its final one once finished
    assert {c[0].removesuffix(st_io.TMP_SUFFIX) for c in calls} == {str(tmp_path / "a.safetensors")}
    # contiguous from the start of the file, each at least STEP long, within what was written
    offsets = [c[1] for c in calls]
    assert offsets[0] == 0
    assert all(a[1] + a[2] == b[1] for a, b in pairwise(calls))
    assert all(c[2] >= 4096 for c in calls)
    assert calls[-1][1] + calls[-1][2] <= w.total


def test_an_aborted_writer_closes_its_descriptor(tmp_path, calls):
    fds = _open_fds()
    w = ShardWriter(tmp_path / "a.safetensors", [_entry("t", 100_000)], writeback=True)
    w.write_bytes(b"x" * 50_000)
    w.abort()
    assert _settles(fds)
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    spec = Spec("deepseek-v3", layers=3, experts=6, hidden=256, intermediate=256, shards=3)
    return write_checkpoint(tmp_path_factory.mktemp("wb") / "m", spec)


def test_a_durable_conversion_writes_back_every_shard_and_the_same_bytes(src, tmp_path, calls):
    opts = Options(SchemeName.FP8_BLOCK)
    convert(src, tmp_path / "plain", opts, device="cpu", fsync=False)
    assert not calls  # --no-fsync: nothing is to be durable, the disk is left alone
    fds = _open_fds()
    convert(src, tmp_path / "out", opts, device="cpu")
    assert _settles(fds)
    shards = {p.name for p in (tmp_path / "out").glob("*.safetensors")}
    written_back = {Path(c[0]).name.removesuffix(st_io.TMP_SUFFIX) for c in calls}
    assert written_back == shards
    assert _files(tmp_path / "out") == _files(tmp_path / "plain")


def test_the_writers_never_wait_for_the_disk(tmp_path, monkeypatch):
    """A `sync_file_range` that blocks (a slow disk) holds up no write."""
    gate = threading.Event()
    monkeypatch.setattr(st_io.WRITEBACK, "fn", lambda *a: gate.wait(30) and 0)
    monkeypatch.setattr(Writeback, "STEP", 4096)
    fds = _open_fds()
    try:
        w = ShardWriter(tmp_path / "a.safetensors", [_entry("t", 400_000)], writeback=True)
        t = time.monotonic()
        for _ in range(100):
            w.write_bytes(b"y" * 4000)
        w.finish()
        assert time.monotonic() - t < 10
    finally:
        gate.set()
    assert _settles(fds)


def test_a_run_ends_with_none_of_its_files_held_open(src, tmp_path, monkeypatch):
    """convert() returns only once the writeback thread has let go of every file the run wrote:
    a descriptor it still held would keep a deleted output's space in use (a full tmpfs then
    refused to shrink after the output was deleted, in test_outdir under load)."""
    entered, gate = threading.Event(), threading.Event()

    def slow(fd: int, offset: int, nbytes: int, flags: int) -> int:
        entered.set()
        gate.wait()
        return 0

    monkeypatch.setattr(st_io.WRITEBACK, "fn", slow)
    monkeypatch.setattr(Writeback, "STEP", 4096)
    out, done = tmp_path / "out", threading.Event()
    t = threading.Thread(target=lambda: (convert(src, out, Options(), device="cpu"), done.set()))
    t.start()
    try:
        assert entered.wait(60)
        # the writeback thread is held inside a range of one of the run's files
        assert not done.wait(1.0), "convert() returned while its files were still held open"
    finally:
        gate.set()
        t.join(120)
    assert done.is_set()
    held = []
    for fd in _open_fds():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert not [p for p in held if p.startswith(str(out))]
