"""`make bench`, serving half: per MoE layer, vLLM 0.33's own load-time processing against the
fi-convert plugin's load, side by side in one run, on vLLM's real FusedMoE layer (built as
tests/vllm_moe.py builds it: FlashInfer backend forced, device checks patched).

    python scripts/bench_vllm_load.py [--out DIR] [--experts N] [--repeat R]

DeepSeek-V3 expert shapes (hidden 7168, expert intermediate 2048) with N experts: fp8-block,
bf16 and fp8-tensor (ModelOpt FP8; TRT-LLM layouts) everywhere, nvfp4 and mxfp8 on CUDA only
(vLLM's processing calls CUDA-only FlashInfer ops). For each: the time of vLLM's
`process_weights_after_loading` for the layer (the preprocessing the plugin removes), the
plugin's kernel setup (its only processing), the plugin's read of the rank's bytes into the
parameters, and on CUDA the peak GPU memory each needs beyond what the layer holds before (as
a share of the layer's bytes). Medians of R runs, the two paths alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert import Backend, Options, SchemeName, convert  # noqa: E402
from fi_convert.loader import OutputReader  # noqa: E402
from fi_convert.synthetic import Spec, write_checkpoint  # noqa: E402
from fi_convert.vllm_plugin import experts as plugin  # noqa: E402
from tests import vllm_moe as vm  # noqa: E402

H, INTER = 7168, 2048
PREFIX = "model.layers.1.mlp.experts"


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


class Peak:
    """Peak device memory beyond what was allocated at the start (CUDA only)."""

    def __init__(self, dev: str) -> None:
        self.dev, self.extra = dev, 0

    def __enter__(self) -> Peak:
        _sync(self.dev)
        if self.dev == "cuda":
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: object) -> None:
        _sync(self.dev)
        if self.dev == "cuda":
            self.extra = max(0, torch.cuda.max_memory_allocated() - self.base)


def _layer_bytes(layer: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters(recurse=False))


def vllm_path(src: Path, dev: str) -> dict:
    with vm.vllm_context("trtllm", 1, 0, device=dev):
        layer = vm.make_layer(PREFIX, src, 1)
        list(layer.load_weights(vm.source_tensors(src, PREFIX)))
        with Peak(dev) as peak:
            t0 = time.perf_counter()
            vm.process(layer)
            _sync(dev)
            t = time.perf_counter() - t0
    return {"process_s": t, "extra_bytes": peak.extra, "layer_bytes": _layer_bytes(layer)}


def plugin_path(src: Path, out: Path, dev: str) -> dict:
    with vm.vllm_context("trtllm", 1, 0, device=dev):
        layer = vm.make_layer(PREFIX, src, 1)
        with OutputReader(out) as reader, Peak(dev) as peak:
            t0 = time.perf_counter()
            plugin.install(layer, reader, PREFIX, 0)
            _sync(dev)
            t1 = time.perf_counter()
            plugin.finish(layer, reader.layer(PREFIX))
            _sync(dev)
            t2 = time.perf_counter()
    return {
        "read_s": t1 - t0,
        "setup_s": t2 - t1,
        "extra_bytes": peak.extra,
        "layer_bytes": _layer_bytes(layer),
    }


def bench(scheme: str, quant: str, experts: int, repeat: int, dev: str, tmp: Path) -> dict:
    spec = Spec("deepseek-v3", layers=2, experts=experts, hidden=H, intermediate=INTER, quant=quant)
    src = write_checkpoint(tmp / f"{scheme}-src", spec)
    out = tmp / f"{scheme}-out"
    convert(src, out, Options(SchemeName(scheme), Backend.TRTLLM, 1), device="cpu")
    runs: dict[str, list[dict]] = {"vllm": [], "plugin": []}
    for _ in range(repeat):
        runs["vllm"].append(vllm_path(src, dev))
        runs["plugin"].append(plugin_path(src, out, dev))
        if dev == "cuda":
            torch.cuda.empty_cache()

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    layer = runs["vllm"][0]["layer_bytes"]
    return {
        "scheme": scheme,
        "experts": experts,
        "layer_bytes": layer,
        "vllm_process_s": med("vllm", "process_s"),
        "plugin_setup_s": med("plugin", "setup_s"),
        "plugin_read_s": med("plugin", "read_s"),
        "vllm_extra_bytes": max(r["extra_bytes"] for r in runs["vllm"]),
        "plugin_extra_bytes": max(r["extra_bytes"] for r in runs["plugin"]),
        "runs": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--experts", type=int, default=0, help="default: 16 on CPU, 64 on CUDA")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    experts = a.experts or (64 if dev == "cuda" else 16)
    cases = [("fp8-block", "fp8-block"), ("bf16", "bf16"), ("fp8-tensor", "fp8-tensor")]
    if dev == "cuda":  # their processing calls CUDA-only FlashInfer swizzles
        cases += [("nvfp4", "nvfp4"), ("mxfp8", "mxfp8")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for scheme, quant in cases:
            results.append(bench(scheme, quant, experts, a.repeat, dev, Path(tmp)))
    print(
        f"\nvLLM 0.33 processing vs the fi-convert plugin, one MoE layer, {experts} experts "
        f"of DeepSeek-V3 shapes, on {dev} (medians of {a.repeat}):"
    )
    cols = ["scheme", "layer", "vLLM processing", "plugin setup", "plugin read"]
    print("| " + " | ".join([*cols, "extra memory vLLM / plugin"]) + " |\n" + "|---" * 6 + "|")
    for r in results:
        gib = r["layer_bytes"] / 2**30
        mem = (
            f"{r['vllm_extra_bytes'] / r['layer_bytes']:.1%} / "
            f"{r['plugin_extra_bytes'] / r['layer_bytes']:.2%}"
            if dev == "cuda"
            else "(CUDA only)"
        )
        print(
            f"| {r['scheme']} | {gib:.2f} GiB | {r['vllm_process_s'] * 1e3:.1f} ms | "
            f"{r['plugin_setup_s'] * 1e3:.2f} ms | {r['plugin_read_s'] * 1e3:.1f} ms | {mem} |"
        )
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"vllm-load-{dev}.json"
    path.write_text(json.dumps({"device": dev, "results": results}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
