"""`make bench`, the CPU-runner measure: `fi-convert SRC OUT --scheme fp8-block && sync` as a
user runs it, against `cp -r SRC DST && sync` of the same folder, side by side in one run.

    python scripts/bench_cli_sync.py [--out DIR] [--experts 16,32] [--layers 8] [--repeat 3]
                                     [--device D] [--tmp DIR]

The checkpoints have DeepSeek-V3's shapes (hidden 7168, expert intermediate 2048, FP8 128x128
blocks, full attention), 8 MoE layers and one dense one, and 16 and 32 experts per layer
(8.0 and 13.6 GB; the synthetic writer makes one shard of about 2 GB at a time). Each is
read once before its runs (warm where it fits the page cache), and the runs alternate (cp,
fi-convert, cp, ...), each after a `sync` and with its output removed, so that a slow spell
of the disk falls on both. Reported: medians of wall time, and
of the CPU user and system seconds of each command with its children; the ratio; and where
an in-process conversion's CPU goes (bench.cpu_seconds, one run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def timed(cmd: str) -> tuple[float, float, float]:
    """Wall, user and system seconds of a shell command (its children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def measure(root: Path, experts: int, args) -> dict:
    from bench import cpu_seconds, ds_spec

    from fi_convert.names import DEFAULT_MAX_MEMORY
    from fi_convert.testing.synthetic import write_checkpoint

    # shards of about 2 GB: each is made in memory
    spec = ds_spec(args.layers, experts, shards=max(4, experts // 4))
    src = write_checkpoint(root / f"src-{experts}", spec)
    out, copy = root / "out", root / "cp"
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    # the CLI as `fi-convert` runs it (the entry point imports the same module)
    fi = f"PYTHONPATH={ROOT} {sys.executable} -m fi_convert {src} {out} --scheme fp8-block "
    fi += ("" if args.device == "auto" else f"--device {args.device} ") + "--quiet > /dev/null"
    cmds = {"cp_sync": f"cp -r {src} {copy} && sync", "convert_sync": f"{fi} && sync"}
    for p in src.glob("*.safetensors"):  # into the page cache, as far as it fits
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cmds}
    for _ in range(args.repeat):
        for k, cmd in cmds.items():
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(copy, ignore_errors=True)
            os.sync()
            runs[k].append(timed(cmd))
    shutil.rmtree(copy, ignore_errors=True)
    row: dict = {"experts": experts, "moe_layers": args.layers, "source_bytes": size}
    for k, v in runs.items():
        row[k] = {
            "wall_s": statistics.median(r[0] for r in v),
            "user_s": statistics.median(r[1] for r in v),
            "sys_s": statistics.median(r[2] for r in v),
            "runs_wall_s": [round(r[0], 2) for r in v],
        }
    row["ratio"] = row["convert_sync"]["wall_s"] / row["cp_sync"]["wall_s"]
    row["ratios_per_turn"] = [
        round(c[0] / p[0], 3) for c, p in zip(runs["convert_sync"], runs["cp_sync"], strict=True)
    ]
    opts = SimpleNamespace(max_memory=DEFAULT_MAX_MEMORY, device=args.device)
    row["cpu_s_by_activity"] = cpu_seconds(src, out, opts, 1)  # --no-fsync, in process
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(src)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--experts", default="16,32", help="experts per layer, one size each")
    ap.add_argument("--layers", type=int, default=8, help="MoE layers")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tmp", default=None, help="folder for the checkpoints (default: a temp dir)")
    ap.add_argument("--row", type=Path, help=argparse.SUPPRESS)  # one size, in a process of its own
    args = ap.parse_args()
    if args.row is not None:
        args.row.write_text(json.dumps(measure(args.row.parent, int(args.experts), args)))
        return
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    result = {"cpus": len(os.sched_getaffinity(0)), "memory_bytes": mem, "sizes": []}
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"fi-convert ... && sync vs cp -r ... && sync ({result['cpus']} CPUs, "
        f"{mem / 2**30:.0f} GiB; medians of {args.repeat}, wall s and CPU user + sys s):",
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="fi-convert-bench-sync-") as tmp:
        for e in (x for x in args.experts.split(",") if x):
            # each size in a fresh process: what making and converting the last one left in
            # this one's heap is not held while the next is made (16 GB on a 24 GiB machine)
            row_file = Path(tmp) / f"row-{e}.json"
            cmd = [sys.executable, __file__, "--row", str(row_file), "--experts", e]
            cmd += ["--layers", str(args.layers), "--repeat", str(args.repeat)]
            done = subprocess.run([*cmd, "--device", args.device])
            if done.returncode:  # out of disk or memory: the other sizes are still reported
                print(f"{e} experts: not measured (exit {done.returncode})", flush=True)
                continue
            row = json.loads(row_file.read_text())
            result["sizes"].append(row)
            # each size as it is measured: a run cut short still leaves the sizes it finished
            (args.out / "bench-cli-sync.json").write_text(json.dumps(result, indent=2) + "\n")
            c, f = row["cp_sync"], row["convert_sync"]
            print(
                f"  {row['source_bytes'] / 1e9:5.2f} GB  cp+sync {c['wall_s']:6.2f} "
                f"({c['user_s']:.1f} + {c['sys_s']:.1f})  convert+sync {f['wall_s']:6.2f} "
                f"({f['user_s']:.1f} + {f['sys_s']:.1f})  ratio {row['ratio']:.2f} "
                f"(turns {', '.join(f'{x:.2f}' for x in row['ratios_per_turn'])}; goal <= 1.5)"
            )
            cpu = row["cpu_s_by_activity"]
            by = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
            print(f"    CPU s by activity: {by}", flush=True)


if __name__ == "__main__":
    main()
