"""The load-time proof's cost per distinct layer shape, on this machine:

    python scripts/bench_release_proof.py [--server vllm] [--hidden 7168] [--intermediate 2048]
        [--tp-size 1] [--backend trtllm] [SCHEME ...]

For each scheme (default: fp8-block, nvfp4, bf16; TRT-LLM), an output of one MoE layer at those
sizes (DeepSeek-V3's by default) is made first (not timed), then the installed server proven on
it for rank 0 without the cache (`prove_installed`), after the server is imported (timed apart).
Prints one line per scheme: the proof's seconds, its CPU time (this process's: the measure
that a busy machine moves least), and the machine's load average beside them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time
from pathlib import Path

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.format import manifest as mf
from fi_convert.testing.synthetic import Spec, write_checkpoint

SOURCE = {
    "bf16": ("qwen3-moe", "bf16"),
    "fp8-block": ("deepseek-v3", "fp8-block"),
    "fp8-tensor": ("qwen3-moe", "fp8-tensor"),
    "mxfp8": ("qwen3-moe", "mxfp8"),
    "nvfp4": ("deepseek-v3", "nvfp4"),
    "mxfp4": ("gpt-oss", "mxfp4"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*", default=["fp8-block", "nvfp4", "bf16"])
    ap.add_argument("--server", default="vllm", choices=("vllm", "sglang"))
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--backend", default="trtllm", choices=[b.value for b in Backend])
    args = ap.parse_args()
    proof = importlib.import_module(f"fi_convert.servers.{args.server}.proof")
    t0 = time.perf_counter()
    if args.server == "vllm":
        importlib.import_module("fi_convert.servers.vllm.moe_layer")
    else:
        proof.OWN_PROCESS = False  # time the proof, not a process start and SGLang's import
        ml = importlib.import_module("fi_convert.servers.sglang.moe_layer")
        with ml.sglang_context("trtllm", 1, 0):  # SGLang imported, its one-process world set up
            pass
    print(f"{args.server} imported in {time.perf_counter() - t0:.1f} s", flush=True)
    for scheme in args.schemes:
        family, quant = SOURCE[scheme]
        with tempfile.TemporaryDirectory(prefix="fi-convert-bench-") as tmp:
            spec = Spec(
                family,
                layers=1,
                dense_layers=0,
                experts=2,
                hidden=args.hidden,
                intermediate=args.intermediate,
                shards=1,
                quant=quant,
                moe_only=True,
            )
            src = write_checkpoint(Path(tmp) / "src", spec)
            opts = Options(
                SchemeName(scheme), Backend(args.backend), args.tp_size, server=args.server
            )
            convert(src, Path(tmp) / "out", opts, device="cpu", fsync=False)
            m = mf.read(Path(tmp) / "out")
            t, cpu = time.perf_counter(), time.process_time()
            got = proof.prove_installed(m, ranks=[0], cache=False)
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        row = got.rows[0]
        load = os.getloadavg()[0]
        print(
            f"{row.shape}: {row.result}, {row.tensors} tensors, {wall:.2f} s "
            f"({cpu:.2f} s of CPU time; {got.device}, {os.cpu_count()} CPUs, load average "
            f"{load:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
