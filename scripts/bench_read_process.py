"""Whether a read whose readers live in another process leaves this process's Python its speed:
the question behind a first start's asking (docs/speed.md, sessions 10-13: the model asked
under an in-process read was 3-7 times slower, the readers' turns at the interpreter's lock
slowing both).

A warm file of SIZE bytes is read into one device buffer, each side in turn, medians of RUNS:

- `threads`: this process's reader threads (`--threads` x 4 MiB, each a `preadv` into its
  pinned buffer and the driver's copy to the device: the limit of `scripts/bench_limit.py`).
- `process`: `fi_convert.child_read`'s read: a child process's reader threads `preadv` into a
  ring of shared memory that this process pinned (`cudaHostRegister`); this process's one
  thread copies each slot to the device as the child reports it filled (on `STREAMS` streams in
  turn), and gives the slot back. One side a ring size (`--ring 128,512,1024`) and stream count
  (`--streams`). (Until 2026-12-08's first GPU run, this script held a copy of that protocol of
  its own, whose copies were on one stream: the numbers of that run, `docs/speed.md`.)

Each also with work beside it: Python that calls into torch as a model's loading does (views
of a tensor, a dict), about as long as the asking of a first start at rank 0 of TP 8
(`--work-ms`). `+work`: on the main thread at the clock's start; for `process`, its copies
wait for the work to end, the ring taking the read meanwhile. `+work, copies beside`: they do
not wait; with `--switch MS`, also beside at that switch interval of the interpreter's while
the work runs. Reported: the read's time, the work's time beside it, and the work alone.

    python scripts/bench_read_process.py [--size GB] [--runs N] [--threads N] [--ring MIB,...]
        [--streams N,...] [--switch MS] [--work-ms MS] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert import child_read, cuda_driver  # noqa: E402
from fi_convert.child_read import ChildRing  # noqa: E402

CHUNK = 4 << 20
MIB = 1 << 20


def process_read(
    ring: ChildRing,
    streams: int,
    path: str,
    dst: torch.Tensor,
    work: int,
    hold: bool,
    switch: float | None = None,
) -> tuple[float, float]:
    """The `process` side: `child_read.ProcessRead` on `ring` (its child started, its memory
    pinned, before the clock), its copies on `streams` streams; with `work`, the copies held
    meanwhile or beside it (at the switch interval `switch`)."""
    child_read.STREAMS = streams
    fd = os.open(path, os.O_RDONLY)
    try:
        read = child_read.ProcessRead(dst.device, ring=ring)
        read.add(Path(path), fd, 0, dst)
        work_s = 0.0
        t0 = time.perf_counter()
        read.start()
        if work:
            was = sys.getswitchinterval()
            if switch is not None:
                sys.setswitchinterval(switch)
            try:
                with read.copies_held() if hold else contextlib.nullcontext():
                    work_s = workload(work)
            finally:
                sys.setswitchinterval(was)
        read.wait()
        if dst.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, work_s
    finally:
        os.close(fd)


def thread_read(
    path: str, size: int, threads: int, dst: torch.Tensor, work: int
) -> tuple[float, float]:
    """The `threads` side: 16 x 4 MiB in this process, threads started before the clock."""
    drv = cuda_driver.driver()
    assert drv is not None
    ctx = drv.current_context()
    fd = os.open(path, os.O_RDONLY)
    n = (size + CHUNK - 1) // CHUNK
    it, lock = iter(range(n)), threading.Lock()
    set_up, go = threading.Barrier(threads + 1), threading.Event()
    base = dst.data_ptr()

    def reader() -> None:
        drv.set_context(ctx)
        stream = torch.cuda.Stream()
        bufs = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        views = [memoryview(b.numpy()).cast("B") for b in bufs]
        ptrs = [b.data_ptr() for b in bufs]
        events = [drv.event() for _ in range(2)]
        set_up.wait()
        go.wait()
        i = 0
        while True:
            with lock:
                j = next(it, None)
            if j is None:
                break
            if i >= 2:
                drv.wait(events[i % 2])
            at = j * CHUNK
            m = min(CHUNK, size - at)
            os.preadv(fd, [views[i % 2][:m]], at)
            drv.copy_to_device(base + at, ptrs[i % 2], m, stream.cuda_stream)
            drv.record(events[i % 2], stream.cuda_stream)
            i += 1
        stream.synchronize()

    ts = [threading.Thread(target=reader) for _ in range(threads)]
    for t in ts:
        t.start()
    set_up.wait()
    t0 = time.perf_counter()
    go.set()
    work_s = workload(work) if work else 0.0
    for t in ts:
        t.join()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    os.close(fd)
    return seconds, work_s


_T = torch.empty(4096, 64, device="cuda" if torch.cuda.is_available() else "cpu")


def workload(n: int) -> float:
    """Python calling into torch as a model's loading does: views of a tensor, their shapes and
    strides into a dict."""
    t0 = time.perf_counter()
    seen: dict[int, tuple] = {}
    t = _T
    for i in range(n):
        v = t.narrow(0, i % 2048, 16).view(-1)
        seen[i % 97] = (v.shape, v.stride(), v.storage_offset())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=float, default=1.8, help="GB read")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--ring", default="1024", help="MiB of shared ring (a list: each a side)")
    ap.add_argument(
        "--switch", type=float, default=None, help="ms: the switch interval while working"
    )
    ap.add_argument("--work-ms", type=float, default=8.0)
    ap.add_argument("--streams", default="1,4", help="copy streams of the process side(s)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dir", default=None, help="folder for the file (default: a temp folder)")
    a = ap.parse_args()
    size = int(a.size * 1e9) // CHUNK * CHUNK
    with tempfile.TemporaryDirectory(prefix="bench-read-process-", dir=a.dir) as tmp:
        path = os.path.join(tmp, "data.bin")
        with open(path, "wb") as f:
            block = os.urandom(64 * MIB)
            for at in range(0, size, len(block)):
                f.write(block[: min(len(block), size - at)])
        with open(path, "rb") as f:  # (warm)
            while f.read(256 * MIB):
                pass
        # the work's length: calibrated alone
        n = 1000
        while workload(n) < a.work_ms / 1e3:
            n *= 2
        n = int(n * a.work_ms / 1e3 / workload(n))
        alone = statistics.median(workload(n) for _ in range(15))
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        dst = torch.empty(size, dtype=torch.uint8, device=dev)
        counts = [int(x) for x in a.streams.split(",")]
        rings = [int(x) for x in a.ring.split(",")]
        children = {r: ChildRing(dev, r * MIB, CHUNK, a.threads) for r in rings}
        switch = None if a.switch is None else a.switch / 1e3
        sides = (
            {}
            if dev == "cpu"
            else {
                "threads": lambda: thread_read(path, size, a.threads, dst, 0),
                "threads +work": lambda: thread_read(path, size, a.threads, dst, n),
            }
        )
        for (r, ring), k in itertools.product(children.items(), counts):
            name = f"process, ring {r} MiB, {k} streams"

            def side(work: int, hold: bool, at: float | None = None, ring=ring, k=k):
                return lambda: process_read(ring, k, path, dst, work, hold, at)

            sides |= {
                name: side(0, True),
                f"{name} +work": side(n, True),
                f"{name} +work, copies beside": side(n, False),
            }
            if switch is not None:
                sides[f"{name} +work, copies beside, switch {a.switch} ms"] = side(n, False, switch)
        ref = torch.empty(size, dtype=torch.uint8)
        with open(path, "rb") as f:
            f.readinto(memoryview(ref.numpy()))
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
        for r in range(a.runs + 1):
            for name, fn in sides.items():
                dst.zero_()
                if dev == "cuda":
                    torch.cuda.synchronize()
                got = fn()
                if r == 0:  # (each side's first run: its bytes checked, its time left out)
                    assert torch.equal(dst.cpu(), ref), f"{name}: the bytes differ"
                else:
                    times[name].append(got)
        for ring in children.values():
            ring.close()
    limit = statistics.median(t for t, _ in next(iter(times.values())))
    rows = []
    print(
        f"{size / 1e9:.2f} GB warm, {a.threads} readers x 4 MiB, rings {a.ring} MiB, "
        f"work alone {alone * 1e3:.1f} ms; medians of {a.runs}"
    )
    print("| side | read ms | / threads alone | work beside ms |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        read = statistics.median(t for t, _ in ts)
        work = statistics.median(w for _, w in ts)
        rows.append({"side": name, "read_s": read, "work_s": work, "runs": ts})
        print(f"| {name} | {read * 1e3:.1f} | {read / limit:.2f} | {work * 1e3:.1f} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "read-process.json").write_text(
            json.dumps(
                {
                    "bytes": size,
                    "threads": a.threads,
                    "rings": [r * MIB for r in rings],
                    "work_alone_s": alone,
                    "results": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
