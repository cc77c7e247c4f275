"""`make bench`, serving half: a MoE layer (and a whole small model) loaded into vLLM 0.33's own
FusedMoE layer three ways, side by side in one run.

    python scripts/bench_vllm_load.py [--out DIR] [--repeat R] [--quick]

- vLLM's default path: vLLM's own `safetensors_weights_iterator` (model_loader/weight_utils.py)
  over the source's shards, the layer's tensors into its `load_weights` (gpt-oss: the model's
  own MXFP4 loader), then `process_weights_after_loading`;
- the fi-convert plugin: the bulk read of the output's bytes into the layer's parameters, then
  its kernel setup (`experts.install` with one BulkRead, `experts.finish`);
- the limit: the same bytes of the same files, read by parallel `preadv`s into preallocated
  pinned buffers and copied to one preallocated device buffer on each thread's own stream
  (threads x chunk size swept on the first case; the fastest is used for every case).

Each with the page cache warm, and cold (`/proc/sys/vm/drop_caches` before each run, where the
machine allows it: the report says when it does not). On CUDA: every scheme on its own backend
(DeepSeek-V3 shapes, 64 experts; fp8-block with 256 too, a whole DeepSeek-V3 layer; gpt-oss-120b
shapes for mxfp4) and a whole small model (3 layers, non-expert tensors too). On CPU (no GPU
here): fp8-block, bf16 and fp8-tensor at 16 experts, warm only; the limit reads into host memory.
Medians of R runs, the three paths alternating. Writes vllm-load-<device>.json and a chart
(scripts/bench_chart.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert import Backend, Options, SchemeName, convert, dtypes  # noqa: E402
from fi_convert.bulk_read import host_buffers  # noqa: E402
from fi_convert.format.reader import OutputReader  # noqa: E402
from fi_convert.servers.vllm import experts as plugin  # noqa: E402
from fi_convert.testing.synthetic import Spec, write_checkpoint  # noqa: E402
from tests import vllm_moe as vm  # noqa: E402

H, INTER = 7168, 2048
MiB = 1 << 20
SWEEP = [(t, c * MiB) for t in (4, 8, 16, 24) for c in (4, 8, 16, 64) if t * 2 * c <= 2048]


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def drop_caches() -> bool:
    """Empty the page cache (root on Linux); False where the machine does not allow it."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


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


def _shards(ckpt: Path) -> list[str]:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    return sorted({str(ckpt / s) for s in index.values()})


# -- vLLM's default path -----------------------------------------------------------------------


def _vllm_read(layers: dict[str, torch.nn.Module], src: Path, dense: dict | None) -> float:
    """vLLM's iterator over the source's shards: each MoE layer's tensors into its
    load_weights; with `dense`, every other tensor copied into its device tensor (as the
    model's default weight loader does); else the time of the layers' tensors alone."""
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    it = safetensors_weights_iterator(_shards(src), use_tqdm_on_load=False)
    spent, t0 = 0.0, time.perf_counter()
    for name, tensor in it:
        prefix = next((p for p in layers if name.startswith(p + ".")), None)
        if prefix is not None:
            rel = name[len(prefix) + 1 :]
            e, proj, param = rel.split(".", 2)
            rel = f"{e}.{vm.MIXTRAL_NAMES.get(proj, proj)}.{param}"
            list(layers[prefix].load_weights([(rel, tensor)]))  # a generator
            spent += time.perf_counter() - t0
        elif dense is not None:
            dense[name].copy_(tensor)
            spent += time.perf_counter() - t0
        t0 = time.perf_counter()
    return spent


def vllm_path(src: Path, prefixes: list[str], dev: str, dense: dict | None = None) -> dict:
    oss = json.loads((src / "config.json").read_text()).get("model_type") == "gpt_oss"
    with vm.vllm_context("trtllm", 1, 0, device=dev):
        layers = {p: vm.make_layer(p, src, 1) for p in prefixes}
        with Peak(dev) as peak:
            t0 = time.perf_counter()
            if oss:  # the model's own MXFP4 loader reads the layer's tensors
                for p, layer in layers.items():
                    vm.load_gpt_oss(layer, src, p)
                read = time.perf_counter() - t0
            else:
                read = _vllm_read(layers, src, dense)
            _sync(dev)
            t1 = time.perf_counter()
            for layer in layers.values():
                vm.process(layer)
            _sync(dev)
            t2 = time.perf_counter()
    nbytes = sum(_layer_bytes(layer) for layer in layers.values())
    return {"read_s": read, "process_s": t2 - t1, "extra_bytes": peak.extra, "layer_bytes": nbytes}


