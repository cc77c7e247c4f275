"""fi_convert/bulk_read.py: many byte ranges read at once by several threads (direct into host
tensors, or staged through host buffers as into a GPU; test_gpu.py runs the CUDA path), the
ranges joined and cut as planned, and every fault one line with the threads stopped and the
buffers freed (Ctrl-C and SIGTERM in real processes)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from fi_convert import bulk_read
from fi_convert.bulk_read import GAP, MIN_CHUNK, BulkRead, ReadError, fit

from .conftest import reader_threads

MiB = 1 << 20


def _file(path: Path, size: int, seed: int = 0) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


@pytest.fixture
def two_files(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    data = {a: _file(a, 9 * MiB + 123, 1), b: _file(b, 5 * MiB + 7, 2)}
    fds = {p: os.open(p, os.O_RDONLY) for p in data}
    yield data, fds
    for fd in fds.values():
        os.close(fd)


def _spans(data: dict[Path, bytes], seed: int) -> list[tuple[Path, int, int]]:
    """Random non-overlapping ranges of both files: touching, small gaps, large gaps, and
    ranges longer than a chunk."""
    rng = random.Random(seed)
    spans = []
    for path, raw in data.items():
        pos = rng.randrange(0, 4096)
        while True:
            size = rng.choice([1, 17, 4096, MiB // 3, MiB + 5, 3 * MiB])
            if pos + size > len(raw):
                break
            spans.append((path, pos, size))
            pos += size + rng.choice([0, 0, 1, 999, GAP // 2, GAP + 1])
    rng.shuffle(spans)
    return spans


def _add_spans(bulk: BulkRead, files, seed: int) -> list[tuple[torch.Tensor, bytes]]:
    """`_spans`' ranges added to `bulk`, each into a destination of its own: (destination,
    the bytes it must hold)."""
    data, fds = files
    want = []
    for path, offset, size in _spans(data, seed):
        dst = torch.empty(size, dtype=torch.uint8)
        bulk.add(path, fds[path], offset, dst)
        want.append((dst, data[path][offset : offset + size]))
    return want


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_range_lands_in_its_destination(two_files, staged, seed):
    bulk = BulkRead("cpu", threads=3, chunk=MIN_CHUNK, staged=staged, host_memory=64 * MiB)
    want = _add_spans(bulk, two_files, seed)
    stats = bulk.run()
    for dst, raw in want:
        assert dst.numpy().tobytes() == raw
    assert stats.bytes == sum(len(raw) for _, raw in want)
    assert stats.read_bytes >= stats.bytes
    assert bulk.pinned_bytes == 0 and not reader_threads()
    # its jobs, none over a chunk, and when each of the 3 threads ran out of them, in order
    assert stats.jobs >= -(-stats.read_bytes // MIN_CHUNK)
    assert len(stats.thread_ends) == stats.threads == 3
    assert list(stats.thread_ends) == sorted(stats.thread_ends)
    assert stats.thread_ends[0] >= 0 and stats.thread_ends[-1] == pytest.approx(stats.seconds)


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize(
    ("rows", "size", "stride"),
    [
        (500, 2048, 16384),
        (5, 4096, 4096),
        (3, 3 * MiB // 2, 2 * MiB),
        (1, 1, 1),
        (3000, 16, 64),  # many small rows in one span
        (3, 0, 10),  # (a rank's share of no bytes: nothing read)
    ],
)
def test_rows_a_stride_apart_land_one_after_another(two_files, staged, rows, size, stride):
    """A column slice of a row-major tensor (a row-parallel rank's): `rows` rows of `size`
    bytes, `stride` apart; rows longer than a chunk (1 MiB here) are read one by one."""
    data, fds = two_files
    path, raw = next(iter(data.items()))
    bulk = BulkRead("cpu", threads=3, chunk=MIN_CHUNK, staged=staged, host_memory=64 * MiB)
    dst = torch.empty(rows * size, dtype=torch.uint8)
    bulk.add_rows(path, fds[path], 777, (rows, size, stride), dst)
    assert bulk.nbytes == rows * size
    stats = bulk.run()
    want = b"".join(raw[777 + r * stride : 777 + r * stride + size] for r in range(rows))
    assert dst.numpy().tobytes() == want and stats.bytes == rows * size
    assert not reader_threads()


def test_destinations_of_any_dtype_and_shape_take_the_bytes(two_files):
    data, fds = two_files
    (path, raw), fd = next(iter(data.items())), fds[next(iter(data))]
    dst = torch.empty(3, 5, 7, dtype=torch.float32)
    bulk = BulkRead("cpu", threads=2, staged=True)
    bulk.add(path, fd, 100, dst)
    bulk.run()
    assert dst.view(torch.uint8).numpy().tobytes() == raw[100 : 100 + 3 * 5 * 7 * 4]


def test_near_ranges_are_read_as_one_and_far_ones_apart(two_files):
    """Staged: two ranges GAP apart are one read (the gap read and dropped); GAP + 1 apart, two.
    Direct reads never read a gap."""
    data, fds = two_files
    path, fd = next(iter(fds.items()))
    for staged, gap, read in [
        (True, GAP, 2 * 4096 + GAP),
        (True, GAP + 1, 2 * 4096),
        (False, 1, 2 * 4096),
    ]:
        bulk = BulkRead("cpu", threads=2, staged=staged)
        a, b = torch.empty(4096, dtype=torch.uint8), torch.empty(4096, dtype=torch.uint8)
        bulk.add(path, fd, 10, a)
        bulk.add(path, fd, 10 + 4096 + gap, b)
        assert bulk.run().read_bytes == read
        assert b.numpy().tobytes() == data[path][10 + 4096 + gap : 10 + 2 * 4096 + gap]


def test_long_ranges_are_cut_into_chunks_for_the_threads(two_files):
    data, fds = two_files
    path, fd = next(iter(fds.items()))
    bulk = BulkRead("cpu", threads=4, chunk=MIN_CHUNK, staged=True, host_memory=64 * MiB)
    dst = torch.empty(9 * MiB, dtype=torch.uint8)
    bulk.add(path, fd, 123, dst)
    bulk.start()
    sizes = [j.size for j in bulk._jobs]
    stats = bulk.wait()
    assert sizes == [MIN_CHUNK] * 9 and stats.threads == 4
    assert stats.pinned_peak <= 4 * bulk_read.DEPTH * MIN_CHUNK
    assert dst.numpy().tobytes() == data[path][123 : 123 + 9 * MiB]


@pytest.mark.parametrize(("lead", "depth"), [(2, 2), (4, 4), (3, 4), (8, 4)])
def test_a_reads_first_jobs_are_lead_chunks_long_and_land(two_files, monkeypatch, lead, depth):
    """With LEAD set, a staged read's first jobs (one a thread, then the strided ones) are
    LEAD chunks long (at most DEPTH: a thread's buffers in a row), and every byte lands; a
    job past the first read's, and every direct read's, is a chunk at most."""
    monkeypatch.setattr(bulk_read, "LEAD", lead)
    monkeypatch.setattr(bulk_read, "DEPTH", depth)
    data, fds = two_files
    (a, raw_a), (b, raw_b) = data.items()
    for staged in (True, False):
        bulk = BulkRead("cpu", threads=3, chunk=MIN_CHUNK, staged=staged, host_memory=64 * MiB)
        whole = torch.empty(9 * MiB, dtype=torch.uint8)
        rows = torch.empty(40 * 1000, dtype=torch.uint8)
        bulk.add(a, fds[a], 5, whole)
        bulk.add_rows(b, fds[b], 3, (40, 1000, 100_000), rows)
        bulk.start(more=True)
        first = [(j.size, j.rows is not None) for j in bulk._jobs]
        later = torch.empty(3 * MiB, dtype=torch.uint8)
        bulk.add(b, fds[b], 1000, later)
        bulk.more()
        stats = bulk.wait()
        assert whole.numpy().tobytes() == raw_a[5 : 5 + 9 * MiB]
        assert later.numpy().tobytes() == raw_b[1000 : 1000 + 3 * MiB]
        want = b"".join(raw_b[3 + r * 100_000 : 3 + r * 100_000 + 1000] for r in range(40))
        assert rows.numpy().tobytes() == want
        n = min(lead, depth) * MIN_CHUNK
        heads = [min(n, 9 * MiB - k * n) for k in range(3) if k * n < 9 * MiB]
        if staged:  # the strided job next, then the rest in chunks; the later ones in chunks
            assert first[: len(heads)] == [(size, False) for size in heads]
            assert first[len(heads)][1]
            assert all(s <= MIN_CHUNK for s, _ in first[len(heads) + 1 :])
            assert sum(s for s, r in first if not r) == 9 * MiB
        else:
            assert all(s <= MIN_CHUNK for s, _ in first)
        assert all(j.size <= MIN_CHUNK for j in bulk._jobs[len(first) :])
        assert stats.pinned_peak <= 3 * depth * MIN_CHUNK
        assert not reader_threads()


def test_a_threads_buffers_are_taken_in_turn_and_a_long_job_takes_several_in_a_row(
    monkeypatch,
):
    monkeypatch.setattr(bulk_read, "DEPTH", 4)
    ring = bulk_read._Ring(10)
    taken = [ring.take(n) for n in (40, 10, 25, 1, 30, 0)]
    assert taken == [(0, 4), (0, 1), (1, 4), (0, 1), (1, 4), (0, 1)]
    ring = bulk_read._Ring(10)
    assert ring.refilled(*ring.take(20)) == []  # new buffers: nothing to wait for
    assert ring.refilled(*ring.take(30)) == [0, 1]  # past the last: from the first
    assert ring.refilled(*ring.take(10)) == []  # the last, not used yet
    assert ring.refilled(*ring.take(10)) == [0]


class _HostDriver:
    """The driver's calls of the readers' loop into a GPU (`BulkRead._loop_driver`), made on
    host memory, for its buffers' discipline: a copy lands at once, but its source stays read
    by the stream, as on a GPU, until an event recorded after it has been waited for. A read
    into a buffer that a copy in flight still reads is the race a GPU shows as wrong bytes,
    now and then: here it is counted, every time."""

    def __init__(self) -> None:
        self.copies: list[tuple[int, int]] = []  # each copy's source bytes, in stream order
        self.marks: dict[int, int] = {}  # event: the copies before it when it was recorded
        self.done = 0  # the copies known to be over
        self.races = 0

    def event(self) -> int:
        self.marks[len(self.marks) + 1] = 0
        return len(self.marks)

    def record(self, event: int, stream: int) -> None:
        self.marks[event] = len(self.copies)

    def wait(self, event: int) -> None:
        self.done = max(self.done, self.marks[event])

    def copy_to_device(self, dst: int, src: int, n: int, stream: int) -> None:
        ctypes.memmove(dst, src, n)
        self.copies.append((src, src + n))

    def copy_rows_to_device(self, dst, src, rows, size, stride, stream) -> None:
        for r in range(rows):
            ctypes.memmove(dst + r * size, src + r * stride, size)
        self.copies.append((src, src + (rows - 1) * stride + size))

    def reading(self, first: int, end: int) -> None:
        """A read into these bytes starts."""
        self.races += any(a < end and first < b for a, b in self.copies[self.done :])


@pytest.mark.parametrize(("lead", "depth"), [(1, 2), (1, 3), (2, 4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_buffer_is_read_into_only_once_its_last_copy_is_over(
    two_files, monkeypatch, lead, depth, seed
):
    """The readers' loop into a GPU, its driver calls made on host memory (`_HostDriver`):
    each buffer refilled only after an event recorded after its last copy (ranges longer
    than a chunk, rows, the first reads LEAD chunks long), and every byte lands."""
    monkeypatch.setattr(bulk_read, "LEAD", lead)
    monkeypatch.setattr(bulk_read, "DEPTH", depth)
    data, fds = two_files
    bulk = BulkRead("cpu", threads=1, chunk=MIN_CHUNK, staged=True, host_memory=64 * MiB)
    want = _add_spans(bulk, two_files, seed)
    (path, raw), rows = next(iter(data.items())), torch.empty(300 * 1000, dtype=torch.uint8)
    bulk.add_rows(path, fds[path], 11, (300, 1000, 20_000), rows)
    want.append((rows, b"".join(raw[11 + r * 20_000 :][:1000] for r in range(300))))
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for job in [*bulk._plan(), None]:
        todo.put(job)
    drv, read = _HostDriver(), bulk._read

    def reading(job, offset, mv):
        if len(mv):
            first = ctypes.addressof(ctypes.c_char.from_buffer(mv))
            drv.reading(first, first + len(mv))
        read(job, offset, mv)

    monkeypatch.setattr(bulk, "_read", reading)
    mine = torch.empty(depth * MIN_CHUNK, dtype=torch.uint8)
    bulk._loop_driver(todo, drv, 0, mine, [drv.event() for _ in range(depth)])
    assert drv.races == 0
    assert len(drv.copies) > 2 * depth  # (each buffer refilled)
    for dst, raw in want:
        assert dst.numpy().tobytes() == raw


def test_the_host_memory_budget_bounds_threads_times_buffers():
    assert fit(16, 1 << 30) == (16, bulk_read.CHUNK)  # 16 x 2 x 4 MiB: 128 MiB of buffers
    assert fit(16, 1 << 30, 16 * MiB) == (16, 16 * MiB)  # 512 MiB
    assert fit(16, 64 * MiB) == (16, 2 * MiB)  # smaller chunks first
    assert fit(16, 8 * MiB) == (4, MiB)  # then fewer threads
    for threads, budget in [(16, 1 << 30), (8, 100 * MiB), (3, 5 * MiB), (64, 2 * MiB)]:
        n, chunk = fit(threads, budget)
        assert n * bulk_read.DEPTH * chunk <= budget and n <= threads
    with pytest.raises(ReadError, match="raise FI_CONVERT_HOST_MEMORY"):
        fit(4, MiB)


@pytest.mark.parametrize("nbytes", [3 * MiB, 5 * MiB + 1, 64 * MiB])
def test_buffers_given_ahead_set_the_threads_and_chunks(two_files, nbytes):
    """A block allocated ahead (the plugin's) bounds the read's buffers, whatever its size."""
    data, fds = two_files
    path, fd = next(iter(fds.items()))
    ahead = bulk_read.HostBuffers(nbytes, pinned=False).allocate()
    bulk = BulkRead("cpu", threads=4, staged=True, buffers=ahead)
    assert bulk.threads * bulk_read.DEPTH * bulk.chunk <= nbytes
    dst = torch.empty(9 * MiB, dtype=torch.uint8)
    bulk.add(path, fd, 5, dst)
    bulk.run()
    assert dst.numpy().tobytes() == data[path][5 : 5 + 9 * MiB]
    assert ahead.held == nbytes  # the owner's to free
    ahead.free(background=False)
    assert ahead.held == 0


@pytest.mark.parametrize("background", [False, True])
def test_the_cache_is_emptied_once_nothing_holds_the_block(monkeypatch, background):
    """torch's cache of pinned blocks is emptied when nothing holds the block any more, so the
    memory goes back to the system (a reference kept by the freeing call, or by its thread's
    arguments, kept it pinned in torch's cache for the server's life)."""
    import weakref

    ahead = bulk_read.HostBuffers(2 * MiB, pinned=False).allocate()
    block = weakref.ref(ahead.block())
    seen: list[bool] = []
    empty = lambda: seen.append(block() is None)  # noqa: E731
    monkeypatch.setattr(torch._C, "_host_emptyCache", empty, raising=False)
    ahead.pinned = True  # (a CPU block, freed as a pinned one is)
    ahead.free(background=background)
    ahead.wait_freed()
    assert seen == [True] and ahead.held == 0


@pytest.mark.parametrize("staged", [False, True])
def test_abort_waits_for_readers_that_a_cut_join_marked_stopped(two_files, monkeypatch, staged):
    """CPython 3.11: a `Thread.join` cut short by Ctrl-C can mark a thread that still runs as
    stopped (gh-90882; then `is_alive()` is False and `join()` returns at once). The read must
    still wait for each reader's last act: one left inside torch at the interpreter's exit
    aborts the process ('terminate called without an active exception', seen under load)."""
    data, fds = two_files
    path, fd = next(iter(fds.items()))
    bulk = BulkRead("cpu", threads=2, chunk=MiB, staged=staged, host_memory="8MiB")
    bulk.add(path, fd, 0, torch.empty(len(data[path]), dtype=torch.uint8))
    inside = threading.Event()
    real = BulkRead._read

    def held(self, job, offset, mv):  # every read waits for the stop, then reads
        inside.set()
        self._stop.wait()
        return real(self, job, offset, mv)

    monkeypatch.setattr(BulkRead, "_read", held)
    bulk.start()
    inside.wait()
    for t in bulk._threads:  # as the cut join leaves them
        monkeypatch.setattr(t, "is_alive", lambda: False)
        monkeypatch.setattr(t, "join", lambda *a, **k: None)
    bulk.abort()
    assert len(bulk._ends) == len(bulk._threads)  # every reader got to its end
    assert bulk.pinned_bytes == 0
    monkeypatch.undo()
    for t in bulk._threads:  # (gone before the next test looks for readers)
        t.join()


def test_the_environment_sets_threads_and_budget(monkeypatch):
    monkeypatch.setenv("FI_CONVERT_READ_THREADS", "3")
    monkeypatch.setenv("FI_CONVERT_HOST_MEMORY", "24MiB")
    bulk = BulkRead("cpu")
    assert (bulk.threads, bulk.chunk) == (3, 4 * MiB)
    monkeypatch.setenv("FI_CONVERT_READ_THREADS", "many")
    with pytest.raises(ReadError, match="FI_CONVERT_READ_THREADS='many': not a thread count"):
        BulkRead("cpu")
    for bad in ("0", "-3", "100000", " "):
        monkeypatch.setenv("FI_CONVERT_READ_THREADS", bad)
        with pytest.raises(ReadError, match="not a thread count; give 1 to 128"):
            BulkRead("cpu")
    monkeypatch.setenv("FI_CONVERT_READ_THREADS", "2")
    monkeypatch.setenv("FI_CONVERT_HOST_MEMORY", "lots")
    with pytest.raises(ReadError, match="FI_CONVERT_HOST_MEMORY='lots': not a size"):
        BulkRead("cpu")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"threads": 0}, "threads=0: not a thread count"),
        ({"threads": "eight"}, "threads='eight': not a thread count"),
        ({"threads": True}, "threads=True: not a thread count"),
        ({"host_memory": "abc"}, "host_memory='abc': not a size"),
        ({"host_memory": [1]}, "host_memory=[1]: not a size"),
        ({"host_memory": "1KiB"}, "below the 2097152 one reader thread needs"),
    ],
)
def test_load_moe_layer_settings_that_make_no_sense_are_one_line(tmp_path, kw, words):
    from fi_convert import Backend, Options, SchemeName, convert, load_moe_layer
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    src = write_checkpoint(tmp_path / "src", Spec("qwen3-moe", layers=1, experts=2, shards=1))
    convert(src, tmp_path / "out", Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    with pytest.raises(ReadError, match=re.escape(words)):
        load_moe_layer(tmp_path / "out", "model.layers.0.mlp.experts", **kw)


# -- faults: one line naming the file, threads stopped, buffers freed -----------------------


def _one_tensor(path: Path, fd: int, staged: bool, size: int = 6 * MiB) -> BulkRead:
    bulk = BulkRead("cpu", threads=3, chunk=MIN_CHUNK, staged=staged, host_memory=64 * MiB)
    bulk.add(path, fd, 0, torch.empty(size, dtype=torch.uint8))
    return bulk


def _ends_clean(bulk: BulkRead) -> None:
    assert not reader_threads()
    assert bulk.pinned_bytes == 0


def _opened(tmp_path: Path, file_size: int, staged: bool) -> tuple[Path, int, BulkRead]:
    """A file of `file_size` bytes, open, and the read of its first 6 MiB as one tensor."""
    path = tmp_path / "model-00001-of-00002.safetensors"
    _file(path, file_size)
    fd = os.open(path, os.O_RDONLY)
    return path, fd, _one_tensor(path, fd, staged)


def _refusal(bulk: BulkRead, fd: int, match: str | None = None) -> str:
    """The line the read fails with, once the file is closed, the threads stopped and the
    buffers freed."""
    with pytest.raises(ReadError, match=match) as e:
        bulk.run()
    os.close(fd)
    _ends_clean(bulk)
    return str(e.value)


@pytest.mark.parametrize("staged", [False, True])
def test_a_file_shorter_than_its_ranges_is_refused_before_reading(tmp_path, staged):
    path, fd, bulk = _opened(tmp_path, 5 * MiB, staged)
    assert _refusal(bulk, fd) == (
        f"{path}: {5 * MiB} bytes, but its tensors reach byte {6 * MiB}: the file is "
        "truncated; restore it (convert or download it again)"
    )


def _faulty(monkeypatch, after: int, fault) -> None:
    """os.preadv of the reader threads fails once `after` reads have been made."""
    real, count, lock = os.preadv, [0], threading.Lock()

    def preadv(fd, bufs, offset):
        with lock:
            count[0] += 1
            n = count[0]
        return fault(fd, bufs, offset) if n > after else real(fd, bufs, offset)

    monkeypatch.setattr(bulk_read.os, "preadv", preadv)


@pytest.mark.parametrize("staged", [False, True])
def test_a_file_that_shrinks_while_it_is_read_is_one_line(tmp_path, monkeypatch, staged):
    path, fd, bulk = _opened(tmp_path, 6 * MiB, staged)
    _faulty(monkeypatch, 2, lambda fd, bufs, offset: 0)  # end of file: it shrank
    line = _refusal(bulk, fd)
    assert line.startswith(f"{path}: ends at byte ")
    assert line.endswith(
        "(truncated while it was loaded?); restore the file (convert or download it again), "
        "then load again"
    )


@pytest.mark.parametrize("staged", [False, True])
def test_an_io_error_is_one_line(tmp_path, monkeypatch, staged):
    path, fd, bulk = _opened(tmp_path, 6 * MiB, staged)

    def eio(fd, bufs, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    _faulty(monkeypatch, 1, eio)
    line = _refusal(bulk, fd, r"read failed at byte \d+ \(Input/output error\)")
    assert line.startswith(f"{path}: ")
    assert line.endswith("; check the disk, then load again")


@pytest.mark.parametrize("fault", ["eio", "short"])
def test_after_a_fault_nothing_holds_the_host_buffers(tmp_path, monkeypatch, fault):
    """The fault raised keeps no frame of a reader thread (whose locals are views of the
    buffers): the block is gone once the read has failed (on CUDA, pinned memory; test_gpu)."""
    import gc
    import weakref

    _, fd, bulk = _opened(tmp_path, 6 * MiB, True)
    seen = []
    real_block = bulk_read.HostBuffers.block

    def block(self):
        t = real_block(self)
        seen.append(weakref.ref(t))
        return t

    def eio(fd, bufs, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(bulk_read.HostBuffers, "block", block)
    _faulty(monkeypatch, 1, eio if fault == "eio" else lambda fd, bufs, offset: 0)
    with pytest.raises(ReadError):
        bulk.run()
    os.close(fd)
    bulk.wait_freed()
    gc.collect()
    assert seen and all(ref() is None for ref in seen)


def test_a_file_written_while_it_is_read_is_refused(tmp_path, monkeypatch):
    path, fd, bulk = _opened(tmp_path, 6 * MiB, True)
    real = os.preadv

    def touch_then_read(fd, bufs, offset):
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a write in place
        return real(fd, bufs, offset)

    _faulty(monkeypatch, 1, touch_then_read)
    assert _refusal(bulk, fd) == (
        f"{path}: changed while it was loaded; load again, and do not write an output while "
        "a server loads it"
    )


def test_the_file_written_while_it_is_read_is_the_one_named(two_files, monkeypatch):
    """Each file of a read is checked once at its end (not each job's): a write in place into
    the second of two files is refused naming that file, after both were read."""
    data, fds = two_files
    _, second = data
    bulk = BulkRead("cpu", threads=2)
    for path, fd in fds.items():
        bulk.add(path, fd, 0, torch.empty(len(data[path]), dtype=torch.uint8))
    real = os.preadv

    def touch_second(fd, bufs, offset):
        if fd == fds[second]:
            st = os.stat(second)
            os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return real(fd, bufs, offset)

    monkeypatch.setattr(bulk_read.os, "preadv", touch_second)
    with pytest.raises(ReadError) as e:
        bulk.run()
    assert str(e.value).startswith(f"{second}: changed while it was loaded")


def test_a_shard_replaced_after_its_header_is_read_whole_from_the_file_opened(
    tmp_path, monkeypatch
):
    """A shard's header and its bytes come from one open file: another file that takes its
    name after the header was read (a conversion writing the output again) is not read, and
    the load gives the opened file's tensors. Where the library's own check of the header is
    asked (it opens the name), the name must still be that file's."""
    from fi_convert import Backend, Options, SchemeName, convert
    from fi_convert.errors import ManifestError
    from fi_convert.format import reader as loader
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    src = write_checkpoint(tmp_path / "src", Spec("qwen3-moe", layers=1, experts=4, shards=1))
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    shard = next(out.glob("model-*.safetensors"))
    want = loader.load_moe_layer(out, "model.layers.0.mlp.experts")
    real = loader.read_header

    def replaced(path, *args):
        got = real(path, *args)
        os.rename(shard, tmp_path / "old")  # another file takes its name meanwhile
        shard.write_bytes(bytes(len((tmp_path / "old").read_bytes())))  # zeros, same size
        return got

    monkeypatch.setattr(loader, "read_header", replaced)
    with loader.OutputReader(out, library_check=False) as reader:
        got = {}
        for name in reader.layer("model.layers.0.mlp.experts")["tensors"]:
            got[name] = torch.empty_like(want[name])
            reader.read_into("model.layers.0.mlp.experts", name, 0, got[name])
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    os.replace(tmp_path / "old", shard)
    with pytest.raises(ManifestError, match=f"{shard}: replaced while it was opened; load again"):
        loader.load_moe_layer(out, "model.layers.0.mlp.experts")


def test_a_fifo_in_a_shards_place_is_refused_at_load_not_waited_on(tmp_path):
    """Opened for the load's reads, a FIFO where a shard should be would block until a writer
    came: it is refused in one line instead."""
    import threading

    from fi_convert import Backend, Options, SchemeName, convert
    from fi_convert.errors import FiConvertError
    from fi_convert.format import reader as loader
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    src = write_checkpoint(tmp_path / "src", Spec("qwen3-moe", layers=1, experts=4, shards=1))
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    shard = next(out.glob("model-*.safetensors"))
    shard.unlink()
    os.mkfifo(shard)
    got: list[BaseException] = []

    def load() -> None:
        try:
            loader.load_moe_layer(out, "model.layers.0.mlp.experts")
        except FiConvertError as e:
            got.append(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # (unblock it: a writer opens the FIFO)
        os.close(os.open(shard, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{shard}: the load waited on a FIFO")
    assert len(got) == 1 and str(got[0]).startswith(f"{shard}: not a regular file")


# -- Ctrl-C and SIGTERM in a real process -------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    import torch
    from fi_convert import bulk_read

    path, how = sys.argv[1], sys.argv[2]
    # a terminal's Ctrl-C, even where the suite runs as a background job (a shell ignores SIGINT
    # for those, and Python then leaves it ignored: the read was never interrupted)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if how == "term-handler":  # as vLLM's workers do: SIGTERM raises SystemExit
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    real = bulk_read.BulkRead._read
    said = threading.Event()

    def held(self, job, offset, mv):  # the first read holds until the read is stopped
        if how != "while-starting" and not said.is_set():
            said.set()
            print("reading", flush=True)
            self._stop.wait()
        return real(self, job, offset, mv)

    bulk_read.BulkRead._read = held
    if how == "while-starting":  # the signal comes while the second reader is being started
        real_start = threading.Thread.start

        def start(self):
            if self.name == "fi-convert-read-1":
                print("reading", flush=True)
                while signal.SIGINT not in signal.sigpending():  # held until all have started
                    time.sleep(0.001)
            real_start(self)

        threading.Thread.start = start
    fd = os.open(path, os.O_RDONLY)
    bulk = bulk_read.BulkRead("cpu", threads=4, chunk=1 << 20, staged=True)
    bulk.add(path, fd, 0, torch.empty(os.fstat(fd).st_size, dtype=torch.uint8))
    try:
        bulk.run()
    except BaseException as e:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("fi-convert-read")]
        print(json.dumps({"raised": type(e).__name__, "alive": alive,
                          "buffers": bulk.pinned_bytes}), flush=True)
        raise
    """
)


@pytest.mark.parametrize(
    ("sig", "how", "raised", "rc"),
    [
        (signal.SIGINT, "default", "KeyboardInterrupt", -signal.SIGINT),
        (signal.SIGINT, "while-starting", "KeyboardInterrupt", -signal.SIGINT),
        (signal.SIGTERM, "term-handler", "SystemExit", 143),
        (signal.SIGTERM, "default", None, -signal.SIGTERM),
    ],
)
def test_a_signal_during_the_read_stops_the_threads_and_frees_the_buffers(
    tmp_path, sig, how, raised, rc
):
    path = tmp_path / "model-00001-of-00001.safetensors"
    _file(path, 8 * MiB)
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout.readline() == "reading\n"  # a reader thread holds its first read
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == rc, err
    if raised is None:
        assert out == ""  # killed at once: no thread kept it alive
        return
    said = json.loads(out.splitlines()[-1])
    assert said == {"raised": raised, "alive": [], "buffers": 0}


@pytest.fixture
def ambient_meta():
    """The ambient default device set elsewhere (a caller's `torch.set_default_device`, a
    server's `with torch.device(...)` around the load); meta stands in for "cuda" on CPU."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("staged", [False, True])
def test_host_memory_is_on_the_cpu_whatever_the_ambient_device(two_files, ambient_meta, staged):
    data, fds = two_files
    block = bulk_read.HostBuffers(MIN_CHUNK, pinned=False).allocate().block()
    assert block.device.type == "cpu"
    bulk = BulkRead("cpu", threads=2, chunk=MIN_CHUNK, staged=staged, host_memory=16 * MiB)
    (path, raw), dst = (
        next(iter(data.items())),
        torch.empty(3 * MiB + 1, dtype=torch.uint8, device="cpu"),
    )
    bulk.add(path, fds[path], 5, dst)
    bulk.run()
    assert dst.view(torch.uint8).numpy().tobytes() == raw[5 : 5 + dst.nbytes]


def test_load_moe_layer_under_an_ambient_device_reads_the_same_bytes(tmp_path):
    from fi_convert import Backend, Options, SchemeName, convert, load_moe_layer
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    spec = Spec("deepseek-v3", layers=2, experts=4, hidden=256, intermediate=256)
    src = write_checkpoint(tmp_path / "src", spec)
    convert(src, tmp_path / "out", Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 1), device="cpu")
    want = load_moe_layer(tmp_path / "out", "model.layers.1.mlp.experts")
    torch.set_default_device("meta")
    try:
        got = load_moe_layer(tmp_path / "out", "model.layers.1.mlp.experts", device="cpu")
    finally:
        torch.set_default_device(None)
    assert sorted(got) == sorted(want)
    assert all(got[k].device.type == "cpu" and torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize(
    ("error", "cause", "fix"),
    [
        (torch.OutOfMemoryError("CUDA error: out of memory"), "out of memory", "lower"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory"), "out of memory", "lower"),
        (
            RuntimeError("Only dense CPU tensors can be pinned"),
            "Only dense CPU tensors can be pinned",
            "not a lack of memory",
        ),
        (
            RuntimeError("pin_memory=True requires a CUDA or other accelerator backend"),
            "requires a CUDA",
            "not a lack of memory",
        ),
    ],
)
def test_a_host_block_that_cannot_be_had_names_the_real_cause(monkeypatch, error, cause, fix):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(bulk_read.torch, "empty", fail)
    buffers = bulk_read.HostBuffers(1 << 29).allocate()
    with pytest.raises(ReadError) as e:
        buffers.block()
    line = str(e.value)
    assert "\n" not in line and cause in line and fix in line, line
    assert ("FI_CONVERT_HOST_MEMORY" in line) == (fix == "lower"), line


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["set_default_device", "with"])
def test_pinned_reads_into_the_gpu_under_an_ambient_cuda_device(two_files, how):
    data, fds = two_files
    (path, raw) = next(iter(data.items()))
    dst = torch.empty(3 * MiB + 1, dtype=torch.uint8, device="cuda")
    bulk = BulkRead("cuda", threads=2, chunk=MIN_CHUNK, host_memory=16 * MiB)
    bulk.add(path, fds[path], 5, dst)
    if how == "with":
        with torch.device("cuda"):
            bulk.run()
    else:
        torch.set_default_device("cuda")
        try:
            bulk.run()
        finally:
            torch.set_default_device(None)
    assert dst.cpu().numpy().tobytes() == raw[5 : 5 + dst.numel()]


@pytest.mark.parametrize("staged", [False, True])
def test_rows_land_whatever_bytes_each_preadv_returns(two_files, monkeypatch, staged):
    """preadv may return fewer bytes than asked (a signal, a network file system): the read
    goes on from the byte it stopped at, inside a row or a gap between rows."""
    data, fds = two_files
    path, raw = next(iter(data.items()))
    real, calls = os.preadv, []

    def short(fd, bufs, offset):
        calls.append(len(bufs))
        first = memoryview(bytearray(min(777, sum(len(b) for b in bufs))))
        n = real(fd, [first], offset)
        at = 0
        for b in bufs:  # the n bytes into the buffers, in order, as preadv would
            k = min(len(b), n - at)
            b[:k] = first[at : at + k]
            at += k
            if at == n:
                break
        return n

    monkeypatch.setattr(bulk_read.os, "preadv", short)
    bulk = BulkRead("cpu", threads=2, chunk=MIN_CHUNK, staged=staged, host_memory=64 * MiB)
    rows, size, stride = 300, 100, 1000
    dst = torch.empty(rows * size, dtype=torch.uint8)
    bulk.add_rows(path, fds[path], 5, (rows, size, stride), dst)
    bulk.run()
    want = b"".join(raw[5 + r * stride : 5 + r * stride + size] for r in range(rows))
    assert dst.numpy().tobytes() == want
    assert len(calls) > 300  # many short reads, each ending inside a row or a gap


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("first", [0, 4, 9])
def test_requests_added_while_the_read_runs_join_it(two_files, staged, first):
    """`start(more=True)`: the threads start with what there is (none, or some) while more
    requests are added (a model asked where its other tensors go, `format/whole_read.py`);
    `more` queues them, `wait` ends it. Every range lands, whichever part came when."""
    data, fds = two_files
    bulk = BulkRead("cpu", threads=3, chunk=MIN_CHUNK, staged=staged, host_memory=64 * MiB)
    spans = _spans(data, 7)
    assert len(spans) > first + 10
    want = []

    def add(part):
        for path, offset, size in part:
            dst = torch.empty(size, dtype=torch.uint8)
            bulk.add(path, fds[path], offset, dst)
            want.append((dst, data[path][offset : offset + size]))

    add(spans[:first])
    bulk.start(more=True)
    assert len(reader_threads()) == 3
    half = first + (len(spans) - first) // 2
    add(spans[first:half])
    bulk.more()
    add(spans[half:])
    bulk.more()
    stats = bulk.wait()
    for dst, raw in want:
        assert dst.numpy().tobytes() == raw
    assert stats.bytes == sum(len(raw) for _, raw in want) and stats.threads == 3
    assert stats.read_bytes >= stats.bytes and 0 < stats.seconds < 60
    assert bulk.pinned_bytes == 0 and not reader_threads()
    with pytest.raises(ValueError, match="not started with more=True, or ended"):
        bulk.more()


@pytest.mark.parametrize("staged", [False, True])
def test_requests_join_a_running_read_as_they_come_where_it_feeds(two_files, staged):
    """`BulkRead.feed`: on a read started with more=True, requests join it each time that many
    bytes of them have come (before `more`), rows as plain ranges; every byte lands, once."""
    data, fds = two_files
    (a, raw_a), (b, raw_b) = data.items()
    bulk = BulkRead("cpu", threads=2, chunk=MIN_CHUNK, staged=staged, host_memory=16 * MiB)
    bulk.start(more=True)
    bulk.feed = 2 * MiB
    want, queued = [], []
    for k in range(6):  # 1 MiB each: joined after the 2nd, 4th and 6th
        dst = torch.empty(MiB, dtype=torch.uint8)
        bulk.add(a, fds[a], k * MiB + 3, dst)
        want.append((dst, raw_a[k * MiB + 3 : (k + 1) * MiB + 3]))
        queued.append(sum(j.size for j in bulk._jobs))
    rows = torch.empty(3 * 4096, dtype=torch.uint8)
    bulk.add_rows(b, fds[b], 5, (3, 4096, MiB), rows)  # 12 KiB: not joined yet
    queued.append(sum(j.size for j in bulk._jobs))
    bulk.feed = 0
    bulk.more()
    bulk.wait()
    assert queued == [0, 2 * MiB, 2 * MiB, 4 * MiB, 4 * MiB, 6 * MiB, 6 * MiB]
    for dst, raw in want:
        assert dst.numpy().tobytes() == raw
    got = rows.numpy().tobytes()
    assert got == b"".join(raw_b[5 + r * MiB : 5 + r * MiB + 4096] for r in range(3))
    assert len(bulk._jobs) == len({id(j) for j in bulk._jobs}) and not reader_threads()


@pytest.mark.parametrize("staged", [False, True])
def test_a_read_waiting_for_more_requests_stops_when_aborted(two_files, staged):
    """Its threads wait for requests that never come (the model's asking failed): `abort`
    ends them at once, and a truncated file among the later requests is refused as at the
    start, the read then aborted by its caller."""
    data, fds = two_files
    path = next(iter(data))
    bulk = BulkRead("cpu", threads=2, chunk=MIN_CHUNK, staged=staged, host_memory=64 * MiB)
    bulk.start(more=True)
    assert len(reader_threads()) == 2
    bulk.add(path, fds[path], len(data[path]) - 10, torch.empty(20, dtype=torch.uint8))
    with pytest.raises(ReadError, match="the file is truncated"):
        bulk.more()
    bulk.abort()
    assert not reader_threads() and bulk.pinned_bytes == 0


def test_a_read_that_never_got_a_request_ends_at_once(two_files):
    """Started ahead with nothing (the model asked had no tensor to read), `wait` ends it:
    nothing read, no time taken."""
    bulk = BulkRead("cpu", threads=2, chunk=MIN_CHUNK, staged=True, host_memory=64 * MiB)
    bulk.start(more=True)
    stats = bulk.wait()
    assert (stats.bytes, stats.read_bytes, stats.seconds, stats.jobs) == (0, 0, 0.0, 0)
    assert not reader_threads() and bulk.pinned_bytes == 0
