"""The conversion entry point: plan, claim the out-dir, stream shards, write the manifest last."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol

import torch

from . import dtypes, outdir
from . import manifest as mf
from .errors import OutputError
from .format.names import INDEX_NAME, MANIFEST_NAME
from .outdir import OutDir
from .plan import Item, Options, Plan, ShardPlan, make_plan
from .schemes.base import Ctx, OutputTensor
from .st_io import DiskRoom, ShardWriter, SourceFiles, TensorInfo

COPY_CHUNK = 64 * 2**20  # largest piece of a carried-over tensor in flight
MAX_JOBS = 8  # shards converted at once, at most (see `_jobs`)
# Tests only: SIGKILL this process after that many chunk writes, to prove runs resume.
_KILL_AFTER = int(os.environ.get("_FI_CONVERT_KILL_AFTER_WRITES", "0") or 0)
_writes = 0


@dataclass
class Progress:
    """Reported to the caller's callback after each unit of work."""

    bytes_done: int
    bytes_total: int
    tensors_done: int
    tensors_total: int
    current: str
    bytes_reused: int = 0  # of bytes_done: an earlier run's files, counted done, not made now
    # said once, at the start: the files an earlier run left that this run reuses (each is
    # checked against its SHA-256 first, and made again where it differs)
    resume_files: int = 0
    resume_bytes: int = 0


ProgressFn = Callable[[Progress], None]


@dataclass
class Result:
    out_dir: Path
    plan: Plan
    manifest: dict
    reused_files: list[str]
    device: str
    jobs: int = 1  # shards that were converted at once (0: none, the output was up to date)
    up_to_date: bool = False  # the out-dir held this conversion already: nothing was written
    warnings: list[str] = field(default_factory=list)  # found while converting (NaN scales)

    def summary(self) -> dict:
        s = self.plan.summary()
        return {
            **s,
            "warnings": s["warnings"] + self.warnings,
            "up_to_date": self.up_to_date,
            "out_dir": str(self.out_dir),
            "device": self.device,
            "files": len(self.manifest["files"]),
            "reused_files": self.reused_files,
            "jobs": self.jobs,
            "manifest": MANIFEST_NAME,
        }


_DEVICE = re.compile(r"^(cpu|cuda)(:\d+)?$")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not _DEVICE.match(device) or device.startswith("cpu:"):
        hint = " (did you mean cuda?)" if device.lower() in ("gpu", "nvidia", "cuda0") else ""
        raise OutputError(f"--device {device}: not a device{hint}; use auto, cpu, cuda or cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OutputError(f"--device {device}: no CUDA device is available here; use --device cpu")
    dev = torch.device(device)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise OutputError(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA devices "
            f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}); choose one of them"
        )
    return dev


def convert(
    source: str | Path,
    out_dir: str | Path,
    options: Options | None = None,
    *,
    device: str = "auto",
    overwrite: bool = False,
    progress: ProgressFn | None = None,
    jobs: int = 0,
    fsync: bool = True,
) -> Result:
    """Convert `source` into `out_dir`. Raises `FiConvertError` subclasses on bad input.

    `jobs` output shards are converted at once (0: as many as CPUs and the memory budget
    allow, at most `MAX_JOBS`); the output bytes do not depend on it. With `fsync` (the
    default) every file is on disk before the manifest is written, so the manifest's claim
    survives a power loss; without it, only a crash or kill of this process."""
    plan = make_plan(source, options or Options())
    return run_plan(
        plan,
        Path(out_dir),
        device=device,
        overwrite=overwrite,
        progress=progress,
        jobs=jobs,
        fsync=fsync,
    )