# -- the plugin ----------------------------------------------------------------------------


def plugin_path(src: Path, out: Path, prefixes: list[str], dev: str) -> dict:
    """As the plugin in a server: its pinned buffers allocated in the background while the
    layers are built (a real model takes far longer to build than one layer), then the read."""
    ahead = host_buffers().allocate(background=True) if dev == "cuda" else None
    with vm.vllm_context("trtllm", 1, 0, device=dev):
        layers = {p: vm.make_layer(p, src, 1) for p in prefixes}
        with OutputReader(out) as reader, Peak(dev) as peak:
            t0 = time.perf_counter()
            bulk = reader.bulk(dev, buffers=ahead)
            for p, layer in layers.items():
                plugin.install(layer, reader, p, 0, bulk)
            stats = bulk.run()
            _sync(dev)
            t1 = time.perf_counter()
            for p, layer in layers.items():
                plugin.finish(layer, reader.layer(p))
            _sync(dev)
            t2 = time.perf_counter()
    if ahead is not None:
        ahead.free()
    return {
        "alloc_s": stats.alloc_s,
        "read_s": t1 - t0,
        "setup_s": t2 - t1,
        "extra_bytes": peak.extra,
        "pinned_peak": stats.pinned_peak,
        "threads": stats.threads,
        "chunk": stats.chunk,
        "bytes": stats.bytes,
    }


def plugin_model_path(src: Path, out: Path, prefixes: list[str], dev: str, dense: dict) -> dict:
    """The plugin's whole load (FiConvertModelLoader.load_weights: every MoE layer in one bulk
    read beside the non-expert tensors, which go through the model's load_weights), then vLLM's
    post-load driver, which runs only the kernel setup for the MoE layers."""
    from vllm.config.load import LoadConfig

    from fi_convert.servers.vllm.loader import FiConvertModelLoader

    class Model(torch.nn.Module):
        def load_weights(self, weights):
            for name, t in weights:
                dense[name].copy_(t)
            return set()

    with vm.vllm_context("trtllm", 1, 0, device=dev):
        model = Model()
        for i, p in enumerate(prefixes):
            model.add_module(f"moe{i}", vm.make_layer(p, src, 1))
        cfg = types.SimpleNamespace(model=str(out), revision=None, quantization="fp8")
        loader = FiConvertModelLoader(LoadConfig(load_format="fi-convert"))
        if dev == "cuda":  # as its load_model does, before vLLM builds the model
            loader._buffers = host_buffers().allocate(background=True)
        with Peak(dev) as peak:
            t0 = time.perf_counter()
            loader.load_weights(model, cfg)
            _sync(dev)
            t1 = time.perf_counter()
            for layer in model.children():
                vm.process(layer)
            _sync(dev)
            t2 = time.perf_counter()
    if loader._buffers is not None:
        loader._buffers.free()
    return {"read_s": t1 - t0, "setup_s": t2 - t1, "extra_bytes": peak.extra}


# -- the limit -----------------------------------------------------------------------------


def _ranges(out: Path, prefixes: list[str], dense: bool) -> list[tuple[str, int, int]]:
    """The (file, offset, size) byte ranges the plugin reads (with `dense`, every tensor)."""
    from fi_convert.st_io import read_header

    spans = []
    with OutputReader(out) as r:
        for shard in r.shards():
            for name, info in read_header(out / shard)[0].items():
                prefix, _, _ = name.rpartition(".")
                if prefix in prefixes or dense:
                    spans.append((str(out / shard), info.start, info.nbytes))
    return spans


