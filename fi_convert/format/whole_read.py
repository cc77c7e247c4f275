"""A rank's whole read of an output into a server's model: the model is asked where its
non-expert tensors' bytes go (`dense.DenseLoad`), those ranges and the experts' are read in one
bulk read, and the model's `load_weights` runs over the non-expert tensors once every byte is
in place. A fault or an interrupt anywhere stops the readers and frees their memory, then goes
on. What the read needs before it (`Ahead`: the pinned block, the reader threads, the output
opened with its shards' headers read) is set up while the server builds the model.

The reader threads start while the server builds the model, and the model is asked once it is
built (`ORDER`). Measured on an H100 (docs/speed.md, the sixth and seventh sessions): started
with the read, the 16th thread began 5-9 ms after the first, each start waiting for the
interpreter's lock beside threads already reading; started just before the asking, all began
within 0.6 ms of the read, but starting them cost as much before it; started while the model
is built, their start is under the build: at 4 MiB chunks, rank 0 of TP 8 of gpt-oss-120b in
48 ms against 57 asked first, Qwen3-30B-A3B in 68 against 73 (medians of 5 on a noisy host;
per run against the limit, 1.17 against 1.42, and 1.35 against 1.23); at 16 MiB the two orders
were even. With the asking under the experts' read, the asking, pure Python, ran slower beside
16 reader threads each taking the interpreter's lock between its chunks (20-41 ms instead of
3-6 with the lean loop). Measured again on an H100 with a model built of vLLM's own layers,
whose asking costs what vLLM's own model classes' does (the tenth session, 2026-12-07), with
the threads started while the model is built (`ask-under-read-at-build`): at rank 0 of TP 8 the
asking took 22-35 ms under the read instead of 3-5 before it, the readers ended 8-9 ms later,
and the load was 1.23-1.39 of the limit against 1.20-1.22; a shorter switch interval while
asking (`SWITCH`) did not help. Nor did, the twelfth session: longer first reads
(`bulk_read.LEAD`), the experts' requests fed to the read as they come (`FEED`), the readers'
driver calls giving the lock up (`cuda_driver.HOLD=False`), or fewer readers (8-14): at best
even with the asking first at its best thread count. Nor, the thirteenth, did one long read a
thread (2-8 chunks) under the asking, the rest after it: at LEAD 2 even, at 4 and 8 the asking
and the read both slower, 1.33-1.54 of the limit against 1.03-1.29 (an order tried and taken
out again; docs/speed.md)."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import child_read
from ..bulk_read import (
    BulkRead,
    HostBuffers,
    ReadStats,
    _bare,
    default_host_memory,
    default_threads,
    fit,
    host_buffers,
    read_device,
)
from . import plan_cache
from .dense import DenseLoad
from .reader import OutputReader


@dataclass
class WholeRead:
    moe_bytes: int  # the experts' bytes of the read
    stats: ReadStats  # the read's (experts and the directly read other bytes)
    dense: DenseLoad
    read_started: float  # perf_counter() as the read started, and as it ended
    read_ended: float
    asked_in_read: bool = False  # the model asked after the read started (an order under it)


# The order of a load, a setting for the benches (`--alt-bulk
# set:fi_convert.format.whole_read:ORDER='ask-first'`): "threads-at-build" (the reader threads
# started while the server builds the model, `Ahead`; the model asked, then every request at
# once), "ask-first" (the model asked, then the threads started with every request),
# "threads-ahead" (the reader threads started, the model asked, then every request at once),
# "ask-under-read" (the experts' read started, the model asked under it, its requests joining
# it), "ask-under-read-at-build" (as ask-under-read, with the threads started while the server
# builds the model, as threads-at-build).
ORDER = "threads-at-build"
ORDERS = (
    "threads-at-build",
    "ask-first",
    "threads-ahead",
    "ask-under-read",
    "ask-under-read-at-build",
)
AT_BUILD = ("threads-at-build", "ask-under-read-at-build")
UNDER = ("ask-under-read", "ask-under-read-at-build")
# In the orders that ask the model under the read, the experts' requests join the read as they
# are added, each time this many bytes of them have come (0: all at once, once added); a bench
# setting: the read starts after the first layers' are planned, not every layer's.
FEED = 0
# The interpreter's switch interval (seconds) while the model is asked under the read, then
# set back; None: as it is (5 ms by default). A reader thread back from its read waits that
# long for the interpreter's lock while the asking holds it.
SWITCH: float | None = None
# The output opened (its index and every shard's header read) in the background while the
# server builds the model, where the server's load names it to `Ahead`; a bench setting
# (False: opened by the load, as before the thirteenth session).
OPEN_AHEAD = True


class Ahead:
    """What a server's load sets up while the server builds the model: into a GPU, the pinned
    block (pinned in the background); in the order "threads-at-build", the read with its
    threads started, waiting for their work; given the output (`output`: its folder and
    manifest), the output opened and its shards' headers read, in the background (an
    output's index and headers: 9 ms for a 146-shard one on a 2-core VM). `read` and `reader`
    hand those to the load; `close` stops the threads no load took (the build failed), frees
    the block and closes the output no load took, in every case. With `child_read.PROCESS` (a
    bench setting) in the at-build orders, the ring and the child that reads into it instead
    of the block and the threads (`ring`), closed with it."""

    def __init__(self, device: str | torch.device, output: tuple[Path, dict] | None = None) -> None:
        """A setting that is wrong (`FI_CONVERT_READ_THREADS`, `FI_CONVERT_HOST_MEMORY`,
        `FI_CONVERT_PLAN_CACHE`) is its one-line error, with nothing left pinned or running. A
        fault opening the output comes out of `reader`, at the load, as it would there."""
        _check_order()
        plan_cache.folder()  # (the load's is taken there: a wrong one refused before the build)
        self.buffers: HostBuffers | None = None
        self._bulk: BulkRead | None = None
        self._opening: _Opening | None = None
        self.ring: child_read.ChildRing | None = None
        try:
            if output is not None and OPEN_AHEAD:
                self._opening = _Opening(*output)
            if child_read.PROCESS and ORDER in AT_BUILD:  # (on the CPU: tests)
                threads, chunk = fit(default_threads(), default_host_memory())
                self.ring = child_read.ChildRing(device, child_read.ring_bytes(), chunk, threads)
                self._bulk = child_read.ProcessRead(device, ring=self.ring)
                self._bulk.start(more=True)
                return
            if read_device(device).type == "cuda":
                self.buffers = host_buffers().allocate(background=True)
            if ORDER in AT_BUILD:
                self._bulk = BulkRead(device, buffers=self.buffers)
                self._bulk.start(more=True)
        except BaseException:
            self.close()
            raise

    def read(self, reader: Any, device: str | torch.device) -> BulkRead:
        """The read into `device` (`reader`'s, an `OutputReader`): the one started ahead, if it
        reads there; once."""
        bulk, self._bulk = self._bulk, None
        if bulk is not None and bulk.device == read_device(device):
            return bulk
        if bulk is not None:  # (the model built elsewhere than the server said)
            bulk.abort()
        return reader.bulk(device, buffers=self.buffers)

    def reader(self, root: Path) -> OutputReader | None:
        """The output at `root` as opened ahead (once; its fault, if opening it failed); None
        where none was, or another folder was (closed)."""
        opening, self._opening = self._opening, None
        if opening is not None and opening.root == root:
            return opening.take()
        if opening is not None:
            opening.drop()
        return None

    def close(self) -> None:
        if self._bulk is not None:
            self._bulk.abort()
            self._bulk = None
        if self.buffers is not None:
            self.buffers.free()
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self._opening is not None:
            self._opening.drop()
            self._opening = None


class _Opening:
    """An output opened on a thread of its own (`OutputReader`, the plugins' way: fi-convert's
    own strict parse of each header, without the safetensors library's), every shard's header
    read: `take` waits for it, `drop` closes it whenever it is done."""

    def __init__(self, root: Path, manifest: dict) -> None:
        self.root = root
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._dropped = False
        self._reader: OutputReader | None = None
        self._error: BaseException | None = None
        threading.Thread(
            target=self._open, args=(manifest,), name="fi-convert-open", daemon=True
        ).start()

    def _open(self, manifest: dict) -> None:
        reader = None
        try:
            reader = OutputReader(self.root, manifest, library_check=False)
            for shard in reader.shards():
                reader.header(shard)
        except BaseException as e:  # (said by the load that takes it)
            if reader is not None:
                reader.close()
            reader, self._error = None, _bare(e)
        with self._lock:
            if self._dropped and reader is not None:
                reader.close()
            elif not self._dropped:
                self._reader = reader
        self._done.set()

    def take(self) -> OutputReader:
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._reader is not None
        return self._reader

    def drop(self) -> None:
        with self._lock:
            self._dropped = True
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()


def open_output(ahead: Ahead | None, root: Path, manifest: dict) -> OutputReader:
    """A load's output, opened: `ahead`'s (once), or opened now."""
    opened = ahead.reader(root) if ahead is not None else None
    return OutputReader(root, manifest, library_check=False) if opened is None else opened


def new_read(ahead: Ahead | None, reader: Any, device: str | torch.device) -> BulkRead:
    """A load's read into `device`: `ahead`'s (once), or `reader`'s own."""
    return ahead.read(reader, device) if ahead is not None else reader.bulk(device)


def load_output(
    ahead: Ahead | None,
    root: Path,
    manifest: dict,
    device: str | torch.device,
    add_experts: Callable[[OutputReader, BulkRead], None],
    model: torch.nn.Module,
    load_weights: Callable[[Any], Any],
    context: Callable[[], plan_cache.Context],
) -> WholeRead:
    """A whole load of the output at `root` into `model` on `device`, as each server's loader
    runs it: the output opened (`ahead`'s, or now), its bulk read, `add_experts(reader, bulk)`
    for the experts' requests, and the model asked (or its kept answer taken) through
    `load_weights` for the other tensors (`read_whole`). `context()` is the plan cache's key
    from the server, made once the experts' requests are in (as the model is asked)."""
    with open_output(ahead, root, manifest) as reader:
        bulk = new_read(ahead, reader, device)
        return read_whole(
            bulk,
            lambda b: add_experts(reader, b),
            lambda: DenseLoad(
                reader, model, load_weights, bulk.device, host_memory_left(ahead), context()
            ),
        )


def host_memory_left(ahead: Ahead | None) -> int:
    """The host memory budget the experts' pinned buffers leave (the model's other tensors'
    batches)."""
    held = 0
    if ahead is not None and ahead.buffers is not None:
        held = ahead.buffers.nbytes
    elif ahead is not None and ahead.ring is not None:
        held = ahead.ring.nbytes
    return default_host_memory() - held


@contextlib.contextmanager
def _switch_interval(seconds: float | None) -> Iterator[None]:
    if seconds is None:
        yield
        return
    was = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(was)


def _check_order() -> None:
    if ORDER not in ORDERS:
        raise ValueError(f"whole_read.ORDER {ORDER!r}: not one of {', '.join(ORDERS)}")


def read_whole(
    bulk: BulkRead,
    add_experts: Callable[[BulkRead], None],
    dense_load: Callable[[], DenseLoad],
) -> WholeRead:
    """`dense_load` asks the model where its other tensors go; `add_experts` puts the
    experts' requests into `bulk` (not started, or started by `Ahead` with more to come). The
    cyclic garbage collector is held off throughout (`_collector_held`)."""
    _check_order()
    with _collector_held():
        return _read_whole(bulk, add_experts, dense_load)


@contextlib.contextmanager
def _collector_held() -> Iterator[None]:
    """The interpreter's cyclic garbage collector off while the load runs, then as it was. A
    full collection holds the interpreter's lock for all its objects (40 ms for a bare torch
    process's 166,000 on an H100's host, the tenth session; a server's are more), and the
    asking makes many objects, so one could come due mid-load: every reader thread would wait
    it out, its pipeline idle. Held off, it comes after the load, where the servers collect
    anyway (vLLM 0.33 and SGLang 0.5.23 before capturing their CUDA graphs, vLLM again as it
    freezes its heap at the end of its start)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_whole(
    bulk: BulkRead,
    add_experts: Callable[[BulkRead], None],
    dense_load: Callable[[], DenseLoad],
) -> WholeRead:
    dense: DenseLoad | None = None
    try:
        if ORDER in UNDER:
            if FEED and not bulk.started:
                bulk.start(more=True)  # (the experts' requests join it as they come)
            bulk.feed = FEED  # (where set, the read is started)
            t0 = time.perf_counter()
            try:
                add_experts(bulk)
            finally:
                bulk.feed = 0
            moe_bytes = bulk.nbytes
            t1 = t0 if FEED else time.perf_counter()
            if bulk.started:  # (its threads waiting for their work)
                bulk.more()
            else:
                bulk.start(more=True)
            held = getattr(bulk, "copies_held", None) if child_read.HOLD else None
            with _switch_interval(SWITCH), held() if held else contextlib.nullcontext():
                dense = dense_load()
        else:
            if ORDER == "threads-ahead" and not bulk.started:
                bulk.start(more=True)  # its threads, waiting for their work
            dense = dense_load()
            add_experts(bulk)
            moe_bytes = bulk.nbytes
            t1 = time.perf_counter()
        dense.add_to(bulk)
        if bulk.started:
            bulk.more()
        else:  # ask-first (and threads-at-build where nothing started ahead)
            bulk.start()
        dense.prefetch()
        dense.keep()  # (as the read goes)
        stats = bulk.wait()
        t2 = time.perf_counter()
        dense.finish()
    except BaseException:
        bulk.abort()
        if dense is not None:
            dense.abort()
        raise
    return WholeRead(moe_bytes, stats, dense, t1, t2, ORDER in UNDER)