def run_plan(
    plan: Plan,
    out_dir: Path,
    *,
    device: str = "auto",
    overwrite: bool = False,
    progress: ProgressFn | None = None,
    jobs: int = 0,
    fsync: bool = True,
) -> Result:
    dev = resolve_device(device)
    with OutDir(out_dir, plan, overwrite, fsync=fsync) as od:
        if od.up_to_date:  # the identical conversion is there: nothing is written
            assert od.manifest is not None
            names = sorted(od.manifest["files"])
            return Result(out_dir, plan, od.manifest, names, str(dev), 0, True, od.notes)
        files = od.write_side_files()
        resume = od.resumable(plan.shards)
        written = write_shards(plan, od, SourceFiles(), dev, progress, jobs, resume=resume)
        files.update(written.files)
        files[INDEX_NAME] = od.write_index()
        od.remove_stale(set(files))
        od.flush(files)  # everything durable before the manifest claims it
        manifest = mf.build(plan, files)
        od.commit(manifest)
        reused = sorted(od.reused)
    return Result(
        out_dir, plan, manifest, reused, str(dev), written.jobs, False, od.notes + written.warnings
    )


class ShardSink(Protocol):
    """Where finished shards go next (the Hub, for a streamed conversion): `before` is called
    before a shard is made (it may wait, for disk room; it returns the shard's meta instead
    when the sink holds that shard already), `after` once it is complete; `abandon` when the
    run stops, so that a worker waiting in it gives up."""

    def before(self, shard: ShardPlan) -> dict | None: ...

    def after(self, shard: ShardPlan, meta: dict) -> None: ...

    def abandon(self) -> None: ...


class ShardDir(Protocol):
    """What the shard writers need of an out-dir (OutDir, or a streamed run's staging)."""

    root: Path
    room: DiskRoom | None  # a disk budget the writers draw on, if any

    def shard(self, shard: ShardPlan, write: Callable[[ShardPlan], ShardWriter]) -> dict: ...

    def copy_file(self, src: Path, rel: str) -> dict: ...

    @property
    def writeback(self) -> bool:
        """Files to be made durable: their writes go on to the disk at once."""
        ...


@dataclass
class Written:
    files: dict[str, dict]  # shard name -> sha256 and size
    jobs: int
    warnings: list[str]


def write_shards(
    plan: Plan,
    od: ShardDir,
    source: SourceFiles,
    dev: torch.device,
    progress: ProgressFn | None = None,
    jobs: int = 0,
    sink: ShardSink | None = None,
    resume: tuple[int, int] = (0, 0),
) -> Written:
    """Every shard of `plan` into `od`, `jobs` at a time, reading through `source`. `resume`
    (files, bytes) an earlier run left to reuse is reported with the first progress."""
    src = _CheckedFiles(source)
    shards = _Shards(plan, od, src, dev, _Tracker(plan, progress, resume), jobs, sink)
    try:
        files = shards.run()
    finally:
        src.close()
    return Written(files, shards.jobs, src.warnings())


def is_scale(name: str) -> bool:
    """Whether a tensor is a scale (weight_scale, weight_scale_inv, input_scale,
    weight_scale_2, weight_global_scale, gpt-oss `*_scales`, k_scale, ...)."""
    return "scale" in name.rsplit(".", 1)[-1]


def nonfinite(t: torch.Tensor, dtype: str) -> int:
    """How many values of `t` (a source tensor of safetensors `dtype`) are NaN or Inf; U8
    scales are E8M0 exponents, whose 0xFF is NaN."""
    if dtype in ("U8", "F8_E8M0"):
        return int((t.view(torch.uint8) == 0xFF).sum())
    if not t.dtype.is_floating_point:
        return 0
    x = t.float() if t.element_size() == 1 else t
    return int(x.numel() - torch.isfinite(x).sum())


