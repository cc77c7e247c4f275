"""`BulkRead` against the bench's plain parallel copy (`bench_limit.limit_path`) at several
chunk sizes, on one file of random bytes in the page cache (no model, no conversion: seconds
on the GPU machine). Sides alternate run by run; per-run ratios to the same run's first side.

    python scripts/bench_read_chunks.py [--gb 1.3] [--runs 10] [--chunks 4,8,16] [--threads 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert.bulk_read import DEPTH, BulkRead, HostBuffers  # noqa: E402
from scripts.bench_limit import limit_path  # noqa: E402

MiB = 1 << 20


def bulk_side(path: str, size: int, dev: str, threads: int, chunk: int) -> float:
    """One BulkRead of the whole file into one device buffer, its pinned block made ahead."""
    dst = torch.zeros(size, dtype=torch.uint8, device=dev)
    ahead = HostBuffers(threads * DEPTH * chunk, pinned=dev == "cuda").allocate()
    fd = os.open(path, os.O_RDONLY)
    bulk = BulkRead(dev, threads=threads, chunk=chunk, buffers=ahead, host_memory=2 << 30)
    bulk.add(Path(path), fd, 0, dst)
    t0 = time.perf_counter()
    bulk.run()
    if dev == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    os.close(fd)
    ahead.free(background=False)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.3)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--chunks", default="4,8,16", help="MiB, comma-separated")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--tmp", default=None)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    size = int(a.gb * 1e9) // MiB * MiB
    chunks = [int(c) * MiB for c in a.chunks.split(",")]
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        path = str(Path(tmp) / "bytes")
        with open(path, "wb") as f:
            for _ in range(size // (64 * MiB)):
                f.write(os.urandom(64 * MiB))
            f.write(os.urandom(size % (64 * MiB)))
        with open(path, "rb") as f:  # in the page cache
            while f.read(64 * MiB):
                pass
        sides = {f"limit {c // MiB} MiB": c for c in chunks}
        sides |= {f"BulkRead {c // MiB} MiB": c for c in chunks}
        runs: dict[str, list[float]] = {s: [] for s in sides}
        names = list(sides)
        for k in range(a.runs + 1):
            for s in names[k % len(names) :] + names[: k % len(names)]:
                c = sides[s]
                if s.startswith("limit"):
                    t = limit_path([(path, 0, size)], dev, a.threads, c)["read_s"]
                else:
                    t = bulk_side(path, size, dev, a.threads, c)
                if k:  # (run 0 warms each side)
                    runs[s].append(t)
            if k:
                print(
                    f"run {k}: " + ", ".join(f"{s} {runs[s][-1] * 1e3:.1f}" for s in names),
                    flush=True,
                )
    first = runs[names[0]]
    print(f"{size / 1e9:.2f} GB, {a.threads} threads, {dev}; medians of {a.runs}:")
    for s in names:
        ratio = statistics.median(t / f for t, f in zip(runs[s], first, strict=True))
        ms = statistics.median(runs[s])
        print(
            f"  {s:16s} {ms * 1e3:6.1f} ms ({size / ms / 1e9:.1f} GB/s), {ratio:.2f} of the first"
        )


if __name__ == "__main__":
    main()