def limit_path(spans: list, dev: str, threads: int, chunk: int, fresh: bool = False) -> dict:
    """Plain parallel reads of `spans` into preallocated pinned buffers, copied to one
    preallocated device buffer on each thread's own stream (into host memory on CPU). With
    `fresh` (host memory), into pages never touched, as a layer's new parameters are: their
    first touch is part of the time."""
    total = sum(s for *_, s in spans)
    dst = (torch.empty if fresh else torch.zeros)(total, dtype=torch.uint8, device=dev)
    jobs, pos = [], 0
    for path, off, size in spans:
        for at in range(0, size, chunk):
            n = min(chunk, size - at)
            jobs.append((path, off + at, n, pos + at))
        pos += size
    fds = {p: os.open(p, os.O_RDONLY) for p in {s[0] for s in spans}}
    cuda = dev == "cuda"
    bufs = [
        [torch.empty(chunk, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
        for _ in range(threads)
    ]
    streams = [torch.cuda.Stream() if cuda else None for _ in range(threads)]
    nxt, lock = iter(jobs), threading.Lock()

    def work(k: int) -> None:
        events: list = [None, None]
        i = 0
        while True:
            with lock:
                job = next(nxt, None)
            if job is None:
                break
            path, off, n, at = job
            b = i % 2
            i += 1
            if events[b] is not None:
                events[b].synchronize()
            if not cuda:
                os.preadv(fds[path], [memoryview(dst[at : at + n].numpy())], off)
                continue
            buf = bufs[k][b][:n]
            os.preadv(fds[path], [memoryview(buf.numpy())], off)
            with torch.cuda.stream(streams[k]):
                dst[at : at + n].copy_(buf, non_blocking=True)
                events[b] = torch.cuda.Event()
                events[b].record()
        if cuda:
            streams[k].synchronize()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    _sync(dev)
    seconds = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return {"read_s": seconds, "bytes": total, "threads": threads, "chunk": chunk}


def best_limit(spans: list, dev: str) -> tuple[int, int, list[dict]]:
    """The threads x chunk of the fastest plain copy (warm), each tried twice."""
    tried = []
    for threads, chunk in SWEEP:
        if threads > 2 * (os.cpu_count() or 1):
            continue
        s = min(limit_path(spans, dev, threads, chunk)["read_s"] for _ in range(2))
        tried.append({"threads": threads, "chunk": chunk, "read_s": s})
    best = min(tried, key=lambda r: r["read_s"])
    return best["threads"], best["chunk"], tried


def plugin_sweep(src: Path, out: Path, prefixes: list[str], dev: str, cold: bool) -> list:
    """The plugin's read at several thread counts and host-memory budgets (warm), and cold
    with and without its read-ahead advice."""
    from fi_convert import bulk_read

    tried = []
    for threads in (8, 16, 24, 32):
        for budget in ("128MiB", "256MiB", "512MiB", "1GiB"):
            env = {bulk_read.THREADS_ENV: str(threads), bulk_read.HOST_MEMORY_ENV: budget}
            with _env(env):
                s = min(plugin_path(src, out, prefixes, dev)["read_s"] for _ in range(2))
            tried.append({"threads": threads, "host_memory": budget, "read_s": s})
            print(f"plugin sweep: {threads} threads, {budget}: {s * 1e3:.0f} ms", flush=True)
    for advise in ("1", "0") if cold else ():
        for _ in range(2):
            drop_caches()
            with _env({bulk_read.ADVISE_ENV: advise}):
                s = plugin_path(src, out, prefixes, dev)["read_s"]
            tried.append({"cold": True, "advise": advise, "read_s": s})
            print(f"plugin sweep: cold, advise={advise}: {s * 1e3:.0f} ms", flush=True)
    return tried


@contextlib.contextmanager
def _env(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- one case ------------------------------------------------------------------------------


def make_case(name: str, quant: str, spec: Spec, tmp: Path, dev: str) -> tuple[Path, Path]:
    src = write_checkpoint(tmp / f"{name}-src", spec)
    out = tmp / f"{name}-out"
    convert(src, out, Options(SchemeName(quant), Backend.TRTLLM, 1), device=dev)
    return src, out


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def measure(case: dict, src: Path, out: Path, dev: str, limit: tuple, cold: bool, r: int) -> dict:
    prefixes = case["prefixes"]
    spans = _ranges(out, prefixes, case.get("model", False))
    dense = None
    if case.get("model"):  # the non-expert tensors' device tensors, as the model holds them
        with OutputReader(out) as rd:
            from safetensors import safe_open

            dense = {}
            for shard in rd.shards():
                with safe_open(out / shard, framework="pt") as f:
                    for n in f.keys():  # noqa: SIM118
                        if not rd.is_expert_tensor(n):
                            sl = f.get_slice(n)
                            dtype = dtypes.to_torch(sl.get_dtype())
                            dense[n] = torch.empty(sl.get_shape(), dtype=dtype, device=dev)
    runs: dict[str, list[dict]] = {"vllm": [], "plugin": [], "limit": []}
    order = ["vllm", "plugin", "limit"]
    for k in range(r):
        for side in order[k % 3 :] + order[: k % 3]:  # each goes first once in three
            if cold:
                drop_caches()
            if side == "vllm":
                runs[side].append(vllm_path(src, prefixes, dev, dense))
            elif side == "plugin" and dense is not None:
                runs[side].append(plugin_model_path(src, out, prefixes, dev, dense))
            elif side == "plugin":
                runs[side].append(plugin_path(src, out, prefixes, dev))
            else:
                runs[side].append(limit_path(spans, dev, *limit))
            if dev == "cuda":
                torch.cuda.empty_cache()
    return summary(runs, "vllm", "vllm", cold) | {
        "extra_gpu": {
            "vllm": max(r["extra_bytes"] for r in runs["vllm"]),
            "plugin": max(r["extra_bytes"] for r in runs["plugin"]),
        },
        "pinned_peak": max(r.get("pinned_peak", 0) for r in runs["plugin"]),
        "plugin_alloc_s": med(runs["plugin"], "alloc_s")
        if "alloc_s" in runs["plugin"][0]
        else None,
        "runs": runs,
    }


def summary(runs: dict[str, list[dict]], side: str, key: str, cold: bool) -> dict:
    """One case's medians: the server's default path (`runs[side]`, reported as `key`) against
    the plugin against the limit, their ratios and GB/s (bench_sglang_load.py shares it)."""
    d = med(runs[side], "read_s") + med(runs[side], "process_s")
    p = med(runs["plugin"], "read_s") + med(runs["plugin"], "setup_s")
    lim = med(runs["limit"], "read_s")
    nbytes = runs["limit"][0]["bytes"]
    return {
        "cache": "cold" if cold else "warm",
        "bytes": nbytes,
        f"{key}_read_s": med(runs[side], "read_s"),
        f"{key}_process_s": med(runs[side], "process_s"),
        "plugin_read_s": med(runs["plugin"], "read_s"),
        "plugin_setup_s": med(runs["plugin"], "setup_s"),
        "limit_s": lim,
        f"{key}_s": d,
        "plugin_s": p,
        f"{key}_over_plugin": d / p,
        "plugin_over_limit": p / lim,
        "gbps": {k: nbytes / t / 1e9 for k, t in ((side, d), ("plugin", p), ("limit", lim))},
    }


def cases(dev: str, quick: bool, which: str) -> list[dict]:
    ds = "model.layers.{}.mlp.experts"

    def one(name, quant, experts, family="deepseek-v3", **kw):
        h, i = (2880, 2880) if family == "gpt-oss" else (H, INTER)
        spec = Spec(family, layers=2, experts=experts, hidden=h, intermediate=i, quant=quant, **kw)
        return {
            "name": name,
            "scheme": quant,
            "experts": experts,
            "spec": spec,
            "prefixes": [ds.format(1 if family == "deepseek-v3" else 0)],
        }

    if dev != "cuda":
        return [one(f"{q} x16", q, 16) for q in ("fp8-block", "bf16", "fp8-tensor")]
    out = [one(f"{q} x64", q, 64) for q in ("fp8-block", "bf16", "fp8-tensor", "nvfp4", "mxfp8")]
    out.append(one("mxfp4 x128 (gpt-oss)", "mxfp4", 128, family="gpt-oss"))
    if quick:
        return out[:2]
    if which == "layers":
        return out
    big = [] if which == "model" else [one("fp8-block x256", "fp8-block", 256)]
    model = Spec(
        "deepseek-v3",
        layers=4,
        dense_layers=1,
        experts=64,
        hidden=H,
        intermediate=INTER,
        quant="fp8-block",
        vocab=32768,
    )
    big.append(
        {
            "name": "whole model (3 MoE layers)",
            "scheme": "fp8-block",
            "experts": 64,
            "spec": model,
            "prefixes": [ds.format(k) for k in (1, 2, 3)],
            "model": True,
        }
    )
    return big if which in ("big", "model") else out + big


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two cases, warm only")
    ap.add_argument("--tmp", default=None, help="where checkpoints are written")
    ap.add_argument(
        "--cases",
        choices=["all", "layers", "big", "model"],
        default="all",
        help="layers: one layer per scheme; big: 256 experts and the whole model (CUDA); "
        "model: the whole model alone",
    )
    ap.add_argument("--only", default=None, help="only the cases whose name starts with this")
    ap.add_argument(
        "--sweep", action="store_true", help="also the plugin's threads x host memory, on case 1"
    )
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    can_drop = dev == "cuda" and drop_caches()
    results: list[dict] = []
    report = {"device": dev, "cold": can_drop, "cpus": os.cpu_count(), "results": results}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"vllm-load-{dev}{'' if a.cases == 'all' else '-' + a.cases}.json"
    limit = None
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        for case in cases(dev, a.quick, a.cases):
            if a.only and not case["name"].startswith(a.only):
                continue
            src, out = make_case(
                case["name"].split()[0], case["scheme"], case["spec"], Path(tmp), dev
            )
            if limit is None:
                spans = _ranges(out, case["prefixes"], False)
                *limit, tried = best_limit(spans, dev)
                report["limit_sweep"] = tried
                print(f"limit: {limit[0]} threads x {limit[1] // MiB} MiB (of {len(tried)} tried)")
                if a.sweep:
                    report["plugin_sweep"] = plugin_sweep(src, out, case["prefixes"], dev, can_drop)
            for cold in (False, True) if can_drop and not a.quick else (False,):
                r = measure(case, src, out, dev, tuple(limit), cold, a.repeat)
                r |= {"case": case["name"], "scheme": case["scheme"], "experts": case["experts"]}
                results.append(r)
                print(_row(r), flush=True)
                path.write_text(json.dumps(report, indent=2))  # a call cut short keeps these
            with contextlib.suppress(OSError):
                import shutil

                shutil.rmtree(src)
                shutil.rmtree(out)
    if not can_drop:
        print("cold: not measured (the page cache cannot be dropped here)")
    print(f"wrote {path}")
    with contextlib.suppress(ImportError):
        from scripts.bench_chart import chart

        print(f"wrote {chart(path)}")


def _row(r: dict) -> str:
    g = r["gbps"]
    return (
        f"| {r['case']} | {r['cache']} | {r['bytes'] / 1e9:.2f} GB | "
        f"{r['vllm_read_s'] * 1e3:.0f} + {r['vllm_process_s'] * 1e3:.0f} ms "
        f"({g['vllm']:.1f} GB/s) | "
        f"{r['plugin_read_s'] * 1e3:.0f} + {r['plugin_setup_s'] * 1e3:.0f} ms "
        f"({g['plugin']:.1f} GB/s) | "
        f"{r['limit_s'] * 1e3:.0f} ms ({g['limit']:.1f} GB/s) | **{r['vllm_over_plugin']:.2f}** | "
        f"{r['plugin_over_limit']:.2f} | {r['extra_gpu']['vllm'] / max(1, r['bytes']):.0%} / "
        f"{r['extra_gpu']['plugin'] / max(1, r['bytes']):.0%} | {r['pinned_peak'] / MiB:.0f} MiB |"
    )


if __name__ == "__main__":
    main()