class _CheckedFiles(SourceFiles):
    """Source reads (through `base`) that look at every scale they read: a NaN or Inf in a
    scale would make the weights it scales NaN or Inf in the output, so each such tensor is
    named once in the run's warnings (the conversion goes on: an expert that is never routed
    to may carry one)."""

    NAMED = 3  # scale tensors named one line each; more are said in one line

    def __init__(self, base: SourceFiles) -> None:
        super().__init__()
        self.base, self.local, self.read_ahead = base, base.local, base.read_ahead
        self.bad: dict[str, int] = {}  # scale tensor -> NaN or Inf values seen
        self._seen = threading.Lock()

    def fd(self, path: Path) -> int:
        return self.base.fd(path)

    def read_bytes(self, path: Path, offset: int, dst: torch.Tensor) -> None:
        self.base.read_bytes(path, offset, dst)

    def prefetch(self, info: TensorInfo, start: int, count: int) -> None:
        self.base.prefetch(info, start, count)

    def prefetch_bytes(self, path: Path, offset: int, nbytes: int) -> None:
        self.base.prefetch_bytes(path, offset, nbytes)

    def close(self) -> None:
        self.base.close()

    def read_rows(self, info: TensorInfo, start: int, stop: int, dst: torch.Tensor) -> None:
        self.base.read_rows(info, start, stop, dst)
        self.check(info, dst)

    def read(self, info: TensorInfo) -> torch.Tensor:
        t = self.base.read(info)
        self.check(info, t)
        return t

    def check(self, info: TensorInfo, t: torch.Tensor) -> None:
        if is_scale(info.name) and (n := nonfinite(t, info.dtype)):
            with self._seen:
                self.bad[info.name] = self.bad.get(info.name, 0) + n

    def warnings(self) -> list[str]:
        """One line per scale tensor, or, past NAMED of them, one line for all."""
        bad = sorted(self.bad.items())
        if len(bad) > self.NAMED:
            return [
                f"{len(bad)} scale tensors hold NaN or Inf values ({sum(n for _, n in bad)} in "
                f"all; first {bad[0][0]}, last {bad[-1][0]}); the weights they scale are NaN or "
                "Inf in the output too - check the source checkpoint"
            ]
        return [
            f"{name}: {n} NaN or Inf value(s) in this scale; the weights it scales are NaN or "
            "Inf in the output too - check the source checkpoint"
            for name, n in bad
        ]


class _Cancelled(Exception):
    """Raised in a shard's worker when another worker failed or the run was interrupted."""


