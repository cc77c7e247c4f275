"""`make bench`, serving half for SGLang: a MoE layer loaded into SGLang 0.5.23's own FusedMoE
layer three ways, side by side in one run.

    python scripts/bench_sglang_load.py [--out DIR] [--repeat R] [--experts N]

- SGLang's default path: SGLang's own `safetensors_weights_iterator`
  (model_loader/weight_utils.py) over the source's shards, the layer's tensors through its
  expert weight loader as SGLang's model classes call it (`FusedMoE.make_expert_params_mapping`),
  then the quant method's `process_weights_after_loading`;
- the fi-convert SGLang plugin: the bulk read of the output's bytes into the layer's
  parameters, then its kernel setup (`servers.sglang.experts.install` with one BulkRead,
  `finish`);
- the limit: the same bytes of the same files by a plain parallel copy (as in
  bench_vllm_load.py, whose pieces this reuses), into host memory never touched before, as the
  layer's parameters are (on this CPU path the pages' first touch costs more than the copy:
  0.26 s against 0.04 s for 600 MB on the 2-core VM).

SGLang runs here on CPU only (tests/sglang_moe.py: its own layers with stand-ins for triton
and IPython; its GPU stack does not travel to the GPU machine), so this measures on CPU, warm
page cache (cold where the page cache can be dropped): BF16 Qwen3-MoE shapes on FlashInfer
TRT-LLM and CUTLASS, TP 1. Medians of R runs, the three paths alternating. Writes
sglang-load-cpu.json and a chart (scripts/bench_chart.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert import Backend, Options, SchemeName, convert  # noqa: E402
from fi_convert.format.reader import OutputReader  # noqa: E402
from fi_convert.testing.synthetic import Spec, write_checkpoint  # noqa: E402
from scripts.bench_limit import limit_path  # noqa: E402
from scripts.bench_vllm_load import (  # noqa: E402
    _ranges,
    best_limit,
    drop_caches,
    summary,
)
from tests import sglang_moe as sm  # noqa: E402

PREFIX = "model.layers.0.mlp.experts"


def _shards(ckpt: Path) -> list[str]:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    return sorted({str(ckpt / s) for s in index.values()})


def sglang_path(src: Path, backend: str) -> dict:
    """SGLang's default load of the source's layer, then its processing."""
    cfg = json.loads((src / "config.json").read_text())
    experts = cfg.get("num_experts") or cfg["num_local_experts"]
    with sm.sglang_context(backend, 1, 0):  # (SGLang imports only inside: its stand-ins)
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
        from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

        mapping = FusedMoE.make_expert_params_mapping(
            ckpt_gate_proj_name="gate_proj",
            ckpt_down_proj_name="down_proj",
            ckpt_up_proj_name="up_proj",
            num_experts=experts,
        )
        layer = sm.make_layer(PREFIX, src)
        params = dict(layer.named_parameters())
        # the time of the layer's tensors alone (from the iterator's step to their loading),
        # as bench_vllm_load counts vLLM's
        read, t0 = 0.0, time.perf_counter()
        for name, tensor in safetensors_weights_iterator(_shards(src)):
            if name.startswith(PREFIX + "."):
                full = "experts." + name[len(PREFIX) + 1 :]
                for param_name, weight_name, expert_id, shard_id in mapping:
                    if weight_name in full:
                        mapped = full.replace(weight_name, param_name)
                        param = params[mapped[len("experts.") :]]
                        param.weight_loader(
                            param, tensor, mapped, shard_id=shard_id, expert_id=expert_id
                        )
                        break
                read += time.perf_counter() - t0
            t0 = time.perf_counter()
        t1 = time.perf_counter()
        sm.process(layer)
        t2 = time.perf_counter()
    return {"read_s": read, "process_s": t2 - t1, "extra_bytes": 0}


def plugin_path(out: Path, src: Path, backend: str) -> dict:
    from fi_convert.servers.sglang import experts

    with sm.sglang_context(backend, 1, 0):
        layer = sm.make_layer(PREFIX, src)
        with OutputReader(out) as reader:
            t0 = time.perf_counter()
            bulk = reader.bulk("cpu")
            experts.install(layer, reader, PREFIX, 0, bulk)
            stats = bulk.run()
            t1 = time.perf_counter()
            experts.finish(layer)
            t2 = time.perf_counter()
    return {
        "read_s": t1 - t0,
        "setup_s": t2 - t1,
        "extra_bytes": 0,
        "pinned_peak": stats.pinned_peak,
        "threads": stats.threads,
        "chunk": stats.chunk,
        "bytes": stats.bytes,
    }


def make_case(tmp: Path, experts: int, backend: str) -> tuple[Path, Path]:
    spec = Spec("qwen3-moe", layers=1, experts=experts, hidden=2048, intermediate=768, shards=2)
    src = tmp / f"src-{experts}"
    if not src.exists():
        write_checkpoint(src, spec)
    out = tmp / f"out-{experts}-{backend}"
    convert(src, out, _options(backend), device="cpu")
    return src, out


def _options(backend: str) -> Options:
    """An SGLang output of the source (`--server sglang`)."""
    return Options(SchemeName.BF16, Backend(backend), 1, server="sglang")


def measure(src: Path, out: Path, backend: str, limit: tuple, cold: bool, r: int) -> dict:
    spans = _ranges(out, [PREFIX], False)
    runs: dict[str, list[dict]] = {"sglang": [], "plugin": [], "limit": []}
    order = list(runs)
    for k in range(r):
        for side in order[k % 3 :] + order[: k % 3]:
            if cold:
                drop_caches()
            if side == "sglang":
                runs[side].append(sglang_path(src, backend))
            elif side == "plugin":
                runs[side].append(plugin_path(out, src, backend))
            else:
                runs[side].append(limit_path(spans, "cpu", *limit, fresh=True))
    return summary(runs, "sglang", "default", cold) | {
        "runs": {"default": runs["sglang"], "plugin": runs["plugin"], "limit": runs["limit"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--tmp", default=None, help="where checkpoints are written")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    can_drop = drop_caches()
    results: list[dict] = []
    report = {
        "device": "cpu",
        "server": "SGLang 0.5.23",
        "cold": can_drop,
        "cpus": os.cpu_count(),
        "results": results,
    }
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / "sglang-load-cpu.json"
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        limit = None
        for backend in ("trtllm", "cutlass"):
            src, out = make_case(Path(tmp), a.experts, backend)
            if limit is None:
                *limit, tried = best_limit(_ranges(out, [PREFIX], False), "cpu")
                report["limit_sweep"] = tried
            for cold in (False, True) if can_drop else (False,):
                r = measure(src, out, backend, tuple(limit), cold, a.repeat)
                r["case"] = f"bf16 x{a.experts} {backend}"
                results.append(r)
                print(_row(r), flush=True)
                path.write_text(json.dumps(report, indent=2))
    if not can_drop:
        print("cold: not measured (the page cache cannot be dropped here)")
    print(f"wrote {path}")
    try:
        from scripts.bench_chart import chart
    except ImportError:  # matplotlib missing: the numbers stand alone
        return
    print(f"wrote {chart(path)}")


def _row(r: dict) -> str:
    g = r["gbps"]
    return (
        f"| {r['case']} | {r['cache']} | {r['bytes'] / 1e9:.2f} GB | "
        f"{r['default_read_s'] * 1e3:.0f} + {r['default_process_s'] * 1e3:.0f} ms "
        f"({g['sglang']:.1f} GB/s) | "
        f"{r['plugin_read_s'] * 1e3:.0f} + {r['plugin_setup_s'] * 1e3:.0f} ms "
        f"({g['plugin']:.1f} GB/s) | {r['limit_s'] * 1e3:.0f} ms ({g['limit']:.1f} GB/s) | "
        f"**{r['default_over_plugin']:.2f}** | {r['plugin_over_limit']:.2f} |"
    )


if __name__ == "__main__":
    main()
