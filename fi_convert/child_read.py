"""A bulk read whose reader threads run in a child process, so that this process's Python
runs at its own speed beside the read (a bench setting, `PROCESS`; off by default).

In-process reader threads take the interpreter's lock after every chunk: a model asked under
their read was 3-7 times slower, and the read slower with it (docs/speed.md, sessions 10-13),
so a first start asks the model before the read. Here the child (`_read_child.py`, the
standard library only) reads each job into a slot of a ring of shared memory (a memfd, pinned
here for the GPU's copies), and reports it on a socket; one thread of this process copies the
slot to the job's destinations (the driver's calls, as `BulkRead`'s readers make them) and gives
the slot back once its copy is done. `copies_held` keeps that thread from the interpreter's lock
while the caller asks the model: the ring takes the read meanwhile.

The ring and the child (`ChildRing`) are made while the server builds the model
(`format/whole_read.Ahead`): the child's start (tens of milliseconds) and the ring's pinning are
not the load's. A fault is one line naming the file, as `BulkRead`'s; the child ends with its
socket (this process's end closed, or this process gone)."""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from . import _read_child as wire
from . import cuda_driver
from .bulk_read import (
    BulkRead,
    ReadError,
    ReadStats,
    _bare,
    _driver_context,
    _Job,
    _signals_held,
    _to_device,
    default_host_memory,
    read_device,
)

# Whether the plugins' loads read through a child process (a bench setting: `--alt-bulk
# NAME=set:fi_convert.child_read:PROCESS=True`), and the ring's bytes
PROCESS = False
RING = 512 << 20  # at most: within the host-memory budget (`ring_bytes`)
# Whether the copies out of the ring wait while the model is asked under the read (a bench
# setting, with `format/whole_read.ORDER` one that asks under it)
HOLD = True
# CUDA streams the copies out of the ring take in turn (one stream's copies from the ring's
# 4 KiB pages ran at 33 GB/s on an H100, against 45 for 12 readers' own streams)
STREAMS = 4
CHILD = Path(__file__).with_name("_read_child.py")
_BATCH = 2000  # jobs a message (24 bytes each: within a packet of 64 KiB)


def ring_bytes() -> int:
    """The ring's bytes: RING, within the pinned host-memory budget (`FI_CONVERT_HOST_MEMORY`)."""
    return min(RING, default_host_memory())