def _jobs(plan: Plan, jobs: int, pinned: bool = False) -> int:
    """Shards converted at once: `jobs`, or (0) one per CPU up to MAX_JOBS; never more than
    there are shards, nor so many that a worker's share of the memory budget cannot hold a
    chunk of one expert."""
    n = len(plan.shards)
    if jobs <= 0:
        jobs = min(MAX_JOBS, len(os.sched_getaffinity(0)))
    outs = [o for lp in plan.layers for o in lp.outputs if o.chunked]
    need = max((_chunk_need(o, pinned) for o in outs), default=1)
    return max(1, min(jobs, n, plan.options.max_memory // need))


def _chunk_need(o: OutputTensor, pinned: bool = False) -> int:
    """The least budget a worker needs for `o`: its host memory for chunks of one expert."""
    return _host_bytes(max(o.expert_nbytes, o.stage_nbytes, 1), pinned)


def _host_bytes(chunk: int, pinned: bool) -> int:
    """Host memory a worker may hold for chunks of `chunk` bytes: DEPTH + 1 ring buffers and
    the staging, plus room for two chunks of temporaries. Pinned memory comes from PyTorch's
    caching host allocator, which rounds each block up to a power of two."""
    block = 1 << (chunk - 1).bit_length() if pinned else chunk
    return (DEPTH + 2) * block + 2 * chunk


class _Shards:
    """Converts a plan's shards, `jobs` at a time. Each worker thread owns one host-buffer
    ring sized to its share of the memory budget (and on CUDA a stream of its own); the first
    failure cancels the other workers, which remove their temporary files."""

    def __init__(
        self,
        plan: Plan,
        od: ShardDir,
        src: SourceFiles,
        dev: torch.device,
        tr: _Tracker,
        jobs: int,
        sink: ShardSink | None = None,
    ) -> None:
        self.plan, self.od, self.src, self.dev, self.tr, self.sink = plan, od, src, dev, tr, sink
        self.jobs = _jobs(plan, jobs, pinned=dev.type == "cuda")
        self.budget = plan.options.max_memory // self.jobs
        self.cancel = threading.Event()
        # per worker, made on first use (carry-over-only runs need none) and kept for the run:
        # a host-buffer ring, staging buffers (in the Ctx) and a CUDA stream (the caching
        # allocator reuses device memory within a stream; a stream per shard would strand
        # each shard's blocks)
        self.slots: queue.SimpleQueue[tuple[_Ring, Ctx, torch.cuda.Stream | None] | None]
        self.slots = queue.SimpleQueue()
        for _ in range(self.jobs):
            self.slots.put(None)

    def run(self) -> dict[str, dict]:
        """Every shard on a worker, one job too: this thread hands them out and waits, with
        signals held (`_signals_held`) and taken between waits, so a Ctrl-C always stops
        every worker (each removes its temporary file) before the out-dir's cleanup."""
        shards = self.plan.shards
        pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="fi-convert-shard")
        with _signals_held() as take:
            try:
                futures = [pool.submit(self._one, s) for s in shards]
                self._wait(futures, take)
                return {s.name: f.result() for s, f in zip(shards, futures, strict=True)}
            except BaseException:  # Ctrl-C included: stop the workers, let them clean up
                self._stop()
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)

    def _wait(self, futures: list[Future], take: Callable[[], None]) -> None:
        """Until every shard is done; after a failure, until the others stopped, then raises
        the first error. Signals that came are taken every TAKE_SIGNALS_S."""
        when = FIRST_EXCEPTION
        while True:
            done, pending = wait(futures, TAKE_SIGNALS_S, when)
            take()
            if not pending:
                break
            if when == FIRST_EXCEPTION and any(f.exception() is not None for f in done):
                self._stop()
                when = ALL_COMPLETED
        errors = [e for f in futures if (e := f.exception()) is not None]
        real = [e for e in errors if not isinstance(e, _Cancelled)]
        if errors:
            raise (real or errors)[0]

    def _stop(self) -> None:
        """Tell the workers to stop, also those waiting for the sink (for disk room)."""
        self.cancel.set()
        if self.sink is not None:
            self.sink.abandon()

    def _check_carried(self, shard: ShardPlan) -> None:
        """Read the scales of a shard carried over byte for byte, to check them."""
        for it in shard.items:
            if it.source is not None and is_scale(it.source.name):
                self.src.read(it.source)

    def _one(self, shard: ShardPlan) -> dict:
        if self.cancel.is_set():
            raise _Cancelled
        if self.sink is None:
            return self._make(shard)
        if (held := self.sink.before(shard)) is not None:  # the sink holds it already
            self.tr.advance(shard.nbytes, len(shard.items), shard.items[-1].entry.name, True)
            return held
        meta = self._make(shard)
        self.sink.after(shard, meta)
        return meta

    def _make(self, shard: ShardPlan) -> dict:
        if shard.copy_of is not None:  # no experts: the source shard, byte for byte
            self._check_carried(shard)
            meta = self.od.copy_file(shard.copy_of, shard.name)
            reused = shard.name in getattr(self.od, "reused", ())  # OutDir's; not staging's
            self.tr.advance(shard.nbytes, len(shard.items), shard.items[-1].entry.name, reused)
            return meta
        slot = self.slots.get()
        try:
            if slot is None:
                cuda = self.dev.type == "cuda"
                ring = _Ring(self.plan, self.budget, cuda, None if cuda else CPU_CHUNK)
                slot = ring, Ctx(self.src, self.dev), _new_stream(self.dev)
            ring, ctx, stream = slot
            made = []

            def write(s: ShardPlan) -> ShardWriter:
                made.append(s)
                return _write_shard(s, ctx, self.plan, self.od, self.tr, ring, self)

            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                meta = self.od.shard(shard, write)
            if not made:  # an earlier run's file, reused: its bytes are done all the same
                self.tr.advance(shard.nbytes, len(shard.items), shard.items[-1].entry.name, True)
            return meta
        finally:
            self.slots.put(slot)


TAKE_SIGNALS_S = 0.25  # how long a signal held while the shards are converted may wait


