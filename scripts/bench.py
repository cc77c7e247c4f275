"""`make bench`: conversion vs a plain copy, peak memory, and the layout transform vs vLLM's
per-expert FlashInfer loop, each measured side by side in one run. Prints a table, writes JSON.

    python scripts/bench.py [--out DIR] [--experts N] [--layers L] [--repeat R] [--device D]

The checkpoint has DeepSeek-V3's expert shapes (hidden 7168, expert intermediate 2048, FP8
128x128 blocks) with fewer layers and experts. Times are medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
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

from fi_convert import Options, SchemeName, convert
from fi_convert import layout as L
from fi_convert.synthetic import Spec, write_checkpoint

H, INTER = 7168, 2048


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


def peak_rss(src: Path, out: Path, device: str, max_memory: int) -> float:
    """Peak resident memory (GiB) of a conversion in a fresh process: its VmHWM, which a new
    program starts afresh (ru_maxrss would carry over the forking parent's high-water mark)."""
    code = (
        "from fi_convert import convert, Options;"
        f"convert({str(src)!r}, {str(out)!r}, Options(max_memory={max_memory}), device={device!r},"
        " overwrite=True);"
        "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(r.stdout.strip().splitlines()[-1]) / 2**20


def bench_size(root: Path, label: str, experts: int, args) -> dict:
    spec = Spec(
        "deepseek-v3",
        layers=args.layers + 1,
        dense_layers=1,
        experts=experts,
        hidden=H,
        intermediate=INTER,
        shards=4,
        vocab=1024,
    )
    src = write_checkpoint(root / f"src-{label}", spec)
    out, cp_out = root / f"out-{label}", root / f"cp-{label}"

    def clean():
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(cp_out, ignore_errors=True)

    def cold():
        clean()
        drop_cache(src)

    def conv():
        opts = Options(SchemeName.FP8_BLOCK, max_memory=args.max_memory)
        convert(src, out, opts, device=args.device)

    def copy():
        subprocess.run(["cp", "-r", str(src), str(cp_out)], check=True)

    def copy_sync():  # fi-convert fsyncs its output before the manifest; cp does not
        copy()
        subprocess.run(["sync", "-f", str(cp_out)], check=True)

    conv()  # warm the page cache and the code
    row = {"source_bytes": sum(p.stat().st_size for p in src.glob("*.safetensors"))}
    row["convert_warm_s"] = median_time(conv, args.repeat, clean)
    row["cp_warm_s"] = median_time(copy, args.repeat, clean)
    row["cp_sync_warm_s"] = median_time(copy_sync, args.repeat, clean)
    row["convert_cold_s"] = median_time(conv, args.repeat, cold)
    row["cp_cold_s"] = median_time(copy, args.repeat, cold)
    row["ratio_warm"] = row["convert_warm_s"] / row["cp_warm_s"]
    row["ratio_warm_vs_cp_sync"] = row["convert_warm_s"] / row["cp_sync_warm_s"]
    row["ratio_cold"] = row["convert_cold_s"] / row["cp_cold_s"]
    row["peak_rss_gib"] = peak_rss(src, out, args.device, args.max_memory)
    clean()
    shutil.rmtree(src)
    return row


def bench_end_to_end(root: Path, args) -> dict:
    sizes = (("small", args.experts // 2), ("large", args.experts))
    return {label: bench_size(root, label, experts, args) for label, experts in sizes}


def bench_transform(device: torch.device, experts: int, repeat: int) -> dict:
    """One layer's w13 transform: ours (one gather) vs vLLM's per-expert FlashInfer loop."""
    from flashinfer import reorder_rows_for_gated_act_gemm, shuffle_matrix_a
    from flashinfer.fused_moe import convert_to_block_layout

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    res = {}
    w = torch.randint(0, 255, (experts, 2 * INTER, H), dtype=torch.uint8, device=device)
    out4 = torch.empty(experts, H // 128, 2 * INTER, 128, dtype=torch.uint8, device=device)
    flat = torch.empty_like(w)

    def timed(fn):
        fn()
        sync()
        return median_time(lambda: (fn(), sync()), repeat)

    # fp8-block TRT-LLM: swap + shuffle(64) + BlockMajorK 128
    idx = L.compose(L.swap_halves_index(2 * INTER), L.shuffle_row_index(2 * INTER, 64)).to(device)
    ours = timed(lambda: L.gather_rows_block_major(w, idx, 128, out4))

    def vllm_fp8():
        w31 = torch.cat([w[:, INTER:], w[:, :INTER]], dim=1)
        for e in range(experts):
            out4[e] = convert_to_block_layout(shuffle_matrix_a(w31[e], 64), 128)

    res["fp8-block"] = {"ours_s": ours, "flashinfer_loop_s": timed(vllm_fp8)}
    # bf16 TRT-LLM (same bytes viewed as bf16): interleave + shuffle(128) + BlockMajorK 64
    wb = w.view(torch.bfloat16)
    idx = L.compose(
        L.swap_halves_index(2 * INTER),
        L.gated_interleave_index(2 * INTER),
        L.shuffle_row_index(2 * INTER, 128),
    ).to(device)
    ob = torch.empty(experts, H // 2 // 64, 2 * INTER, 64, dtype=torch.bfloat16, device=device)
    ours = timed(lambda: L.gather_rows_block_major(wb, idx, 64, ob))

    def vllm_bf16():
        w31 = torch.cat([wb[:, INTER:], wb[:, :INTER]], dim=1)
        for e in range(experts):
            x = reorder_rows_for_gated_act_gemm(w31[e]).view(torch.uint8)
            ob[e] = convert_to_block_layout(shuffle_matrix_a(x, 128), 128).view(torch.bfloat16)

    res["bf16"] = {"ours_s": ours, "flashinfer_loop_s": timed(vllm_bf16)}
    # mxfp8 weights: interleave + shuffle(128), MajorK
    idx = L.compose(
        L.swap_halves_index(2 * INTER),
        L.gated_interleave_index(2 * INTER),
        L.shuffle_row_index(2 * INTER, 128),
    ).to(device)
    ours = timed(lambda: L.gather_rows(w, idx, flat))

    def vllm_mx():
        w31 = torch.cat([w[:, INTER:], w[:, :INTER]], dim=1)
        for e in range(experts):
            flat[e] = shuffle_matrix_a(reorder_rows_for_gated_act_gemm(w31[e]), 128)

    res["mxfp8"] = {"ours_s": ours, "flashinfer_loop_s": timed(vllm_mx)}
    copy = timed(lambda: flat.copy_(w))
    for r in res.values():
        r["copy_s"] = copy
        r["speedup_vs_flashinfer"] = r["flashinfer_loop_s"] / r["ours_s"]
        r["ours_vs_copy"] = r["ours_s"] / copy
    res["bytes"] = w.numel()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-memory", type=int, default=2**30, help="conversion budget, bytes")
    ap.add_argument("--tmp", default=None, help="folder for checkpoints (default: a temp dir)")
    args = ap.parse_args()
    dev = torch.device(
        "cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    )
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        e2e = bench_end_to_end(Path(tmp), args)
    tr = bench_transform(dev, args.experts, max(args.repeat, 5))
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
        "self_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench.json").write_text(json.dumps(result, indent=2))
    print(f"device {dev}, {os.cpu_count()} CPUs; medians of {args.repeat} runs")
    cols = ("model", "GB", "conv", "cp", "ratio", "cp+sync", "ratio", "conv cold", "cp cold")
    print(" ".join(f"{c:>9}" for c in (*cols, "ratio", "peak GiB")))
    for k, r in e2e.items():
        vals = (
            r["source_bytes"] / 1e9,
            r["convert_warm_s"],
            r["cp_warm_s"],
            r["ratio_warm"],
            r["cp_sync_warm_s"],
            r["ratio_warm_vs_cp_sync"],
            r["convert_cold_s"],
            r["cp_cold_s"],
            r["ratio_cold"],
            r["peak_rss_gib"],
        )
        print(f"{k:>9} " + " ".join(f"{v:9.2f}" for v in vals))
    print(
        f"\nlayout transform of one w13 ({tr['bytes'] / 1e9:.2f} GB, {args.experts} experts) "
        f"on {dev}"
    )
    print(
        f"{'scheme':10} {'ours ms':>9} {'FI loop ms':>11} {'speedup':>8} {'copy ms':>8} "
        f"{'ours/copy':>10}"
    )
    for k in ("fp8-block", "bf16", "mxfp8"):
        r = tr[k]
        print(
            f"{k:10} {r['ours_s'] * 1e3:9.1f} {r['flashinfer_loop_s'] * 1e3:11.1f} "
            f"{r['speedup_vs_flashinfer']:8.1f} {r['copy_s'] * 1e3:8.1f} "
            f"{r['ours_vs_copy']:10.2f}"
        )
    print(f"\nwrote {Path(args.out) / 'bench.json'}")


if __name__ == "__main__":
    main()