class ChildRing:
    """The ring of shared memory (`slots` of `chunk` bytes; pinned for a GPU) and the child
    process that reads into it with `threads` threads."""

    def __init__(self, device: str | torch.device, nbytes: int, chunk: int, threads: int) -> None:
        self.device = read_device(device)
        self.chunk, self.threads = chunk, threads
        self.slots = max(2 * threads, nbytes // chunk)
        self.nbytes = size = self.slots * chunk
        self._fd = os.memfd_create("fi-convert-read", os.MFD_CLOEXEC)
        self._map: mmap.mmap | None = None
        self.host: torch.Tensor | None = None
        self._registered = False
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._files: dict[int, int] = {}  # this process's fd -> the child's file number
        self.start_s = 0.0
        t0 = time.perf_counter()
        try:
            os.ftruncate(self._fd, size)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(self._fd, size, flags)
            self.host = torch.frombuffer(self._map, dtype=torch.uint8)
            if self.device.type == "cuda":
                rc = torch.cuda.cudart().cudaHostRegister(self.host.data_ptr(), size, 0)
                if int(rc) != 0:
                    raise ReadError(f"cannot pin {size} bytes of shared host memory ({rc})")
                self._registered = True
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.sock = mine
            args = [self._fd, theirs.fileno(), threads, chunk, self.slots]
            with _signals_held():  # (Ctrl-C is this process's to take)
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(CHILD), *map(str, args)],
                    pass_fds=(self._fd, theirs.fileno()),
                    stdin=subprocess.DEVNULL,
                )
            theirs.close()
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0

    def file(self, fd: int) -> int:
        """The child's number of the open file `fd` (sent it at first)."""
        n = self._files.get(fd)
        if n is None:
            with _child_alive():
                socket.send_fds(self._sock(), [b"F"], [fd])
            n = self._files[fd] = len(self._files)
        return n

    def send_jobs(self, jobs: list[tuple[int, int, int, int]]) -> None:
        for k in range(0, len(jobs), _BATCH):
            with _child_alive():
                self._sock().send(b"J" + b"".join(wire.JOB.pack(*j) for j in jobs[k : k + _BATCH]))

    def give_back(self, slots: list[int]) -> None:
        if slots:
            with _child_alive():
                self._sock().send(b"S" + b"".join(wire.SLOT.pack(s) for s in slots))

    def receive(self) -> bytes | None:
        """One message of the child's, or None where none is waiting."""
        try:
            with _child_alive():
                msg = self._sock().recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        if not msg:
            raise ReadError(_ENDED)
        return msg

    def ready(self) -> None:
        """Until the child is set up: its first message, taken here where no read has started
        on the ring (tests: a signal sent before would find it starting)."""
        sock = self._sock()
        sock.settimeout(30)
        try:
            with _child_alive():
                msg = sock.recv(16)
        finally:
            sock.settimeout(None)
        if msg != b"H":
            raise ReadError(_ENDED)

    def _sock(self) -> socket.socket:
        if self.sock is None:
            raise ReadError(_ENDED)
        return self.sock

    def close(self) -> None:
        """The child ended (its socket closed), the ring unpinned and freed; once."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self._registered and self.host is not None:
            torch.cuda.synchronize(self.device)  # (no copy out of it still running)
            torch.cuda.cudart().cudaHostUnregister(self.host.data_ptr())
            self._registered = False
        self.host = None
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ProcessRead(BulkRead):
    """A `BulkRead` whose reads a `ChildRing`'s child makes (`ring`: given, its owner closes
    it; else this read's own); one thread here copies out of the ring."""

    def __init__(
        self,
        device: str | torch.device = "cpu",
        *,
        ring: ChildRing | None = None,
        threads: int | None = None,
        chunk: int | None = None,
    ) -> None:
        super().__init__(device, threads=threads, chunk=chunk, staged=True)
        self._ring = ring
        self._own = ring is None
        if ring is not None:
            self.chunk, self.threads = ring.chunk, ring.threads
        self._copier: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._received = 0
        self._go = threading.Event()  # copies may run (cleared while held)
        self._go.set()
        self._end = 0.0

    @property
    def started(self) -> bool:
        return self._copier is not None

    def start(self, more: bool = False) -> None:
        jobs = self._plan()
        self._check_sizes(jobs)
        if self._ring is None:
            self._ring = ChildRing(self.device, ring_bytes(), self.chunk, self.threads)
        self._wake_r, self._wake_w = os.pipe()
        if self.device.type == "cuda":  # (made here: a new thread has no current context)
            self._streams = [torch.cuda.Stream(self.device) for _ in range(STREAMS)]
            self._context = _driver_context(self.device)
        self._copier = threading.Thread(target=self._copy, name="fi-convert-copy", daemon=True)
        self._queue(jobs)
        if not more:
            self._closed = True
        with _signals_held():
            self._copier.start()

    def more(self) -> None:
        super().more()
        self._wake()

    def _queue(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        assert self._ring is not None
        self._after_callers_work()
        if not self._jobs:
            self._t0 = time.perf_counter()
        first = len(self._jobs)
        self._jobs += jobs
        self._ring.send_jobs(
            [(first + k, self._ring.file(j.fd), j.offset, j.size) for k, j in enumerate(jobs)]
        )

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._wake()

    def _wake(self) -> None:
        if self._wake_w >= 0:
            os.write(self._wake_w, b"w")

    @contextlib.contextmanager
    def copies_held(self) -> Iterator[None]:
        """No copy out of the ring meanwhile (the child reads on into it)."""
        self._go.clear()
        try:
            yield
        finally:
            self._go.set()
            self._wake()

    def wait(self) -> ReadStats:
        ring = self._ring
        pinned = ring.nbytes if ring else 0
        alloc_s = ring.start_s if ring and self._own else 0.0
        try:
            self._close()
            if self._copier is not None:
                self._copier.join()
        except BaseException:
            self.abort()
            raise
        finally:
            self._finish()
        return self._result([self._end] if self._end else [], self.threads, pinned, alloc_s)

    def abort(self) -> None:
        self._stop.set()
        self._go.set()
        self._wake()
        while self._copier is not None and self._copier.is_alive():
            with contextlib.suppress(BaseException):
                self._copier.join()
        self._finish()

    def _finish(self) -> None:
        if self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        if self._own and self._ring is not None:
            self._ring.close()
            self._ring = None

    @property
    def pinned_bytes(self) -> int:
        return 0

    # -- the copier -------------------------------------------------------------------------

    def _copy(self) -> None:
        ring = self._ring
        assert ring is not None and ring.sock is not None and ring.host is not None
        drv = cuda_driver.driver() if self._context else None
        streams: list[Any] = self._streams
        events: list[int] = []
        pending: deque[int] = deque()  # slots copied out of, not given back yet
        try:
            if drv is not None:
                drv.set_context(self._context)
                events = [drv.event() for _ in range(ring.slots)]
            elif streams:  # (torch's copies, where the driver's library cannot be loaded)
                torch.cuda.set_device(self.device)
                torch.cuda.set_stream(streams[0])
                streams = streams[:1]
            self._copy_loop(ring, drv, streams, events, pending)
        except BaseException as e:
            with self._lock:
                if self._error is None:
                    self._error = _bare(e)
        finally:
            with contextlib.suppress(Exception):
                for stream in streams:
                    stream.synchronize()
                for ev in events:
                    drv.destroy(ev)  # type: ignore[union-attr]
            self._end = time.perf_counter()

    def _copy_loop(
        self,
        ring: ChildRing,
        drv: Any,
        streams: list[Any],
        events: list[int],
        pending: deque[int],
    ) -> None:
        sock = ring.sock
        assert sock is not None and ring.host is not None
        base = ring.host.data_ptr()
        chunk = ring.chunk
        while not self._stop.is_set():
            if self._closed and self._received == len(self._jobs):
                break
            ready, _, _ = select.select([sock.fileno(), self._wake_r], [], [])
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            if not self._go.is_set():
                self._go.wait()
                continue
            if sock.fileno() not in ready:
                continue
            back = []
            while (msg := ring.receive()) is not None:
                if msg == b"H":  # (set up)
                    continue
                if msg[:1] == b"X":
                    (job_id,) = wire.SLOT.unpack(msg[1:5])
                    job = self._jobs[job_id]
                    raise ReadError(
                        f"{job.path}: {msg[5:].decode(errors='replace')}; check the disk and "
                        "the file (convert or download it again), then load again"
                    )
                s, job_id = wire.READY.unpack(msg[1:])
                job = self._jobs[job_id]
                src = base + s * chunk
                stream = streams[self._received % len(streams)] if streams else None
                if drv is not None and stream is not None:
                    _to_device(drv, job, src, stream.cuda_stream, [events[s]])
                    pending.append(s)
                else:
                    self._copy_out(
                        job, ring.host[s * chunk : s * chunk + job.size], stream is not None
                    )
                    if stream is not None:
                        stream.synchronize()
                    back.append(s)
                self._received += 1
            while pending and (len(pending) > ring.slots // 2 or drv.done(events[pending[0]])):
                drv.wait(events[pending[0]])
                back.append(pending.popleft())
            ring.give_back(back)
        for s in pending:  # (the ring whole again for the next read, where it is given)
            drv.wait(events[s])
        if pending and not self._stop.is_set():
            ring.give_back(list(pending))


_ENDED = "the read's child process ended before the read did; load again"


@contextlib.contextmanager
def _child_alive() -> Iterator[None]:
    """The socket's fault as the child's end (the child killed, or out of memory)."""
    try:
        yield
    except BlockingIOError:
        raise
    except OSError:
        raise ReadError(_ENDED) from None
