"""The machine's limit for a read of byte ranges into a device (`make bench`'s benches): plain
parallel reads into pinned buffers, each thread copying to the device on its own stream."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import torch

from fi_convert import cuda_driver


def limit_path(
    spans: list,
    dev: str,
    threads: int,
    chunk: int,
    fresh: bool = False,
    block: bool | torch.Tensor = False,
    driver: bool = True,
    ready: bool = False,
) -> dict:
    """Plain parallel reads of `spans` into preallocated pinned buffers, copied to one
    preallocated device buffer on each thread's own stream (into host memory on CPU). With
    `fresh` (host memory), into pages never touched, as a layer's new parameters are: their
    first touch is part of the time. With `block`, the buffers are cut from one pinned block,
    as `BulkRead`'s are (else each is its own allocation): torch's cached one, or the one given
    (a block pinned afresh, as `BulkRead`'s is for each load). Each thread calls into torch as
    little as it can (its stream set once, its buffers' bytes and events made once, the
    destinations cut before the clock starts): every call gives up the interpreter's lock and
    waits to take it back. Into a GPU its copies and events are the CUDA driver's own calls on
    plain addresses, as `BulkRead`'s are (`fi_convert.cuda_driver`): 0.88-0.93 of the time of
    the same loop through torch on an H100 (2026-12-06); `driver=False` makes them torch's.
    With `ready`, the threads are started (their buffers' views, events and context made)
    before the clock, and wait for it: the read alone, without the threads' start, which a
    server's plugin makes while the model is built (the 16th thread started 5-9 ms after the
    first, each start waiting for the interpreter's lock beside the threads reading)."""
    total = sum(s for *_, s in spans)
    dst = (torch.empty if fresh else torch.zeros)(total, dtype=torch.uint8, device=dev)
    fds = {p: os.open(p, os.O_RDONLY) for p in {s[0] for s in spans}}
    jobs, pos = [], 0
    for path, off, size in spans:
        for at in range(0, size, chunk):
            n = min(chunk, size - at)
            jobs.append((fds[path], off + at, n, dst[pos + at : pos + at + n]))
        pos += size
    cuda = dev == "cuda"
    if block is not False:
        whole = (
            block
            if isinstance(block, torch.Tensor)
            else torch.empty(threads * 2 * chunk, dtype=torch.uint8, pin_memory=cuda)
        )
        cut = [whole[i * chunk : (i + 1) * chunk] for i in range(threads * 2)]
        bufs = [cut[2 * k : 2 * k + 2] for k in range(threads)]
    else:
        bufs = [
            [torch.empty(chunk, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
            for _ in range(threads)
        ]
    streams = [torch.cuda.Stream() if cuda else None for _ in range(threads)]
    nxt, lock = iter(jobs), threading.Lock()
    go = threading.Event()
    if not ready:
        go.set()
    set_up = threading.Barrier(threads + 1) if ready else None
    drv = cuda_driver.driver() if cuda and driver else None
    if drv is not None:
        ctx = drv.current_context()
        jobs = [(fd, off, n, to.data_ptr()) for fd, off, n, to in jobs]
        nxt = iter(jobs)

    def taken() -> Iterator[tuple]:
        """The jobs one thread takes, in turn with the others."""
        while True:
            with lock:
                job = next(nxt, None)
            if job is None:
                return
            yield job

    def work_driver(k: int) -> None:
        assert drv is not None
        drv.set_context(ctx)
        stream = streams[k].cuda_stream  # type: ignore[union-attr]
        views = [memoryview(b.numpy()).cast("B") for b in bufs[k]]
        base = [b.data_ptr() for b in bufs[k]]
        events = [drv.event() for _ in range(2)]
        _ready(set_up, go)
        for i, (fd, off, n, to) in enumerate(taken()):
            if i >= 2:
                drv.wait(events[i % 2])
            os.preadv(fd, [views[i % 2][:n]], off)
            drv.copy_to_device(to, base[i % 2], n, stream)
            drv.record(events[i % 2], stream)
        streams[k].synchronize()  # type: ignore[union-attr]
        for ev in events:
            drv.destroy(ev)

    def work(k: int) -> None:
        mine = bufs[k]
        views = [memoryview(b.numpy()).cast("B") for b in mine]
        events = [torch.cuda.Event() for _ in range(2)] if cuda else []
        if cuda:
            torch.cuda.set_stream(streams[k])
        _ready(set_up, go)
        for i, (fd, off, n, to) in enumerate(taken()):
            if not cuda:
                os.preadv(fd, [memoryview(to.numpy()).cast("B")], off)
                continue
            b = i % 2
            if i >= 2:
                events[b].synchronize()
            os.preadv(fd, [views[b][:n]], off)
            to.copy_(mine[b] if n == chunk else mine[b][:n], non_blocking=True)
            events[b].record(streams[k])
        if cuda:
            streams[k].synchronize()

    ts = [
        threading.Thread(target=work if drv is None else work_driver, args=(k,))
        for k in range(threads)
    ]
    if ready:
        for t in ts:
            t.start()
        set_up.wait()  # type: ignore[union-attr]
    t0 = time.perf_counter()
    go.set()
    for t in ts if not ready else ():
        t.start()
    for t in ts:
        t.join()
    if dev == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return {"read_s": seconds, "bytes": total, "threads": threads, "chunk": chunk}


def _ready(set_up: threading.Barrier | None, go: threading.Event) -> None:
    """A thread set up; with `set_up`, it waits for the clock."""
    if set_up is not None:
        set_up.wait()
        go.wait()
