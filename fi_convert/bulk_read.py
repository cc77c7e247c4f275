"""Many byte ranges of files read into tensors at once, as fast as the machine reads.

A `BulkRead` takes requests (an open file, an offset, a destination tensor), joins ranges
that lie near each other in a file, cuts them into chunks and reads the chunks with several
threads. Into host memory, each thread reads straight into the destinations. Into a GPU, each
thread reads into its own pinned host buffers and copies each one to its destinations on its
own CUDA stream, so that the copies overlap the next reads; a buffer is refilled only once its
copy is done. Those copies and events are the CUDA driver's own calls (`cuda_driver`), which
keep the interpreter's lock, not torch's, which give it up and wait to take it back beside the
other readers at every call. The pinned buffers stay within a host-memory budget and are freed
when the read ends, however it ends. Nothing is staged in device memory.

A fault ends the read with one line naming the file and the fix: a file shorter than its
ranges, a short read (the file shrank), an I/O error, a file changed while it was read. On
Ctrl-C (or the SystemExit of a SIGTERM handler) the threads stop, the buffers are freed and
the exception goes on.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import cuda_driver
from .errors import FiConvertError
from .sizes import SIZE_HELP, parse_size

THREADS_ENV = "FI_CONVERT_READ_THREADS"
HOST_MEMORY_ENV = "FI_CONVERT_HOST_MEMORY"
DEFAULT_HOST_MEMORY = 1 << 30  # pinned host memory of a read into a GPU, at most
# On the GPU machine (16 CPUs) the plugins' whole load of a rank is fastest at 4 MiB chunks, as a
# plain parallel copy of the same bytes is: on an H100 (2026-12-06, seventh session), rank 0 of
# TP 8 took 48-52 ms at 4 MiB against 54-60 at 16 and 54 at 8 for gpt-oss-120b, 63-68 against
# 79-81 and 72 for Qwen3-30B-A3B, 78-100 at 2 (docs/speed.md;
# docs/bench/h100-vllm-load-chunks-order-2026-12-06.json). Before the readers' copies were the
# driver's own calls, each chunk cost more and 16 MiB was faster (61 ms against 73 at 4).
# And at 12 threads, not 16: the plain copy reads as fast with 12 as with 16 (0.97-1.00 of its
# time, TP 8 and TP 1), and the whole load is faster, the readers' last end 40 ms against 44 at
# rank 0 of TP 8 of Qwen3-30B-A3B, 222 against 237 at TP 1 (an H100, 2026-12-07, twelfth
# session: per run, 1.32 of the limit against 1.47, 1.15 against 1.21; gpt-oss-120b 1.12
# against 1.16 at TP 1, even at TP 8; docs/bench/h100-vllm-load-twelfth-2026-12-07.json): with
# every CPU reading, the load's own thread waits for one. 96 MiB pinned, which the plugins pin
# while the server builds the model
MAX_THREADS = 12
THREADS_CAP = 128  # more reader threads than this is a mistake, not a setting
CHUNK = 4 << 20  # bytes read and copied at once by one thread
MIN_CHUNK = 1 << 20
DEPTH = 2  # pinned buffers per thread: one is read into while the other is copied out
# Chunks of each thread's first read of a read into a GPU (at most DEPTH: its buffers in a row),
# a bench setting (`--alt-bulk NAME=set:fi_convert.bulk_read:LEAD=4,fi_convert.bulk_read:DEPTH=8`).
# A reader needs the interpreter's lock only between its reads; with the model asked under the
# read (`format/whole_read.ORDER`), longer first reads leave the asking the lock for their length
# (measured on an H100, the twelfth session: the asking ran as fast as before the read, the
# Python after it did not, and the load was no faster; docs/speed.md).
LEAD = 1
GAP = 1 << 20  # two ranges of a file this close are read as one (the gap is read and dropped)


class ReadError(FiConvertError):
    """A file could not be read while loading; names the file and the fix."""


def default_threads() -> int:
    """`FI_CONVERT_READ_THREADS`, else one per usable CPU, at most MAX_THREADS."""
    env = os.environ.get(THREADS_ENV)
    if env:
        return _threads(env, THREADS_ENV)
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


def _threads(value: object, what: str) -> int:
    n = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, str) and value.strip().isdigit():
        n = int(value)
    if n is None or not 1 <= n <= THREADS_CAP:
        raise ReadError(f"{what}={value!r}: not a thread count; give 1 to {THREADS_CAP}")
    return n


def _budget(value: object, what: str) -> int:
    try:
        return parse_size(value)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        raise ReadError(f"{what}={value!r}: not a size; {SIZE_HELP}") from None


def default_host_memory() -> int:
    """`FI_CONVERT_HOST_MEMORY` (a size such as 512MiB), else DEFAULT_HOST_MEMORY."""
    env = os.environ.get(HOST_MEMORY_ENV)
    return _budget(env, HOST_MEMORY_ENV) if env else DEFAULT_HOST_MEMORY


def fit(threads: int, host_memory: int, chunk: int | None = None) -> tuple[int, int]:
    """Threads and chunk size (CHUNK, as it is at the call, if not given) whose pinned buffers
    (threads x DEPTH x chunk) fit the budget: smaller chunks first (down to MIN_CHUNK), then
    fewer threads."""
    chunk = CHUNK if chunk is None else chunk
    if host_memory < DEPTH * MIN_CHUNK:
        raise ReadError(
            f"host memory budget of {host_memory} bytes is below the {DEPTH * MIN_CHUNK} one "
            f"reader thread needs; raise {HOST_MEMORY_ENV}"
        )
    chunk = max(MIN_CHUNK, min(chunk, host_memory // (threads * DEPTH)))
    return max(1, min(threads, host_memory // (DEPTH * chunk))), chunk


class HostBuffers:
    """One block of host memory (pinned, for a GPU) that a read's threads cut into their
    buffers. Pinning and unpinning pages is slow, so the block can be allocated ahead of the
    read, in the background (the vLLM plugin does so while vLLM builds the model), and is freed
    in the background after it."""

    def __init__(self, nbytes: int, pinned: bool = True) -> None:
        self.nbytes, self.pinned = nbytes, pinned
        self.alloc_s = 0.0
        self._block: torch.Tensor | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._freed = threading.Event()
        self._free_asked = False
        self.streams: list[Any] = []  # the CUDA streams that copied out of the block

    def allocate(self, background: bool = False) -> HostBuffers:
        if background:  # not a daemon: torch code cut off at the interpreter's exit aborts it
            threading.Thread(target=self._allocate, name="fi-convert-pin").start()
        else:
            self._allocate()
        return self

    def _allocate(self) -> None:
        t0 = time.perf_counter()
        try:
            # on the CPU whatever the ambient default device (`torch.set_default_device`, a
            # `with torch.device(...)` block around a server's load)
            self._block = torch.empty(
                self.nbytes, dtype=torch.uint8, device="cpu", pin_memory=self.pinned
            )
        except BaseException as e:  # raised to the reader that waits for the block
            self._error = e
        finally:
            self.alloc_s = time.perf_counter() - t0
            self._ready.set()

    def block(self) -> torch.Tensor:
        """The block, once allocated."""
        self._ready.wait()
        if self._block is None:
            raise ReadError(_alloc_failure(self.nbytes, self.pinned, self._error))
        return self._block

    @property
    def held(self) -> int:
        """Bytes held now (0 once freed, or while not yet allocated)."""
        return self.nbytes if self._block is not None else 0

    def free(self, background: bool = True) -> None:
        """Give the memory back (to the system, not to torch's cache of pinned blocks); once."""
        if self._free_asked:
            return
        self._free_asked = True
        self._ready.wait()
        held = [self._block]  # the one reference, so that _drop can let go of it
        self._block = None
        if background:
            # not a daemon: a tensor freed while the interpreter exits aborts the process
            threading.Thread(target=self._drop, args=(held,), name="fi-convert-unpin").start()
        else:
            self._drop(held)

    def _drop(self, held: list) -> None:
        held.clear()
        # torch keeps a freed pinned block until an event it records now, on each stream that
        # copied out of it, has passed: wait for those, so that emptying its cache frees it
        for stream in self.streams:
            stream.synchronize()
        self.streams.clear()
        empty = getattr(torch._C, "_host_emptyCache", None)
        if self.pinned and empty is not None:
            empty()
        self._freed.set()

    def wait_freed(self) -> None:
        self._freed.wait()


def _alloc_failure(nbytes: int, pinned: bool, e: BaseException | None) -> str:
    """The one line for a host block that could not be allocated: its budget is the fix only
    where memory ran out; any other cause is named as it is."""
    what = f"cannot allocate {nbytes} bytes of {'pinned ' if pinned else ''}host memory"
    text = _first_line(e)
    if _out_of_memory(e):
        return f"{what} (out of memory: {text}); lower {HOST_MEMORY_ENV} or {THREADS_ENV}"
    return f"{what} ({text}); this is not a lack of memory: check the CUDA driver and torch"


def _out_of_memory(e: BaseException | None) -> bool:
    if isinstance(e, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(e).lower()
    return any(s in text for s in ("out of memory", "can't allocate memory"))


def host_buffers() -> HostBuffers:
    """Pinned buffers for a read into a GPU with the default (or environment's) settings, not
    yet allocated."""
    threads, chunk = fit(default_threads(), default_host_memory())
    return HostBuffers(threads * DEPTH * chunk)


def read_device(device: str | torch.device) -> torch.device:
    """The device a read into `device` fills: a GPU's index filled in (the threads' device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


# Where a job's bytes go: (offset in the job, a request's flat uint8 destination, the byte of
# it they start at, bytes), the readers' `at, flat, into, n`; plain numbers, no view made: a read
# into a GPU cuts thousands of jobs (2,400 at TP 1 of the bench's gpt-oss-120b), and a view
# cost more than the rest of its job's planning
Piece = tuple[int, torch.Tensor, int, int]


class _Job:
    """One read of `size` bytes of a file, and where its bytes go (`Piece`s); `rows`, of a
    strided request: (rows, bytes of each, stride) from the job's start into its one piece,
    the rows one after another."""

    __slots__ = ("path", "fd", "offset", "size", "pieces", "rows")

    def __init__(
        self,
        path: Path,
        fd: int,
        offset: int,
        size: int,
        pieces: list[Piece],
        rows: tuple[int, int, int] | None = None,
    ) -> None:
        self.path, self.fd, self.offset, self.size = path, fd, offset, size
        self.pieces, self.rows = pieces, rows


@dataclass(frozen=True)
class ReadStats:
    bytes: int  # delivered into the destinations
    read_bytes: int  # read from the files (joined gaps included)
    seconds: float  # from the threads' start to the last one's end
    threads: int
    chunk: int
    pinned_peak: int  # pinned host memory held at once
    alloc_s: float = 0.0  # time spent pinning it (ahead of the read, or in it)
    jobs: int = 0  # the pieces of work the threads took in turn
    # when each thread ran out of work, in seconds from the start, earliest first (their
    # spread is the read's tail, when too few jobs were left to keep every thread busy)
    thread_ends: tuple[float, ...] = ()


class BulkRead:
    """Requests added with `add`, then read at once by `run` (or `start` ... `wait`; with
    `start(more=True)` the threads start and requests added later join the read at `more`)."""

    def __init__(
        self,
        device: str | torch.device = "cpu",
        *,
        threads: int | None = None,
        host_memory: int | str | None = None,
        chunk: int | None = None,  # CHUNK as it is at the call
        staged: bool | None = None,
        buffers: HostBuffers | None = None,
    ) -> None:
        self.device = read_device(device)
        # staged: through host buffers (always into a GPU; on the CPU only in tests)
        self.staged = self.device.type != "cpu" if staged is None else staged
        budget = (
            default_host_memory() if host_memory is None else _budget(host_memory, "host_memory")
        )
        n = default_threads() if threads is None else _threads(threads, "threads")
        self.threads, self.chunk = fit(n, budget, chunk)
        # host buffers given (allocated ahead, freed by their owner) or this read's own
        self._given = buffers
        self._buffers: HostBuffers | None = None
        if buffers is not None:  # as many threads as its buffers hold, of this chunk size
            self.chunk = max(1, min(self.chunk, buffers.nbytes // DEPTH))
            self.threads = max(1, min(self.threads, buffers.nbytes // (DEPTH * self.chunk)))
        self._requests: list[tuple[Path, int, int, torch.Tensor, int]] = []  # (..., bytes)
        self._strided: list[_Job] = []  # jobs of add_rows, cut already
        self._threads: list[threading.Thread] = []
        # set by each thread as its last act: Thread.join and is_alive cannot be trusted once
        # a join was interrupted (CPython 3.11 then marks a running thread stopped, gh-90882)
        self._done: list[threading.Event] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._stat: dict[int, tuple[os.stat_result, Path]] = {}  # each file's, as planned
        self._jobs: list[_Job] = []
        self._planned = (0, 0)  # requests and strided jobs planned into _jobs so far
        self._todo: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False  # the threads' end marks queued (until then, more may come)
        self._streams: list[Any] = []  # the threads' own CUDA streams
        self._t0 = 0.0  # as the first jobs were queued
        self._ends: list[float] = []  # when each thread finished
        # the device's context for the readers' driver calls (0: they copy through torch)
        self._context = 0
        # where set (bytes), requests added to a read started with more=True join it once
        # that many have come since the last joined (`format/whole_read.FEED`)
        self.feed = 0
        self._fed = 0

    def add(self, path: Path, fd: int, offset: int, dst: torch.Tensor) -> None:
        """Fill the contiguous `dst` (on this read's device) with `dst`'s byte size of the
        open file `fd` (named `path`) from `offset`, when the read runs."""
        if not dst.is_contiguous() or dst.device.type != self.device.type:
            raise ValueError(f"{path}: destination not contiguous or not on {self.device}")
        flat = dst if dst.dtype == torch.uint8 and dst.dim() == 1 else _flat(dst)
        n = flat.numel()
        if n:
            self._requests.append((path, fd, offset, flat, n))
            self._fed += n
            self._feed()

    def add_rows(
        self, path: Path, fd: int, offset: int, rows: tuple[int, int, int], dst: torch.Tensor
    ) -> None:
        """Fill the contiguous `dst` with `rows` = (n, size, stride): n rows of `size` bytes,
        `stride` bytes apart in the file from `offset` (a column slice of a row-major tensor),
        when the read runs. Each job reads whole rows of its span (the bytes between rows
        too) and copies the rows out in one strided copy."""
        n, size, stride = rows
        flat = dst.reshape(-1).view(torch.uint8)
        if not dst.is_contiguous() or flat.numel() != n * size:
            raise ValueError(f"{path}: rows destination of wrong size or not contiguous")
        if size > self.chunk:  # rows longer than a chunk: each one a read of its own
            for r in range(n):
                self.add(path, fd, offset + r * stride, flat[r * size : (r + 1) * size])
            return
        per = max(1, (self.chunk - size) // stride + 1)  # rows whose span fits a chunk
        for r in range(0, n, per):
            k = min(per, n - r)
            piece = (0, flat, r * size, k * size)
            span = (k - 1) * stride + size
            job = _Job(path, fd, offset + r * stride, span, [piece], (k, size, stride))
            self._strided.append(job)
            self._fed += k * size
            self._feed()

    def _feed(self) -> None:
        if self.feed and self._fed >= self.feed and self._threads and not self._closed:
            self.more()

    @property
    def started(self) -> bool:
        """Its threads started (by `start`)."""
        return bool(self._threads)

    @property
    def nbytes(self) -> int:
        rows = sum(j.pieces[0][3] for j in self._strided)
        return sum(r[4] for r in self._requests) + rows

    def run(self) -> ReadStats:
        self.start()
        return self.wait()

    def start(self, more: bool = False) -> None:
        """Check the files' sizes against the requests, then start the reader threads. With
        `more`, all of them, even with no request yet: requests added while they run join the
        read at `more()`, until `wait` (`format/whole_read.py`'s other orders of a load)."""
        jobs = self._plan()
        self._check_sizes(jobs)
        n = self.threads if more else min(self.threads, len(jobs))
        streams: list[Any] = [None] * n
        if self.device.type == "cuda":
            # each thread's own stream, made here: a thread that makes its own calls into
            # torch and the runtime as it starts waits for the interpreter's lock at each
            streams = self._streams = [torch.cuda.Stream(self.device) for _ in range(n)]
            self._context = _driver_context(self.device)
        self._done = [threading.Event() for _ in range(n)]
        self._threads = [
            threading.Thread(
                target=self._work,
                args=(self._todo, streams[k], k),
                name=f"fi-convert-read-{k}",
                daemon=True,
            )
            for k in range(n)
        ]
        self._queue(jobs)
        if not more:
            self._close()
        try:
            with _signals_held():  # a Ctrl-C inside Thread.start would leave one unjoined
                if self.staged and n:
                    self._buffers = self._given or HostBuffers(
                        n * DEPTH * self.chunk, pinned=self.device.type == "cuda"
                    ).allocate(background=True)  # pinned while the threads start
                for t in self._threads:
                    t.start()
        except BaseException:  # Ctrl-C as they started (taken once all were): stop them
            self.abort()
            raise

    def more(self) -> None:
        """The requests added since the read started, into it (started with `more`)."""
        if not self.started or self._closed:
            raise ValueError("requests added to a read not started with more=True, or ended")
        jobs = self._plan()
        self._fed = 0
        self._check_sizes(jobs)
        self._queue(jobs)

    def _queue(self, jobs: list[_Job]) -> None:
        """`jobs` to the threads, once the work pending on the caller's stream is done (their
        destinations may be memory that work still writes, or frees for reuse)."""
        if not jobs:
            return
        self._after_callers_work()
        if not self._jobs:
            self._t0 = time.perf_counter()
        self._jobs += jobs
        for job in jobs:
            self._todo.put(job)

    def _after_callers_work(self) -> None:
        """The copies' streams wait for the work pending on the caller's stream (before any
        of the jobs queued next reaches a thread)."""
        if self._streams:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
            for stream in self._streams:
                stream.wait_event(ready)

    def _close(self) -> None:
        """No more requests: each thread ends once the queue is read (its end mark); once."""
        if self._threads and not self._closed:
            self._closed = True
            for _ in self._threads:
                self._todo.put(None)

    def wait(self) -> ReadStats:
        """Wait for the threads; raise the first fault. Interrupted, stop them first."""
        try:
            self._close()
            for done in self._done:
                done.wait()
            for t in self._threads:  # past their last act: gone at once
                t.join()
        except BaseException:
            self.abort()
            raise
        finally:
            self._free()
        return self._result(
            self._ends,
            len(self._threads),
            self._buffers.nbytes if self._buffers else 0,
            self._buffers.alloc_s if self._buffers else 0.0,
        )

    def _result(self, ends: list[float], threads: int, pinned: int, alloc_s: float) -> ReadStats:
        """The read's end, its threads ended at `ends`: its first fault raised, its files
        checked unchanged, else its stats."""
        if self._error is not None:
            raise self._error
        self._check_unchanged()
        return ReadStats(
            bytes=self.nbytes,
            read_bytes=sum(j.size for j in self._jobs),
            seconds=max(ends, default=self._t0) - self._t0 if self._jobs else 0.0,
            threads=threads,
            chunk=self.chunk,
            pinned_peak=pinned,
            alloc_s=alloc_s,
            jobs=len(self._jobs),
            thread_ends=tuple(sorted(max(0.0, t - self._t0) for t in ends)),
        )

    def abort(self) -> None:
        """Stop the threads after their current chunk and wait for them (their buffers are
        freed as they end). A second Ctrl-C meanwhile does not cut this short: a thread left
        inside torch at the interpreter's exit would abort the process."""
        self._stop.set()
        self._close()  # (threads waiting for more requests take their end marks)
        for t, done in zip(self._threads, self._done, strict=True):
            while t.ident is not None and not done.is_set():  # (started: it will set it)
                try:
                    done.wait()
                except BaseException:  # noqa: S112 (they stop within one chunk's read)
                    continue
        for t in self._threads:  # past their last act (a join cut short may leave one
            while t.ident is not None and t.is_alive():  # marked stopped early: harmless now)
                try:
                    t.join()
                except BaseException:  # noqa: S112
                    continue
        self._free()

    def _free(self) -> None:
        """This read's own host buffers go back (in the background) once no thread runs."""
        own = self._buffers if self._buffers is not self._given else None
        if own is not None and not self._running():
            own.free()

    def _running(self) -> bool:
        return any(
            t.ident is not None and not done.is_set()
            for t, done in zip(self._threads, self._done, strict=True)
        )

    def wait_freed(self) -> None:
        """Until this read's own host buffers are given back (tests)."""
        if self._buffers is not None and self._buffers is not self._given:
            self._buffers.wait_freed()

    @property
    def pinned_bytes(self) -> int:
        """Host buffer memory of this read's own held now (0 once the read has ended)."""
        mine = self._buffers is not None and self._buffers is not self._given
        return self._buffers.held if mine and self._buffers else 0

    # -- planning ---------------------------------------------------------------------------

    def _plan(self) -> list[_Job]:
        """The requests not planned yet as chunk-sized jobs: ranges of a file joined across
        small gaps (staged) or where they touch (direct), then cut at chunk boundaries."""
        gap = GAP if self.staged else 0
        runs: list[_Job] = []
        done, strided = self._planned
        self._planned = (len(self._requests), len(self._strided))
        new = self._requests[done:]
        for path, fd, offset, flat, n in sorted(new, key=lambda r: (str(r[0]), r[2])):
            last = runs[-1] if runs else None
            end = last.offset + last.size if last else 0
            if last and last.fd == fd and end <= offset <= end + gap:
                last.pieces.append((offset - last.offset, flat, 0, n))
                last.size = offset + n - last.offset
            else:
                runs.append(_Job(path, fd, offset, n, [(0, flat, 0, n)]))
        # a read's first jobs, one a thread, LEAD chunks long where it is set (staged)
        lead = self.threads if self.staged and LEAD > 1 and not self._jobs else 0
        size = min(LEAD, DEPTH) * self.chunk
        cut: list[_Job] = []
        for run in runs:
            cut += self._cut(run, max(0, lead - len(cut)), size)
        # then the strided jobs: a row-parallel tensor's span is read whole for the rows a
        # rank keeps (more bytes per byte delivered), so they are the longest; last, they were
        # the read's tail
        return cut[:lead] + self._strided[strided:] + cut[lead:]

    def _cut(self, run: _Job, lead: int = 0, size: int = 0) -> list[_Job]:
        """`run` cut into jobs of at most `chunk` bytes (the first `lead` of them, `size`),
        each trimmed to its pieces."""
        jobs: list[_Job] = []
        limit = self.chunk
        job, base = None, 0  # the job being filled, and its start in the run
        for at, flat, _, n in run.pieces:  # (a run's pieces: whole requests)
            pos, end = at, at + n
            while pos < end:
                if job is None or pos - base >= limit:
                    limit = size if len(jobs) < lead else self.chunk
                    job, base = _Job(run.path, run.fd, run.offset + pos, 0, []), pos
                    jobs.append(job)
                take = min(end, base + limit) - pos
                job.pieces.append((pos - base, flat, pos - at, take))
                job.size = pos + take - base
                pos += take
        return jobs

    def _check_sizes(self, jobs: list[_Job]) -> None:
        for job in jobs:
            if job.fd not in self._stat:
                self._stat[job.fd] = (os.fstat(job.fd), job.path)
            size = self._stat[job.fd][0].st_size
            if job.offset + job.size > size:
                raise ReadError(
                    f"{job.path}: {size} bytes, but its tensors reach byte "
                    f"{job.offset + job.size}: the file is truncated; restore it (convert or "
                    "download it again)"
                )

    def _check_unchanged(self) -> None:
        """Each file read as it was when its first requests were planned: one fstat a file,
        not a job (a large read has thousands: 5 ms of a whole model's 250 at TP 1 on an H200,
        after the readers are done)."""
        for fd, (was, path) in self._stat.items():
            now = os.fstat(fd)
            if (now.st_size, now.st_mtime_ns) != (was.st_size, was.st_mtime_ns):
                raise ReadError(
                    f"{path}: changed while it was loaded; load again, and do not write an "
                    "output while a server loads it"
                )

    # -- the reader threads -----------------------------------------------------------------

    def _work(self, todo: queue.SimpleQueue[_Job | None], stream: Any, k: int) -> None:
        try:
            if self.staged:
                self._work_staged(todo, stream, k)
            else:
                self._work_direct(todo)
        except BaseException as e:  # the first fault ends the read
            with self._lock:
                if self._error is None:  # (its frames would keep the buffers alive)
                    self._error = _bare(e)
            self._stop.set()
        finally:
            self._ends.append(time.perf_counter())
            self._done[k].set()  # its last act: nothing of torch runs in it after this

    def _work_direct(self, todo: queue.SimpleQueue[_Job | None]) -> None:
        while not self._stop.is_set() and (job := todo.get()) is not None:
            if job.rows is not None:  # the span, then its rows
                buf = torch.empty(job.size, dtype=torch.uint8)
                self._read(job, job.offset, _bytes(buf))
                self._copy_out(job, buf)
                continue
            for at, flat, into, n in job.pieces:
                self._read(job, job.offset + at, _bytes(flat)[into : into + n])

    def _work_staged(self, todo: queue.SimpleQueue[_Job | None], stream: Any, k: int) -> None:
        """Thread k: its DEPTH buffers of the block, filled and copied out in turn, on its
        `stream` into a GPU. Its loop calls into torch as little as it can (each call gives up
        the interpreter's lock and waits to take it back, beside 15 other threads): its
        buffers' bytes and its events are made once; into a GPU its copies and events are the
        driver's own calls (`cuda_driver`), on plain addresses, and it calls torch for
        nothing else."""
        assert self._buffers is not None
        drv = cuda_driver.driver() if stream is not None and self._context else None
        if stream is not None:
            self._buffers.streams.append(stream)
            if drv is not None:
                drv.set_context(self._context)
            else:  # torch's copies: the stream its current one (per thread, as the device)
                torch.cuda.set_device(self.device)
                torch.cuda.set_stream(stream)
        mine = self._buffers.block()[k * DEPTH * self.chunk :][: DEPTH * self.chunk]
        events: list[int] = []
        try:
            if drv is not None and stream is not None:
                events = [drv.event() for _ in range(DEPTH)]
                self._loop_driver(todo, drv, stream.cuda_stream, mine, events)
            else:
                self._loop_torch(todo, stream, mine)
        except BaseException:
            _end_copies(stream, drv, events, failed=True)  # (the thread's own fault stands)
            raise
        _end_copies(stream, drv, events)

    def _loop_driver(
        self,
        todo: queue.SimpleQueue[_Job | None],
        drv: cuda_driver.Driver,
        stream: int,
        mine: torch.Tensor,
        events: list[int],
    ) -> None:
        """The staged loop into a GPU through the driver: no torch call, no tensor made, the
        interpreter's lock given up only to read and to wait for a buffer's last copy. A
        strided job's rows go in one 2D copy of the copy engine's, from the pinned buffer
        (torch would gather them into pageable memory first, and copy from there)."""
        ring = _Ring(self.chunk)
        view, start = _bytes(mine), mine.data_ptr()
        while not self._stop.is_set() and (job := todo.get()) is not None:
            first, last = ring.take(job.size)
            for b in ring.refilled(first, last):
                drv.wait(events[b])  # its last copy is over: the buffer may be refilled
            at0 = first * self.chunk
            self._read(job, job.offset, view[at0 : at0 + job.size])
            _to_device(drv, job, start + at0, stream, events[first:last])

    def _loop_torch(
        self, todo: queue.SimpleQueue[_Job | None], stream: Any, mine: torch.Tensor
    ) -> None:
        """The staged loop through torch (into host memory in tests; into a GPU where the
        driver's library cannot be loaded)."""
        cuda = stream is not None
        done = [torch.cuda.Event() for _ in range(DEPTH)] if cuda else []
        ring = _Ring(self.chunk)
        view = _bytes(mine)
        while not self._stop.is_set() and (job := todo.get()) is not None:
            first, last = ring.take(job.size)
            for b in ring.refilled(first, last) if cuda else ():
                done[b].synchronize()  # its last copy is over: the buffer may be refilled
            at0 = first * self.chunk
            self._read(job, job.offset, view[at0 : at0 + job.size])
            self._copy_out(job, mine[at0 : at0 + job.size], cuda)
            for b in range(first, last) if cuda else ():
                done[b].record(stream)

    def _copy_out(self, job: _Job, buf: torch.Tensor, non_blocking: bool = False) -> None:
        """The job's bytes from `buf` into its destinations (on this thread's current stream)."""
        if job.rows is not None:
            (_, flat, into, n), src = job.pieces[0], _rows_of(job, buf)
            flat[into : into + n].view_as(src).copy_(src, non_blocking=non_blocking)
            return
        for at, flat, into, n in job.pieces:
            dst = flat if into == 0 and n == flat.numel() else flat[into : into + n]
            src = buf if at == 0 and n == buf.numel() else buf[at : at + n]
            dst.copy_(src, non_blocking=non_blocking)

    def _read(self, job: _Job, offset: int, mv: memoryview) -> None:
        """Fill `mv` with the bytes of the job's file at `offset`; a fault is one line."""
        done = 0
        while done < len(mv):
            try:
                n = os.preadv(job.fd, [mv[done:]], offset + done)
            except OSError as e:
                raise ReadError(
                    f"{job.path}: read failed at byte {offset + done} ({e.strerror or e}); "
                    "check the disk, then load again"
                ) from None
            if n == 0:
                raise ReadError(
                    f"{job.path}: ends at byte {offset + done}, before byte {offset + len(mv)} "
                    "(truncated while it was loaded?); restore the file (convert or download "
                    "it again), then load again"
                )
            done += n


class _Ring:
    """A reader thread's DEPTH buffers of `chunk` bytes, one after another in its block, taken
    in turn: a job takes as many in a row as its bytes fill (a read's first, LEAD chunks long),
    from the first where they would run past the last."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.next = 0
        self.used = [False] * DEPTH

    def take(self, nbytes: int) -> tuple[int, int]:
        """The buffers [first, last) a job of `nbytes` takes."""
        span = max(1, -(-nbytes // self.chunk))
        first = self.next if self.next + span <= DEPTH else 0
        self.next = (first + span) % DEPTH
        return first, first + span

    def refilled(self, first: int, last: int) -> list[int]:
        """Those of the buffers [first, last) that held an earlier job's bytes (their copies
        must be over before they are read into); all of them are in use from now."""
        out = [b for b in range(first, last) if self.used[b]]
        for b in range(first, last):
            self.used[b] = True
        return out


def _to_device(
    drv: cuda_driver.Driver, job: _Job, src: int, stream: int, events: list[int]
) -> None:
    """Enqueue the copies of the job's bytes from pinned host address `src` to their
    destinations on `stream` (a strided job's rows, a stride apart, in one copy), then record
    `events` after them; a fault names the job's file."""
    try:
        if job.rows is not None:
            rows, size, stride = job.rows
            _, flat, into, _ = job.pieces[0]
            drv.copy_rows_to_device(flat.data_ptr() + into, src, rows, size, stride, stream)
        else:
            for at, flat, into, n in job.pieces:
                drv.copy_to_device(flat.data_ptr() + into, src + at, n, stream)
        for event in events:
            drv.record(event, stream)
    except cuda_driver.CudaError as e:
        raise cuda_driver.CudaError(f"{job.path}: its bytes into the GPU: {e}") from None


def _driver_context(device: torch.device) -> int:
    """The context the readers' driver calls into `device` use: the one current in this
    thread with `device` current (torch's, the device's primary context); 0 where the driver
    cannot be loaded."""
    drv = cuda_driver.driver()
    if drv is None:
        return 0
    with torch.cuda.device(device):
        return drv.current_context()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait (this thread's, and the threads it starts inherit the mask, so
    only the caller's thread takes them) until the block ends, then are taken at once."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _end_copies(
    stream: Any, drv: cuda_driver.Driver | None, events: list[int], failed: bool = False
) -> None:
    """A reader's end: its stream's copies done (none reads its buffers once it ends), its
    events destroyed. A GPU that failed under them (a fault is sticky: torch's error is many
    lines) is one line, unless the reader's own fault is on its way already (`failed`)."""
    try:
        if stream is not None:
            stream.synchronize()
        for ev in events:
            drv.destroy(ev)  # type: ignore[union-attr]
    except Exception as e:
        if not failed:
            raise cuda_driver.CudaError(
                f"the read's copies into the GPU failed ({_first_line(e)}); check the GPU "
                "(nvidia-smi: its errors, its memory), then try again"
            ) from None


def _first_line(e: BaseException | None) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


def _bare(e: BaseException) -> BaseException:
    """`e` without its traceback and the exceptions chained to it: their frames hold the
    reader thread's locals (views of the host buffers), which would outlive the read."""
    e.__context__ = e.__cause__ = None
    return e.with_traceback(None)


def _rows_of(job: _Job, buf: torch.Tensor) -> torch.Tensor:
    """The job's rows in its buffer: (rows, size) bytes, `stride` apart."""
    assert job.rows is not None
    k, size, stride = job.rows
    return buf.as_strided((k, size), (stride, 1))


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view."""
    return t.view(-1).view(torch.uint8)


def _bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous uint8 host tensor, writable."""
    arr: Any = t.numpy()
    return memoryview(arr).cast("B")