@contextlib.contextmanager
def _signals_held() -> Iterator[Callable[[], None]]:
    """In the block, SIGINT and SIGTERM handlers of Python's only note that the signal came;
    the block calls what it yields to run them where it is safe, and they run at its end.
    A KeyboardInterrupt raised anywhere in concurrent.futures or threading can break them: in
    `Thread.start` it leaves the worker out of the pool's threads (the shutdown does not wait
    for it), and just after a `Condition` is entered it leaves that lock held (a worker
    finishing its future then waits for it forever). Only the main thread takes signals."""
    main = threading.current_thread() is threading.main_thread()
    sigs = (signal.SIGINT, signal.SIGTERM) if main else ()
    old = {n: h for n in sigs if callable(h := signal.getsignal(n))}
    came: list[int] = []
    holding = True

    def note(signum: int, frame: FrameType | None) -> None:
        if holding:
            came.append(signum)
        else:  # the block is over (its handlers being set back)
            old[signal.Signals(signum)](signum, frame)

    def take() -> None:
        while came:
            signum = came.pop(0)
            old[signal.Signals(signum)](signum, None)

    for n in old:
        signal.signal(n, note)
    try:
        yield take
    finally:
        holding = False
        for n, h in old.items():
            signal.signal(n, h)
        take()


def _new_stream(dev: torch.device) -> torch.cuda.Stream | None:
    """On CUDA, a stream for a worker, so that workers' copies and kernels overlap."""
    return torch.cuda.Stream(dev) if dev.type == "cuda" else None


class _Tracker:
    def __init__(self, plan: Plan, fn: ProgressFn | None, resume: tuple[int, int] = (0, 0)) -> None:
        self.fn = fn
        tensors = sum(len(s.items) for s in plan.shards)
        self.state = Progress(0, plan.bytes_to_write, 0, tensors, "", 0, *resume)
        self.lock = threading.Lock()  # shards run on several threads
        if fn:
            fn(self.state)  # the start: the total, and what an earlier run left to reuse

    def advance(self, nbytes: int, tensors: int = 0, current: str = "", reused=False) -> None:
        with self.lock:
            self.state.bytes_done += nbytes
            self.state.bytes_reused += nbytes if reused else 0
            self.state.tensors_done += tensors
            self.state.current = current or self.state.current
            if self.fn:
                self.fn(self.state)


DEPTH = 2  # chunks in flight to the writer and hasher threads
# On CPU, a chunk holds at most this many bytes (at least one expert), whatever the budget:
# the ring's buffers are touched for the first time once per run (0.9 s of page faults per
# GiB on the 2-core VM) and small ones stay in the caches between the gather, the write and
# the hash. DeepSeek-V3 fp8-block, 7.96 GB, --max-memory 4GiB: 23.6 s and 16.4 s of system
# time with chunks of the whole budget, 21.1 s and 11.0 s with 16 MiB (one expert each).
CPU_CHUNK = 16 * 2**20


