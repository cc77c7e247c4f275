"""`BulkRead` against the bench's plain parallel copy (`bench_limit.limit_path`) at several
chunk sizes, on one file of random bytes in the page cache (no model, no conversion: seconds
on the GPU machine). Sides alternate run by run; per-run ratios to the same run's first side.
For each `BulkRead` side the time its threads ran is kept apart from the whole (planning the
jobs and starting the threads are the rest). `--block` adds the limit with its buffers cut from
one pinned block, as `BulkRead`'s are; `--fresh` the limit from a block pinned afresh each
run (as `BulkRead`'s is, for each load) and `BulkRead` from one block kept run after run (as
the limit's are torch's cached ones); `--torch` the limit with torch's copies and events (its
own are the CUDA driver's, as `BulkRead`'s); `--alt NAME=PATH` adds the `BulkRead` of another
bulk_read.py (an older commit's, a variant), with that file's own defaults.

    python scripts/bench_read_chunks.py [--gb 1.3] [--runs 10] [--chunks 4,8,16] [--threads 16]
        [--block] [--fresh] [--torch] [--alt NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert import bulk_read  # noqa: E402
from scripts.bench_limit import limit_path  # noqa: E402

MiB = 1 << 20


def bulk_side(
    path: str,
    size: int,
    dev: str,
    threads: int,
    chunk: int,
    module: ModuleType = bulk_read,
    kept: bulk_read.HostBuffers | None = None,
) -> tuple[float, float]:
    """One BulkRead (of `module`) of the whole file into one device buffer, its pinned block
    made ahead (pinned afresh, as for each load; or `kept`, one block used run after run, as
    the limit's buffers are torch's cached ones): the whole time, and the time its threads
    ran."""
    dst = torch.zeros(size, dtype=torch.uint8, device=dev)
    ahead = kept or _fresh_block(threads, chunk, dev)
    fd = os.open(path, os.O_RDONLY)
    bulk = module.BulkRead(dev, threads=threads, chunk=chunk, buffers=ahead, host_memory=2 << 30)
    bulk.add(Path(path), fd, 0, dst)
    t0 = time.perf_counter()
    stats = bulk.run()
    if dev == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    os.close(fd)
    if kept is None:
        ahead.free(background=False)
    return seconds, stats.seconds


def _fresh_block(threads: int, chunk: int, dev: str) -> bulk_read.HostBuffers:
    return bulk_read.HostBuffers(threads * bulk_read.DEPTH * chunk, pinned=dev == "cuda").allocate()


def _module(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"fi_convert._bench_{name}", path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.3)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--chunks", default="4,8,16", help="MiB, comma-separated")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--block", action="store_true", help="the limit from one pinned block too")
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="the limit from a block pinned afresh each run, and BulkRead from one kept block",
    )
    ap.add_argument(
        "--torch", action="store_true", help="the limit with torch's copies (not the driver's) too"
    )
    ap.add_argument("--alt", action="append", default=[], help="NAME=PATH of a bulk_read.py")
    ap.add_argument("--tmp", default=None)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    size = int(a.gb * 1e9) // MiB * MiB
    chunks = [int(c) * MiB for c in a.chunks.split(",")]
    modules = {"BulkRead": bulk_read} | {
        name: _module(name, path) for name, path in (x.split("=", 1) for x in a.alt)
    }
    kinds = ["limit"] + (["limit block"] if a.block else []) + list(modules)
    kinds += ["limit fresh", "BulkRead kept"] if a.fresh else []
    kinds += ["limit torch"] if a.torch else []
    kept = {c: _fresh_block(a.threads, c, dev) for c in chunks} if a.fresh else {}
    sides = {f"{kind} {c // MiB} MiB": (kind, c) for kind in kinds for c in chunks}
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        path = str(Path(tmp) / "bytes")
        with open(path, "wb") as f:
            for _ in range(size // (64 * MiB)):
                f.write(os.urandom(64 * MiB))
            f.write(os.urandom(size % (64 * MiB)))
        with open(path, "rb") as f:  # in the page cache
            while f.read(64 * MiB):
                pass
        runs: dict[str, list[float]] = {s: [] for s in sides}
        threads_s: dict[str, list[float]] = {s: [] for s in sides}
        names = list(sides)
        for k in range(a.runs + 1):
            for s in names[k % len(names) :] + names[: k % len(names)]:
                kind, c = sides[s]
                if kind == "limit fresh":
                    fresh = _fresh_block(a.threads, c, dev)
                    r = limit_path([(path, 0, size)], dev, a.threads, c, block=fresh.block())
                    fresh.free(background=False)
                    t, ran = r["read_s"], r["read_s"]
                elif kind == "limit torch":
                    r = limit_path([(path, 0, size)], dev, a.threads, c, driver=False)
                    t, ran = r["read_s"], r["read_s"]
                elif kind.startswith("limit"):
                    r = limit_path([(path, 0, size)], dev, a.threads, c, block=kind != "limit")
                    t, ran = r["read_s"], r["read_s"]
                elif kind == "BulkRead kept":
                    t, ran = bulk_side(path, size, dev, a.threads, c, kept=kept[c])
                else:
                    t, ran = bulk_side(path, size, dev, a.threads, c, modules[kind])
                if k:  # (run 0 warms each side)
                    runs[s].append(t)
                    threads_s[s].append(ran)
            if k:
                print(
                    f"run {k}: " + ", ".join(f"{s} {runs[s][-1] * 1e3:.1f}" for s in names),
                    flush=True,
                )
    for block in kept.values():
        block.free(background=False)
    first = runs[names[0]]
    print(f"{size / 1e9:.2f} GB, {a.threads} threads, {dev}; medians of {a.runs}:")
    for s in names:
        ratio = statistics.median(t / f for t, f in zip(runs[s], first, strict=True))
        ms = statistics.median(runs[s])
        ran = statistics.median(threads_s[s])
        apart = "" if sides[s][0].startswith("limit") else f", its threads {ran * 1e3:.1f} ms"
        print(
            f"  {s:22s} {ms * 1e3:6.1f} ms ({size / ms / 1e9:.1f} GB/s), {ratio:.2f} of the first"
            + apart
        )


if __name__ == "__main__":
    main()
