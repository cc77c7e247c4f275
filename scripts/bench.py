"""`make bench`: conversion vs a plain copy, peak memory, and the layout transform vs vLLM's
per-expert FlashInfer loop, each measured side by side in one run. Prints a table, writes JSON.

    python scripts/bench.py [--out DIR] [--experts N] [--layers L] [--repeat R] [--device D]
                             [--transform-only]

The checkpoint has DeepSeek-V3's expert shapes (hidden 7168, expert intermediate 2048, FP8
128x128 blocks) with fewer layers and experts. Times are medians of --repeat runs. On a GPU
the transform is also timed for a whole DeepSeek-V3 layer (256 experts); --transform-only
skips the conversions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fi_convert import Options, SchemeName, convert, make_plan
from fi_convert import layout as L
from fi_convert.testing.synthetic import Spec, write_checkpoint

H, INTER = 7168, 2048
FULL_LAYER = 256  # DeepSeek-V3's routed experts per layer
COPY_BLOCK = 64 * 2**20


def median_time(fn, repeat: int, setup=None) -> float:
    times = []
    for _ in range(repeat):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def drop_cache(folder: Path) -> None:
    """Evict a folder's files from the page cache (posix_fadvise; no root needed)."""
    for p in folder.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd) if os.access(p, os.W_OK) else None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def interleaved(measures: dict, repeat: int) -> dict[str, list[float]]:
    """Seconds of each (fn, setup) in `measures`, run in turns (a, b, c, a, b, c, ...) so
    that a slow spell of a noisy machine falls on all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in measures}
    for _ in range(repeat):
        for k, (fn, setup) in measures.items():
            setup()
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


def cpu_seconds(src: Path, out: Path, args, repeat: int) -> dict:
    """Where a conversion's CPU time goes: thread CPU time inside the functions that hash,
    write(), copy in the kernel, read source bytes and produce converted chunks, summed over
    all threads, for `--no-fsync` conversions (medians of `repeat`); and `cp -r`'s CPU time
    for the same folder. On a machine with few CPUs these sums bound the wall time."""
    from fi_convert import outdir, st_io
    from fi_convert import pipeline as conv_mod

    spent: dict[str, float] = {}

    def timed(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.thread_time() - t

        setattr(owner, name, wrapper)
        patched.append((owner, name, fn))

    patched: list = []
    timed(st_io.ShardWriter, "hash_bytes", "sha256")
    timed(st_io.ShardWriter, "hash_written", "sha256")
    timed(st_io, "_write_all", "write")
    timed(outdir, "sha256_file", "sha256")  # shards with no experts are copied whole
    timed(st_io.ShardWriter, "_copy_some", "kernel_copy")
    timed(shutil, "copyfile", "kernel_copy")
    timed(st_io, "pread_into", "read")
    timed(conv_mod, "_produce_tensor", "produce")
    runs: list[dict[str, float]] = []
    try:
        for _ in range(repeat):
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            spent.clear()
            cpu = time.process_time()
            opts = Options(SchemeName.FP8_BLOCK, max_memory=args.max_memory)
            convert(src, out, opts, device=args.device, fsync=False)
            r = dict(spent, total=time.process_time() - cpu)
            r["transform"] = r.pop("produce") - r["read"]  # gathers, casts, device copies
            r["other"] = r["total"] - sum(v for k, v in r.items() if k != "total")
            runs.append(r)
    finally:
        for owner, name, fn in patched:
            setattr(owner, name, fn)
    cp = []
    for _ in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        os.sync()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["cp", "-r", str(src), str(out)], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cp.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    shutil.rmtree(out, ignore_errors=True)
    res = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    res["cp"] = statistics.median(cp)
    return res


def peak_rss(src: Path, out: Path, device: str, max_memory: int) -> tuple[float, float]:
    """(peak, baseline) resident memory in GiB of a conversion in a fresh process: VmHWM
    after it, and VmRSS before it, once torch is imported and (on CUDA) its context made.
    A new program starts its VmHWM afresh (ru_maxrss would carry over the forking parent's)."""
    code = (
        "import torch\n"
        "from fi_convert import convert, Options\n"
        "from fi_convert.pipeline import resolve_device\n"
        f"dev = resolve_device({device!r})\n"
        "torch.zeros(1, device=dev)\n"
        "def kib(key): return next(l for l in open('/proc/self/status') if l.startswith(key))"
        ".split()[1]\n"
        "base = kib('VmRSS')\n"
        f"convert({str(src)!r}, {str(out)!r}, Options(max_memory={max_memory}), device=dev.type,"
        " overwrite=True)\n"
        "print(kib('VmHWM'), base)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    peak, base = (int(x) / 2**20 for x in r.stdout.strip().splitlines()[-1].split())
    return peak, base


def ds_spec(moe_layers: int, experts: int, shards: int = 4) -> Spec:
    """A DeepSeek-V3-shaped checkpoint: one dense layer, then `moe_layers` of `experts`."""
    return Spec(
        "deepseek-v3",
        layers=moe_layers + 1,
        dense_layers=1,
        experts=experts,
        hidden=H,
        intermediate=INTER,
        shards=shards,
        vocab=1024,
    )


def bench_size(root: Path, label: str, experts: int, args) -> dict:
    spec = ds_spec(args.layers, experts)
    src = write_checkpoint(root / f"src-{label}", spec)
    out, cp_out = root / f"out-{label}", root / f"cp-{label}"
    row: dict = {"source_bytes": sum(p.stat().st_size for p in src.glob("*.safetensors"))}

    def clean():  # and no dirty pages left by the previous run to slow the next one down
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(cp_out, ignore_errors=True)
        os.sync()

    def cold():
        clean()
        drop_cache(src)

    def conv(fsync: bool = True):
        opts = Options(SchemeName.FP8_BLOCK, max_memory=args.max_memory)
        res = convert(src, out, opts, device=args.device, fsync=fsync)
        row["jobs"], row["output_shards"] = res.jobs, len(res.plan.shards)

    def copy():
        subprocess.run(["cp", "-r", str(src), str(cp_out)], check=True)

    def copy_sync():  # fi-convert fsyncs its output before the manifest; cp does not
        copy()
        subprocess.run(["sync", "-f", str(cp_out)], check=True)

    shards = sorted(src.glob("*.safetensors"))
    block = bytearray(COPY_BLOCK)  # written over and over: the bytes do not matter here

    def sha256_all():  # one thread, from the page cache, no copy (what hashlib can do)
        for f in shards:
            with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as m:
                hashlib.sha256(m)

    def write_all():  # the same bytes from memory into new files, one thread
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "bytes", "wb") as f:
            left = row["source_bytes"]
            while left > 0:
                left -= f.write(memoryview(block)[: min(left, COPY_BLOCK)])

    conv()  # warm the page cache and the code
    warm = interleaved(
        {
            "convert_warm_s": (conv, clean),
            "convert_nofsync_warm_s": (lambda: conv(fsync=False), clean),
            "cp_warm_s": (copy, clean),
            "cp_sync_warm_s": (copy_sync, clean),
            "sha256_s": (sha256_all, clean),
            "write_s": (write_all, clean),
        },
        args.repeat,
    )
    # What bounds any conversion that hashes every output byte with SHA-256, write()s the
    # bytes it converts and copies the others as cp does: that work spread over all CPUs, or
    # the largest output shard's hash, which is sequential. From the fastest of the runs
    # above: a floor, not a forecast.
    cpus = len(os.sched_getaffinity(0))
    plan = make_plan(src, Options(SchemeName.FP8_BLOCK))
    largest = max(s.nbytes for s in plan.shards)
    made = sum(i.entry.nbytes for s in plan.shards for i in s.items if i.source is None)
    made /= sum(s.nbytes for s in plan.shards)  # the share of bytes the conversion produces
    sha, wr, cp = (min(warm[k]) for k in ("sha256_s", "write_s", "cp_warm_s"))
    work = sha + made * wr + (1 - made) * cp
    row["floor_s"] = max(work / cpus, largest / (row["source_bytes"] / sha))
    row["converted_share"] = made
    cold_ = interleaved(
        {
            "convert_cold_s": (conv, cold),
            "convert_nofsync_cold_s": (lambda: conv(fsync=False), cold),
            "cp_cold_s": (copy, cold),
        },
        args.repeat,
    )
    row.update({k: statistics.median(v) for k, v in (warm | cold_).items()})
    row["runs"] = {k: [round(t, 4) for t in v] for k, v in (warm | cold_).items()}
    row["floor_ratio"] = row["floor_s"] / row["cp_warm_s"]
    row["ratio_warm"] = row["convert_warm_s"] / row["cp_warm_s"]
    row["ratio_warm_nofsync"] = row["convert_nofsync_warm_s"] / row["cp_warm_s"]
    row["ratio_warm_vs_cp_sync"] = row["convert_warm_s"] / row["cp_sync_warm_s"]
    row["ratio_cold"] = row["convert_cold_s"] / row["cp_cold_s"]
    row["ratio_cold_nofsync"] = row["convert_nofsync_cold_s"] / row["cp_cold_s"]
    row["peak_rss_gib"], row["base_rss_gib"] = peak_rss(src, out, args.device, args.max_memory)
    row["cpu_s"] = cpu_seconds(src, out, args, args.repeat)
    row["budget_gib"] = args.max_memory / 2**30
    clean()
    shutil.rmtree(src)
    return row


def bench_end_to_end(root: Path, args) -> dict:
    sizes = (("small", args.experts // 2), ("large", args.experts))
    return {label: bench_size(root, label, experts, args) for label, experts in sizes}


def bench_transform(device: torch.device, experts: int, repeat: int) -> dict:
    """One layer's w13 transform: ours (one gather) vs the per-expert FlashInfer loop that
    vLLM 0.33 runs for the scheme, and a plain copy of the same bytes. Each pair is checked
    to give the same bytes, so the two sides do the same work."""
    from flashinfer import reorder_rows_for_gated_act_gemm, shuffle_matrix_a
    from flashinfer.fused_moe import convert_to_block_layout
    from flashinfer.fused_moe.core import _maybe_get_cached_w3_w1_permute_indices

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    w = torch.randint(0, 255, (experts, 2 * INTER, H), dtype=torch.uint8, device=device)
    out4 = torch.empty(experts, H // 128, 2 * INTER, 128, dtype=torch.uint8, device=device)
    flat = torch.empty_like(w)

    def timed(fn):
        fn()
        sync()
        return median_time(lambda: (fn(), sync()), repeat)

    def side_by_side(ours, loop, out: torch.Tensor) -> dict:
        r = {"ours_s": timed(ours)}
        expect = out.clone()
        r["flashinfer_loop_s"] = timed(loop)
        if not torch.equal(out, expect):
            raise SystemExit("bench: our transform and FlashInfer's loop disagree")
        return r

    def w31(x: torch.Tensor) -> torch.Tensor:  # vLLM's swap_w13_to_w31
        return torch.cat([x[:, INTER:], x[:, :INTER]], dim=1)

    res = {}
    # fp8-block TRT-LLM (`_shuffle_deepseek_fp8_moe_weights`): swap, shuffle(64), BlockMajorK
    idx = L.compose(L.swap_halves_index(2 * INTER), L.shuffle_row_index(2 * INTER, 64)).to(device)

    def vllm_fp8():
        ws = w31(w)
        for e in range(experts):
            out4[e] = convert_to_block_layout(shuffle_matrix_a(ws[e], 64), 128)

    res["fp8-block"] = side_by_side(
        lambda: L.gather_rows_block_major(w, idx, 128, out4), vllm_fp8, out4
    )
    # bf16 TRT-LLM on the same bytes viewed as bf16 (vLLM's
    # `convert_moe_weights_to_flashinfer_trtllm_block_layout`): a cached row permutation
    # (interleave, shuffle(128), rotated by half) and one index_select of 128-byte blocks
    # per expert
    wb = w.view(torch.bfloat16)
    idx = L.compose(
        L.swap_halves_index(2 * INTER),
        L.gated_interleave_index(2 * INTER),
        L.shuffle_row_index(2 * INTER, 128),
    ).to(device)
    ob = out4.view(torch.bfloat16).view(experts, H // 128, 2 * INTER, 64)
    cache: dict = {}

    def vllm_bf16():
        for e in range(experts):
            x = wb[e].view(torch.uint8)
            perm = _maybe_get_cached_w3_w1_permute_indices(cache, x, 128, is_gated_act_gemm=True)
            rows = x.shape[0]
            perm = (perm + rows // 2) % rows
            blocks = x.view(rows, H // 128, 128).permute(1, 0, 2)
            torch.index_select(blocks, 1, perm.to(device), out=out4[e])

    res["bf16"] = side_by_side(lambda: L.gather_rows_block_major(wb, idx, 64, ob), vllm_bf16, out4)

    # mxfp8 TRT-LLM weights (`_shuffle_mxfp8_moe_weights`): swap, interleave, shuffle(128)
    def vllm_mx():
        ws = w31(w)
        for e in range(experts):
            flat[e] = shuffle_matrix_a(reorder_rows_for_gated_act_gemm(ws[e]), 128)

    res["mxfp8"] = side_by_side(lambda: L.gather_rows(w, idx, flat), vllm_mx, flat)
    copy = timed(lambda: flat.copy_(w))
    for r in res.values():
        r["copy_s"] = copy
        r["speedup_vs_flashinfer"] = r["flashinfer_loop_s"] / r["ours_s"]
        r["ours_vs_copy"] = r["ours_s"] / copy
        r["loop_vs_copy"] = r["flashinfer_loop_s"] / copy  # what no transform can beat
    res["bytes"], res["experts"] = w.numel(), experts
    return res


def _print_end_to_end(e2e: dict, args, dev: torch.device) -> None:
    print(f"device {dev}, {os.cpu_count()} CPUs; medians of {args.repeat} runs")
    cols = ("GB", "conv", "cp", "ratio", "no-fsync", "ratio", "cp+sync", "ratio")
    cols += ("conv cold", "no-fsync", "cp cold", "ratio", "ratio", "floor", "peak GiB")
    cols += ("base GiB",)
    print(f"{'model':>9} " + " ".join(f"{c:>9}" for c in cols))
    for k, r in e2e.items():
        vals = (
            r["source_bytes"] / 1e9,
            r["convert_warm_s"],
            r["cp_warm_s"],
            r["ratio_warm"],
            r["convert_nofsync_warm_s"],
            r["ratio_warm_nofsync"],
            r["cp_sync_warm_s"],
            r["ratio_warm_vs_cp_sync"],
            r["convert_cold_s"],
            r["convert_nofsync_cold_s"],
            r["cp_cold_s"],
            r["ratio_cold"],
            r["ratio_cold_nofsync"],
            r["floor_ratio"],
            r["peak_rss_gib"],
            r["base_rss_gib"],
        )
        print(f"{k:>9} " + " ".join(f"{v:9.2f}" for v in vals))
    print(
        "conv: fi-convert (fsync before the manifest); no-fsync: with --no-fsync; ratios are "
        "to cp -r (and cp -r && sync); floor: the least ratio for a conversion that SHA-256s "
        "every byte, write()s the bytes it converts and copies the rest as cp does, from this "
        "machine's speeds; peak: resident "
        f"memory, base: before converting (torch and CUDA loaded); budget "
        f"{args.max_memory / 2**30:.2f} GiB"
    )
    keys = ("sha256", "write", "kernel_copy", "read", "transform", "other", "total", "cp")
    print(f"\nCPU seconds of a --no-fsync conversion, summed over threads ({os.cpu_count()} CPUs)")
    print(f"{'model':>9} " + " ".join(f"{k:>11}" for k in keys))
    for k, r in e2e.items():
        print(f"{k:>9} " + " ".join(f"{r['cpu_s'][c]:11.2f}" for c in keys))
    print(
        "sha256: hashing every output byte; write: write() of converted bytes; kernel_copy: "
        "copy_file_range or sendfile of carried-over bytes; read: pread of source bytes; "
        "transform: the rest of making converted chunks; cp: cp -r of the same folder"
    )


def _print_transform(tr: dict, dev: torch.device) -> None:
    print(
        f"\nlayout transform of one w13 ({tr['bytes'] / 1e9:.2f} GB, {tr['experts']} experts) "
        f"on {dev}"
    )
    print(
        f"{'scheme':10} {'ours ms':>9} {'FI loop ms':>11} {'speedup':>8} {'copy ms':>8} "
        f"{'ours/copy':>10} {'loop/copy':>10}"
    )
    for k in ("fp8-block", "bf16", "mxfp8"):
        r = tr[k]
        print(
            f"{k:10} {r['ours_s'] * 1e3:9.2f} {r['flashinfer_loop_s'] * 1e3:11.2f} "
            f"{r['speedup_vs_flashinfer']:8.1f} {r['copy_s'] * 1e3:8.2f} "
            f"{r['ours_vs_copy']:10.2f} {r['loop_vs_copy']:10.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-memory", type=int, default=2**30, help="conversion budget, bytes")
    ap.add_argument("--tmp", default=None, help="folder for checkpoints (default: a temp dir)")
    ap.add_argument("--transform-only", action="store_true", help="skip the conversions")
    args = ap.parse_args()
    dev = torch.device(
        "cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    )
    e2e: dict = {}
    if not args.transform_only:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            e2e = bench_end_to_end(Path(tmp), args)
    tr = bench_transform(dev, args.experts, max(args.repeat, 5))
    # on a GPU also a whole DeepSeek-V3 layer: 256 experts, 7.5 GB per w13 (too large for the
    # memory of a small CPU machine)
    full = bench_transform(dev, FULL_LAYER, max(args.repeat, 5)) if dev.type == "cuda" else None
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
            "torch": torch.__version__,
        },
        "device": str(dev),
        "end_to_end": e2e,
        "transform": tr,
        "transform_full_layer": full,
        "self_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench.json").write_text(json.dumps(result, indent=2))
    if e2e:
        _print_end_to_end(e2e, args, dev)
    for t in (tr, full):
        if t is not None:
            _print_transform(t, dev)
    print(f"\nwrote {Path(args.out) / 'bench.json'}")


if __name__ == "__main__":
    main()