def _chunk_experts(
    out_t: OutputTensor, budget: int, pinned: bool = False, cap: int | None = None
) -> int:
    """Experts per chunk: the most whose host buffers (`_host_bytes`) fit in `budget` bytes,
    and whose bytes fit in `cap`; at least one expert."""
    per = max(out_t.expert_nbytes, out_t.stage_nbytes, 1)
    n = max(1, min(out_t.rank_shape[0], budget // _host_bytes(per, False)))
    if cap is not None:
        n = max(1, min(n, cap // per))
    while n > 1 and _host_bytes(n * per, pinned) > budget:
        n -= 1
    return n


def _copy_chunk(budget: int) -> int:
    return max(2**20, min(COPY_CHUNK, budget // (DEPTH + 4)))


class _Ring:
    """DEPTH + 1 host buffers of one size for a worker's whole run (pinned when the transform
    runs on CUDA), so memory does not grow with the number of tensors or shards."""

    def __init__(self, plan: Plan, budget: int, pin: bool, cap: int | None = None) -> None:
        self.copy_chunk = _copy_chunk(budget)  # carried-over bytes take no buffer (kernel copy)
        self.pin, self.budget, self.cap = pin, budget, cap
        sizes = [1]
        for lp in plan.layers:
            for o in lp.outputs:
                if o.chunked:
                    sizes.append(self.experts(o) * o.expert_nbytes)
        self.capacity = max(sizes)
        self.slots: list[torch.Tensor] = []
        self.turn = 0

    def buffer(self, nbytes: int) -> torch.Tensor:
        """The next host buffer, `nbytes` long (uint8); free once DEPTH later ones were taken
        and their writes waited for (the pipeline keeps at most DEPTH in flight)."""
        if len(self.slots) <= DEPTH:
            block = torch.empty(self.capacity, dtype=torch.uint8, device="cpu", pin_memory=self.pin)
            self.slots.append(block)
        k = self.turn % len(self.slots)
        self.turn += 1
        return self.slots[k][:nbytes]

    def experts(self, out_t: OutputTensor) -> int:
        """Experts per chunk of `out_t`."""
        return _chunk_experts(out_t, self.budget, self.pin, self.cap)


class _Pipeline:
    """Writes chunks to a shard on one background thread and hashes them on another, each in
    order, while the caller reads and transforms the next ones. A chunk is a host buffer from
    the ring, or a range of a source file copied in the kernel and then hashed where it was
    written. At most DEPTH chunks are in flight, so a buffer is reused only once the write and
    the hash that last used it are done."""

    def __init__(self, w: ShardWriter, ring: _Ring, cancel: threading.Event) -> None:
        self.w = w
        self.ring = ring
        self.cancel = cancel
        self.offset = len(w.header)  # where the next submitted bytes go in the file
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fi-convert-write")
        self.hasher = ThreadPoolExecutor(1, thread_name_prefix="fi-convert-hash")
        self.pending: deque[tuple[Future, Future]] = deque()

    def buffer(self, nbytes: int) -> torch.Tensor:
        return self.ring.buffer(nbytes)

    def submit(self, t: torch.Tensor) -> None:
        """Write and hash a host buffer (from the ring, or one of its own)."""
        self._tick()
        write = self.pool.submit(self.w.write, t, False)
        self._queue(write, self.hasher.submit(self.w.hash, t))
        self.offset += t.numel() * t.element_size()

    def submit_copy(self, fd: int, offset: int, nbytes: int, path: Path) -> None:
        """Copy bytes of a source file in the kernel, then hash them where they were written."""
        self._tick()
        write = self.pool.submit(self.w.copy_from, fd, offset, nbytes, path)
        self._queue(
            write, self.hasher.submit(_after, write, self.w.hash_written, self.offset, nbytes)
        )
        self.offset += nbytes

    def _tick(self) -> None:
        global _writes
        _writes += 1
        if _KILL_AFTER and _writes > _KILL_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.cancel.is_set():
            raise _Cancelled

    def _queue(self, write: Future, hashed: Future) -> None:
        self.pending.append((write, hashed))
        while len(self.pending) > DEPTH:
            self._wait(self.pending.popleft())

    @staticmethod
    def _wait(futures: tuple[Future, Future]) -> None:
        for f in futures:
            f.result()

    def close(self) -> None:
        """Wait for every write; raises the first write error."""
        try:
            while self.pending:
                self._wait(self.pending.popleft())
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop after an error elsewhere: drop queued work, wait for what is in flight (a
        write waiting for disk room gives up)."""
        self.pending.clear()
        self.w.stop.set()  # after close(), every write is done already
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.hasher.shutdown(wait=True, cancel_futures=True)


def _write_shard(
    shard: ShardPlan, ctx: Ctx, plan: Plan, od: ShardDir, tr: _Tracker, ring: _Ring, run: _Shards
) -> ShardWriter:
    w = ShardWriter(od.root / shard.name, [it.entry for it in shard.items], od.room, od.writeback)
    try:
        pipe = _Pipeline(w, ring, run.cancel)
    except BaseException:
        w.abort()
        raise
    try:
        for k, it in enumerate(shard.items):
            if it.source is not None:
                _ask_next(shard.items[k + 1 :], ctx, pipe.ring.copy_chunk)
                _copy_tensor(it, ctx, pipe, tr)
            else:
                _produce_tensor(it, ctx, plan, pipe, tr)
            tr.advance(0, 1, it.entry.name)
        pipe.close()
    except BaseException:
        pipe.abandon()
        w.abort()
        raise
    return w


def _after(first: Future, fn: Callable[..., None], *args: object) -> None:
    first.result()  # its error, if any, is the one to report
    fn(*args)


def _ask_next(items: list[Item], ctx: Ctx, piece: int) -> None:
    """A source read over a link: the first pieces of the carried-over tensors that come next
    are fetched while this one is copied (small tensors, each read alone, would each wait out
    the link's latency). One read of the window stays for the piece after this one."""
    for it in items[: max(0, ctx.files.read_ahead - 1)]:
        if it.source is None:
            return
        ctx.files.prefetch_bytes(it.source.file, it.source.start, min(piece, it.source.nbytes))


def _copy_tensor(it: Item, ctx: Ctx, pipe: _Pipeline, tr: _Tracker) -> None:
    """A tensor carried over unchanged: copied file to file in the kernel, never through this
    process's memory (on a 2-core VM, 2.2 GB took 0.7 s so against 1.6-2.0 s for pread and
    write)."""
    info = it.source
    assert info is not None
    if is_scale(info.name):  # small; read once more, to be checked for NaN and Inf
        ctx.files.read(info)
    if not ctx.files.local:  # no file to copy from: read pieces into ring buffers
        done = 0
        while done < info.nbytes:
            n = min(pipe.ring.copy_chunk, info.nbytes - done)
            after = min(pipe.ring.copy_chunk, info.nbytes - done - n)
            ctx.files.prefetch_bytes(info.file, info.start + done + n, after)
            buf = pipe.buffer(n)
            ctx.files.read_bytes(info.file, info.start + done, buf)
            pipe.submit(buf)
            done += n
            tr.advance(n, current=info.name)
        return
    fd = ctx.files.fd(info.file)
    done = 0
    while done < info.nbytes:
        n = min(pipe.ring.copy_chunk, info.nbytes - done)
        pipe.submit_copy(fd, info.start + done, n, info.file)
        done += n
        tr.advance(n, current=info.name)


def _produce_tensor(it: Item, ctx: Ctx, plan: Plan, pipe: _Pipeline, tr: _Tracker) -> None:
    out_t, layer = it.output, it.layer
    assert out_t is not None and layer is not None
    dt = dtypes.to_torch(out_t.dtype)
    if not out_t.chunked:  # small per-layer tensors (scales): one piece per rank
        for rank in range(plan.options.tp_size):
            out = torch.empty(out_t.rank_shape, dtype=dt, device=ctx.device)
            out_t.produce(ctx, rank, range(layer.info["num_experts"]), out)
            host = out.cpu()  # on CUDA this waits for the copies from the staging buffers
            ctx.release()
            pipe.submit(host)
            tr.advance(host.numel() * host.element_size(), current=it.entry.name)
        return
    e, per = out_t.rank_shape[0], out_t.expert_nbytes
    n = pipe.ring.experts(out_t)
    gpu = ctx.device.type != "cpu"
    dev_buf = torch.empty((n, *out_t.rank_shape[1:]), dtype=dt, device=ctx.device) if gpu else None
    for rank in range(plan.options.tp_size):
        for e0 in range(0, e, n):
            experts = range(e0, min(e, e0 + n))
            host = pipe.buffer(len(experts) * per).view(dt)
            host = host.view(len(experts), *out_t.rank_shape[1:])
            if dev_buf is None:
                out_t.produce(ctx, rank, experts, host)
            else:
                out_t.produce(ctx, rank, experts, dev_buf[: len(experts)])
                host.copy_(dev_buf[: len(experts)])  # waits, as above
            ctx.release()
            pipe.submit(host)
            tr.advance(host.numel() * host.element_size(), current=it.entry.name)


def preflight(plan: Plan, out_dir: Path, *, device: str = "auto", overwrite: bool = False) -> None:
    """Every check `run_plan` makes before it writes: device, out-dir placement and ownership."""
    resolve_device(device)
    outdir.preflight(plan, out_dir, overwrite)
