"""`make bench`, serving half: a MoE layer (and whole models) loaded into vLLM 0.33's own
FusedMoE layers three ways, side by side in one run.

    python scripts/bench_vllm_load.py [--out DIR] [--repeat R] [--quick] [--cases model]

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
shapes for mxfp4) and whole models at real proportions, TP 1 and rank 0 of TP 8 (Qwen3-30B-A3B,
gpt-oss-120b, DeepSeek-V3: scripts/bench_models.py; every tensor of the rank, the non-expert
ones through one rank's model; the limit reads the bytes the rank keeps). On CPU (no GPU here):
fp8-block, bf16 and fp8-tensor at 16 experts and Qwen3-30B-A3B's whole model at a smaller size,
warm only; the limit reads into host memory (for a whole model, pages never touched, as its new
parameters are).
Warm, the plugin loads a whole model once untimed first, as a server's first start: the model
asked where its other tensors go, its answer kept (fi_convert/format/plan_cache.py, in a folder
of this run's), so that the timed loads are later starts'; cold, every run takes it too.
Medians of R runs, the three paths alternating. Writes vllm-load-<device>.json and a chart
(scripts/bench_chart.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert import Backend, Options, SchemeName, convert  # noqa: E402
from fi_convert.bulk_read import host_buffers  # noqa: E402
from fi_convert.format import plan_cache  # noqa: E402
from fi_convert.format.reader import OutputReader  # noqa: E402
from fi_convert.servers.vllm import experts as plugin  # noqa: E402
from fi_convert.testing.synthetic import Spec, write_checkpoint  # noqa: E402
from scripts import bench_models as bm  # noqa: E402
from scripts.bench_limit import limit_path  # noqa: E402
from tests import vllm_moe as vm  # noqa: E402

H, INTER = 7168, 2048
MiB = 1 << 20
SWEEP = [(t, c * MiB) for t in (4, 8, 12, 16, 24) for c in (4, 8, 16, 64) if t * 2 * c <= 2048]


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
    """Peak device memory beyond what was allocated at the start (`extra`), what the load left
    allocated beyond it at the end (`grown`: a layer whose kernel layout is larger than what
    the model allocated, padded or in another dtype, as vLLM's own processing leaves it too),
    and the peak beyond the larger of the two (`transient`: what a load holds for a while and
    gives back; CUDA only)."""

    def __init__(self, dev: str) -> None:
        self.dev, self.extra, self.grown, self.transient = dev, 0, 0, 0

    def __enter__(self) -> Peak:
        _sync(self.dev)
        if self.dev == "cuda":
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: object) -> None:
        _sync(self.dev)
        if self.dev == "cuda":
            peak = torch.cuda.max_memory_allocated()
            self.extra = max(0, peak - self.base)
            self.grown = torch.cuda.memory_allocated() - self.base
            self.transient = max(0, self.extra - max(0, self.grown))

    def now(self) -> dict:
        """The peak and what is allocated beyond the start, so far."""
        if self.dev != "cuda":
            return {}
        return {
            "peak": torch.cuda.max_memory_allocated() - self.base,
            "grown": torch.cuda.memory_allocated() - self.base,
        }

    def report(self) -> dict:
        return {
            "extra_bytes": self.extra,
            "grown_bytes": self.grown,
            "transient_bytes": self.transient,
        }


def _layer_bytes(layer: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters(recurse=False))


def _shards(ckpt: Path) -> list[str]:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    return sorted({str(ckpt / s) for s in index.values()})


# -- vLLM's default path -----------------------------------------------------------------------


def _vllm_read(layers: dict[str, torch.nn.Module], src: Path, dense: Any = None) -> float:
    """vLLM's iterator over the source's shards: each MoE layer's tensors into its
    load_weights; with `dense` (a bench_models.RankModel), every other tensor into its
    load_weights; else the time of the layers' tensors alone."""
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
        elif dense is not None and name in dense.places:
            dense.load_weights([(name, tensor)])
            spent += time.perf_counter() - t0
        t0 = time.perf_counter()
    return spent


def vllm_path(src: Path, prefixes: list[str], dev: str, model: dict | None = None) -> dict:
    """vLLM's default load + processing; with `model` (a whole model case: its tp, rank and
    the places of its other tensors), every tensor of the source into one rank's model."""
    oss = json.loads((src / "config.json").read_text()).get("model_type") == "gpt_oss"
    tp, rank = (model["tp"], model["rank"]) if model else (1, 0)
    with vm.vllm_context("trtllm", tp, rank, device=dev, build_here=False):
        with torch.device(dev):  # built on the device, loaded outside the context (as vLLM)
            layers = {p: vm.make_layer(p, src, tp) for p in prefixes}
            dense = _rank_model(model, layers) if model else None
        with Peak(dev) as peak:
            t0 = time.perf_counter()
            if oss:  # the model's own MXFP4 loader reads the layer's tensors
                for p, layer in layers.items():
                    vm.load_gpt_oss(layer, src, p)
                if dense is not None:
                    _vllm_read_others(src, dense)
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
    return {"read_s": read, "process_s": t2 - t1, "layer_bytes": nbytes} | peak.report()


def _vllm_read_others(src: Path, model: Any) -> None:
    """The non-expert tensors of a gpt-oss source, as vLLM's iterator reads them (safetensors,
    tensor by tensor), into the model's load_weights (its experts are read apart)."""
    from safetensors import safe_open

    for shard in _shards(src):
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118
                if name in model.places:
                    model.load_weights([(name, f.get_tensor(name))])


# the whole-model cases' stand-in for a rank's vLLM model: "vllm" (built of vLLM's own layers,
# loaded through vLLM's own AutoWeightsLoader: bench_models.vllm_rank_model) where the family's
# other tensors are BF16, else "plain" (bench_models.RankModel: each tensor copied in a few
# lines, a fifth of what vLLM's own Python costs a tensor: docs/speed.md, the tenth session)
STAND_IN = "vllm"


def _rank_model(model: dict, layers: dict[str, torch.nn.Module]) -> torch.nn.Module:
    """One rank's model: its other tensors' parameters (on the current device) and the MoE
    layers, inside vLLM's context."""
    from fi_convert.format.dense import dtypes_of

    if STAND_IN == "vllm" and model.get("head_dim"):
        return bm.vllm_rank_model(model["infos"], model["places"], layers, model["head_dim"])
    m = bm.RankModel(model["infos"], model["places"], dtypes_of)
    for i, layer in enumerate(layers.values()):
        m.add_module(f"moe{i}", layer)
    return m


# -- the plugin ----------------------------------------------------------------------------


def plugin_path(src: Path, out: Path, prefixes: list[str], dev: str) -> dict:
    """As the plugin in a server: its pinned buffers allocated in the background while the
    layers are built (a real model takes far longer to build than one layer), then the read."""
    ahead = host_buffers().allocate(background=True) if dev == "cuda" else None
    with vm.vllm_context("trtllm", 1, 0, device=dev, build_here=False):
        with torch.device(dev):
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
        **peak.report(),
        "pinned_peak": stats.pinned_peak,
        "threads": stats.threads,
        "chunk": stats.chunk,
        "bytes": stats.bytes,
    }


def plugin_model_path(src: Path, out: Path, prefixes: list[str], dev: str, model: dict) -> dict:
    """The plugin's whole load (FiConvertModelLoader.load_weights: every MoE layer and the
    non-expert tensors the model only copies in one bulk read, then the model's load_weights
    with the others), then vLLM's post-load driver, which runs only the kernel setup for the
    MoE layers. Its log line is kept."""
    from unittest import mock

    from vllm.config.load import LoadConfig

    from fi_convert.servers.vllm import loader as plugin_loader

    tp, rank = model["tp"], model["rank"]
    from fi_convert.format import whole_read

    loader = plugin_loader.FiConvertModelLoader(LoadConfig(load_format="fi-convert"))
    cfg = types.SimpleNamespace(model=str(out), revision=None, quantization="fp8")
    if dev == "cuda":  # as its load_model does, before vLLM builds the model
        loader._ahead = whole_read.Ahead(dev, loader._output(cfg))
    with vm.vllm_context("trtllm", tp, rank, device=dev, build_here=False):
        with torch.device(dev):
            layers = {p: vm.make_layer(p, src, tp) for p in prefixes}
            m = _rank_model(model, layers)
        if loader._ahead is not None and loader._ahead.buffers is not None:
            # a real model's build (seconds) outlasts the pinned allocation it overlaps
            # (`alloc_s`); this one's few layers do not: the read starts once it is there
            loader._ahead.buffers.block()
        from fi_convert import child_read

        reads: list = []  # (another bulk_read.py's BulkRead, under --alt-bulk)

        def waited(real):
            def wait(self):
                reads.append(stats := real(self))
                return stats

            return wait

        phases: dict[str, float] = {}
        with (
            Peak(dev) as peak,
            mock.patch.object(plugin_loader, "logger") as log,
            mock.patch.object(whole_read.BulkRead, "wait", waited(whole_read.BulkRead.wait)),
            mock.patch.object(child_read.ProcessRead, "wait", waited(child_read.ProcessRead.wait)),
            _timed(phases),
        ):
            t0 = time.perf_counter()
            loader.load_weights(m, cfg)
            _sync(dev)
            t1 = time.perf_counter()
            read_mem = peak.now()  # (before the kernel setup: which of the two grows it)
            for layer in layers.values():
                vm.process(layer)
            _sync(dev)
            t2 = time.perf_counter()
    alloc_s = None
    if loader._ahead is not None:
        ahead = loader._ahead
        alloc_s = ahead.buffers.alloc_s if ahead.buffers is not None else ahead.ring.start_s
        ahead.close()
    said = log.info.call_args.args
    return {
        "alloc_s": alloc_s,
        "read_s": t1 - t0,
        "setup_s": t2 - t1,
        **peak.report(),
        "read_mem": read_mem,
        "line": said[0] % said[1:],
        # the whole read's jobs and when each thread ran out of them (its tail)
        "jobs": [getattr(r, "jobs", None) for r in reads],
        "phases_s": phases,
        "thread_ends_s": [getattr(r, "thread_ends", None) for r in reads],
    }


# the load's steps timed in each whole-model run (module, owner attribute or None, name)
PHASES = (
    ("fi_convert.format.whole_read", "Ahead", "reader"),  # (the output opened, or waited for)
    ("fi_convert.format.dense", "DenseLoad", "__init__"),  # (asking, headers, the rest)
    ("fi_convert.format.dense", "DenseLoad", "_infos"),
    ("fi_convert.format.dense", None, "_held"),
    ("fi_convert.format.dense", None, "probe"),
    ("fi_convert.format.dense", None, "_once"),
    ("fi_convert.format.dense", "DenseLoad", "add_to"),
    ("fi_convert.format.dense", "DenseLoad", "prefetch"),
    ("fi_convert.format.dense", "DenseLoad", "finish"),
    ("fi_convert.servers.vllm.experts", None, "install"),
    # (the BulkRead the load takes: another bulk_read.py's under --alt-bulk)
    ("fi_convert.format.whole_read", "BulkRead", "_plan"),
    ("fi_convert.format.whole_read", "BulkRead", "_check_sizes"),
    ("fi_convert.format.whole_read", "BulkRead", "_queue"),
    ("fi_convert.format.whole_read", "BulkRead", "_check_unchanged"),
    ("fi_convert.servers.vllm.loader", None, "moe_layers"),
    ("fi_convert.servers.vllm.loader", None, "mtp_layers"),
    ("fi_convert.servers.vllm.checks", None, "check_layer"),
    ("fi_convert.servers.vllm.checks", None, "check_split"),
    ("fi_convert.servers.vllm.checks", None, "check_sizes"),
    ("fi_convert.servers.vllm.experts", None, "set_up_kernel_only"),
    ("fi_convert.servers.vllm.loader", "FiConvertModelLoader", "track_weights_loading"),
    ("fi_convert.format.load_report", "LoadReport", "line"),
)


@contextlib.contextmanager
def _timed(into: dict[str, float]):
    """Each step of PHASES timed (seconds summed over its calls) into `into` (the whole-model
    runs: where the load's time outside the readers goes)."""
    import functools
    import importlib
    from unittest import mock

    with contextlib.ExitStack() as stack:
        for module, owner, name in PHASES:
            target = importlib.import_module(module)
            target = getattr(target, owner) if owner else target
            real = getattr(target, name, None)
            if real is None:  # (another tree's bulk_read.py under --alt-bulk)
                continue

            def timer(*a, _real=real, _name=name, **kw):
                t = time.perf_counter()
                try:
                    return _real(*a, **kw)
                finally:
                    into[_name] = into.get(_name, 0.0) + time.perf_counter() - t

            stack.enter_context(mock.patch.object(target, name, functools.wraps(real)(timer)))
        yield


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


def _model_spans(out: Path, prefixes: list[str], model: dict) -> list[tuple[str, int, int]]:
    """The byte ranges one rank of a whole model reads: its slices of the experts, and of
    the other tensors the rows it keeps (all of one split by columns, or replicated)."""
    spans = []
    with OutputReader(out) as r:
        for p in prefixes:
            for name in r.layer(p)["tensors"]:
                info, _, _ = r.info(p, name)
                spans.append(
                    (str(info.file), info.start + model["rank"] * info.row_bytes, info.row_bytes)
                )
    return spans + bm.kept_spans(model["infos"], model["places"])


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


def plugin_sweep(src: Path, out: Path, prefixes: list[str], dev: str) -> list:
    """The plugin's read at several thread counts and host-memory budgets (warm)."""
    from fi_convert import bulk_read

    tried = []
    for threads in (8, 16, 24, 32):
        for budget in ("128MiB", "256MiB", "512MiB", "1GiB"):
            env = {bulk_read.THREADS_ENV: str(threads), bulk_read.HOST_MEMORY_ENV: budget}
            with _env(env):
                s = min(plugin_path(src, out, prefixes, dev)["read_s"] for _ in range(2))
            tried.append({"threads": threads, "host_memory": budget, "read_s": s})
            print(f"plugin sweep: {threads} threads, {budget}: {s * 1e3:.0f} ms", flush=True)
    return tried


def bulk_path(spans: list, dev: str) -> dict:
    """The plugin's read mechanism alone: one BulkRead of the limit's very byte ranges into one
    preallocated buffer (as the limit's), its pinned block allocated ahead (as the plugin's in a
    server), no model."""
    from fi_convert.bulk_read import BulkRead

    total = sum(s for *_, s in spans)
    dst = torch.zeros(total, dtype=torch.uint8, device=dev)
    ahead = host_buffers().allocate() if dev == "cuda" else None
    fds = {p: os.open(p, os.O_RDONLY) for p in {s[0] for s in spans}}
    bulk, pos = BulkRead(dev, buffers=ahead), 0
    for path, off, size in spans:
        bulk.add(Path(path), fds[path], off, dst[pos : pos + size])
        pos += size
    t0 = time.perf_counter()
    stats = bulk.run()
    _sync(dev)
    seconds = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    if ahead is not None:
        ahead.free(background=False)
    return {"read_s": seconds, "bytes": total, "threads": stats.threads, "chunk": stats.chunk}


def _threads_chunk(text: str) -> tuple[int, int]:
    """`16x4`: 16 threads x 4 MiB chunks."""
    threads, mib = text.lower().split("x")
    return int(threads), int(mib) * MiB


def read_gap(
    case: dict,
    src: Path,
    out: Path,
    dev: str,
    limit: tuple,
    n: int,
    alt: dict | None = None,
    also: list[tuple[int, int]] | None = None,
) -> dict:
    """Where the plugin's time over the limit goes (warm, `n` runs of each, alternating): the
    limit (into a GPU also with torch's copies, not the driver's); the plugin's read mechanism
    on the limit's byte ranges into one buffer (`bulk_path`); the plugin's whole load. The
    limit and the mechanism equal: the gap is in how the load drives the read (its ranges,
    destinations, pieces); the mechanism and the load: in the mechanism.
    `alt` (name: path of another bulk_read.py, or `set:module:attr=value,...`): the plugin's
    load with that file's BulkRead, or with those module attributes set, too, as side "plugin
    <name>" (an A/B of the read mechanism or a setting in one process). `also` ((threads,
    chunk), ...): the limit at those too, as side "limit <threads>x<MiB>"."""
    model, spans = _case_spans(case, out)
    alt = alt or {}
    runs: dict[str, list[float]] = {"limit": []}
    runs |= {"limit torch": []} if dev == "cuda" else {}  # (its copies torch's)
    runs |= {"limit ready": []}  # (its threads started before the clock)
    others = {f"limit {t}x{c // MiB}": (t, c) for t, c in also or ()}  # (other threads x chunk)
    runs |= {side: [] for side in others}
    runs |= {"bulk": [], "plugin": []} | {f"plugin {name}": [] for name in alt}
    lines: list[str] = []  # the plugin's log line of each whole-model run
    tails: list[dict] = []  # its read's jobs and when each thread ran out of them
    sides = list(runs)
    # the case's bytes into the page cache first, untimed: the side drawn first in run 0 read
    # them from the disk where the last case's files had pushed them out (the tenth session:
    # the plugin, first in run 0 by the seed, at 20-25 times the limit in every case)
    limit_path(spans, dev, *limit)
    if model is not None:
        # and the model asked once where its other tensors go, its answer kept, as at a
        # server's first start (format/plan_cache.py): every run after it is a later start's
        plugin_model_path(src, out, case["prefixes"], dev, model)
    for k in range(n):
        # each run's order drawn afresh (seeded), not turned: turned, each side followed the
        # same one in every run, and whatever a side leaves behind fell on the same next one
        # (the eighth session: a change to the plan alone, always run after the bulk side,
        # read 10 % slower than HEAD's, always run after it; the order is not ruled out)
        order = sides[:]
        random.Random(k).shuffle(order)
        for side in order:
            if side.startswith("limit"):
                r = limit_path(
                    spans,
                    dev,
                    *others.get(side, limit),
                    driver=side != "limit torch",
                    ready=side == "limit ready",
                )
                runs[side].append(r["read_s"])
            elif side == "bulk":
                runs[side].append(bulk_path(spans, dev)["read_s"])
            else:
                name = side.removeprefix("plugin").strip()
                with _alternative(alt[name]) if name else contextlib.nullcontext():
                    if model is not None:
                        r = plugin_model_path(src, out, case["prefixes"], dev, model)
                        lines.append(f"[{side}] {r['line']}")
                        tails.append(
                            {
                                "side": side,
                                "jobs": r["jobs"],
                                "ends": r["thread_ends_s"],
                                "phases_ms": {k: v * 1e3 for k, v in r["phases_s"].items()},
                            }
                        )
                    else:
                        r = plugin_path(src, out, case["prefixes"], dev)
                runs[side].append(r["read_s"])
            gc.collect()
        ends = [  # each plugin side's read: its jobs, its first and last thread's end
            f"{t['side']} {t['jobs'][0]} jobs, threads done {t['ends'][0][0] * 1e3:.0f}-"
            f"{t['ends'][0][-1] * 1e3:.0f} ms"
            for t in tails[-sum(s.startswith("plugin") for s in sides) :]
            if t["jobs"] and t["jobs"][0] and t["ends"][0]
        ]
        print(  # (a call cut short keeps these)
            f"gap run {k}: "
            + ", ".join(f"{s} {runs[s][-1] * 1e3:.1f}" for s in sides)
            + (f" ({'; '.join(ends)})" if ends else ""),
            flush=True,
        )
    medians = {side: statistics.median(t) for side, t in runs.items()}
    print(
        f"read gap, {case['name']}: "
        + ", ".join(f"{side} {t * 1e3:.0f} ms" for side, t in medians.items())
        + f" (medians of {n})",
        flush=True,
    )
    return {
        "case": case["name"],
        # the limit's pieces of work (its spans cut at its chunk), beside the plugin's `tails`
        "limit_jobs": sum(-(-size // limit[1]) for *_, size in spans),
        "medians_s": medians,
        "runs_s": runs,
        "lines": lines,
        "tails": tails,
    }


def _alternative(what: str):
    """Parts joined by `+`: `set:module:attr=value,...` (Python literals), `mod:module=path`
    (another copy of one of fi-convert's modules: `_module_from`), or another bulk_read.py's
    path (its BulkRead class alone)."""
    import ast
    import importlib
    from unittest import mock

    # every module the load takes another's objects from, imported first: one imported inside
    # would take the other's for good (`from ..bulk_read import BulkRead`, as it is swapped)
    importlib.import_module("fi_convert.servers.vllm.loader")
    stack = contextlib.ExitStack()
    for part in what.split("+"):
        if part.startswith("mod:"):
            module, _, path = part.removeprefix("mod:").partition("=")
            stack.enter_context(_module_from(module, path))
            continue
        if not part.startswith("set:"):
            stack.enter_context(_bulk_read_from(part))
            continue
        for item in part.removeprefix("set:").split(","):
            where, _, value = item.partition("=")
            module, _, attr = where.partition(":")
            target = importlib.import_module(module)
            stack.enter_context(mock.patch.object(target, attr, ast.literal_eval(value)))
    return stack


@contextlib.contextmanager
def _bulk_read_from(path: str):
    """fi-convert's modules with the BulkRead class of another bulk_read.py (say an older
    commit's) while inside."""
    import fi_convert.bulk_read as ours

    mine, other = ours.BulkRead, _load_copy("fi_convert.bulk_read", path).BulkRead
    users = [
        m
        for k, m in list(sys.modules.items())
        if k.startswith("fi_convert") and getattr(m, "BulkRead", None) is mine
    ]
    for m in users:
        m.BulkRead = other
    try:
        yield
    finally:
        for m in users:
            m.BulkRead = mine


def _load_copy(module: str, path: str) -> Any:
    """Another copy of fi-convert's `module` (say an older commit's), from `path`, in the same
    package (its relative imports are fi-convert's own), loaded once."""
    import importlib.util

    package, _, last = module.rpartition(".")
    name = f"{package}._bench_{last}_{abs(hash(path))}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        sys.modules[name] = copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
    return sys.modules[name]


@contextlib.contextmanager
def _module_from(module: str, path: str):
    """fi-convert's modules with another copy's functions and classes of `module` while
    inside: each of fi-convert's modules that took one of `module`'s own by name (dense.py's
    `probe`, the loader's `OutputReader`) takes the copy's of that name."""
    import importlib

    ours, other = importlib.import_module(module), _load_copy(module, path)
    swaps = []
    for attr, obj in vars(ours).items():
        if getattr(obj, "__module__", None) != module or not hasattr(other, attr):
            continue
        for m in list(sys.modules.values()):
            if (
                m is not ours
                and getattr(m, "__name__", "").startswith("fi_convert")
                and getattr(m, attr, None) is obj
            ):
                swaps.append((m, attr, obj))
    for m, attr, _ in swaps:
        setattr(m, attr, getattr(other, attr))
    try:
        yield
    finally:
        for m, attr, obj in swaps:
            setattr(m, attr, obj)


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


def make_case(
    name: str, quant: str, spec: Spec, tmp: Path, dev: str, tp: int = 1
) -> tuple[Path, Path]:
    """The case's source (written once per name) and its output for `tp`."""
    src = tmp / f"{name}-src"
    if not (src / "model.safetensors.index.json").exists():
        write_checkpoint(src, spec)
    out = tmp / f"{name}-out-tp{tp}"
    if not out.exists():
        convert(src, out, Options(SchemeName(quant), Backend.TRTLLM, tp), device=dev)
    return src, out


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _case_spans(case: dict, out: Path) -> tuple[dict | None, list]:
    """A whole-model case's rank (its non-expert tensors and where its model holds them), and
    the byte ranges the limit reads for the case."""
    if not case.get("model"):
        return None, _ranges(out, case["prefixes"], False)
    with OutputReader(out) as rd:
        infos = bm.non_expert_infos(out, rd.is_expert_tensor)
    model = _model_of(case, infos)
    return model, _model_spans(out, case["prefixes"], model)


def _model_of(case: dict, infos: dict) -> dict:
    """A whole-model case's rank: its non-expert tensors and where its model holds them."""
    head_dim = case.get("head_dim") if STAND_IN == "vllm" else None
    tp, rank = case["tp"], case["rank"]
    places = bm.places(infos, tp, rank, head_dim)
    return {"tp": tp, "rank": rank, "infos": infos, "places": places, "head_dim": head_dim}


def _read_through(folder: Path) -> None:
    """Every safetensors file of `folder` read once (into the page cache)."""
    buf = bytearray(64 << 20)
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def measure(
    case: dict, src: Path, out: Path, dev: str, limit: tuple, cold: bool, r: int, more: int = 0
) -> dict:
    prefixes = case["prefixes"]
    model, spans = _case_spans(case, out)
    runs: dict[str, list[dict]] = {"vllm": [], "plugin": [], "limit": []}
    order = ["vllm", "plugin", "limit"]
    if not cold:  # warm: the source's and the output's bytes in the page cache first, untimed
        _read_through(src)
        limit_path(spans, dev, *limit)
        if model is not None:  # and the model's answer kept, as at a server's first start
            plugin_model_path(src, out, prefixes, dev, model)
    for k in range(r):
        for side in order[k % 3 :] + order[: k % 3]:  # each goes first once in three
            if cold:
                drop_caches()
            if side == "vllm":
                runs[side].append(vllm_path(src, prefixes, dev, model))
            elif side == "plugin" and model is not None:
                runs[side].append(plugin_model_path(src, out, prefixes, dev, model))
            elif side == "plugin":
                runs[side].append(plugin_path(src, out, prefixes, dev))
            else:  # (on CPU into fresh pages, as a model's new parameters are)
                fresh = model is not None and dev == "cpu"
                runs[side].append(limit_path(spans, dev, *limit, fresh=fresh))
            gc.collect()
            if dev == "cuda":
                torch.cuda.empty_cache()
    for k in range(0 if cold else more):  # the two fast sides again, alternating
        for side in ("plugin", "limit") if k % 2 == 0 else ("limit", "plugin"):
            if side == "limit":
                runs[side].append(
                    limit_path(spans, dev, *limit, fresh=model is not None and dev == "cpu")
                )
            elif model is not None:
                runs[side].append(plugin_model_path(src, out, prefixes, dev, model))
            else:
                runs[side].append(plugin_path(src, out, prefixes, dev))
            gc.collect()
    return summary(runs, "vllm", "vllm", cold) | {
        "extra_gpu": {
            "vllm": max(r["extra_bytes"] for r in runs["vllm"]),
            "plugin": max(r["extra_bytes"] for r in runs["plugin"]),
        },
        # of it, what each path left allocated (`grown`) and held only for a while
        **{
            f"{what}_gpu": {
                side: max(r.get(f"{what}_bytes", 0) for r in runs[side])
                for side in ("vllm", "plugin")
            }
            for what in ("grown", "transient")
        },
        "pinned_peak": max(r.get("pinned_peak", 0) for r in runs["plugin"]),
        "plugin_alloc_s": statistics.median(pinned)
        if (pinned := [r["alloc_s"] for r in runs["plugin"] if r.get("alloc_s") is not None])
        else None,
        "plugin_line": runs["plugin"][-1].get("line"),
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


def cases(dev: str, quick: bool, which: str, models: list[str] | None = None) -> list[dict]:
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

    models = model_cases(dev, models)
    if dev != "cuda":
        layers = [one(f"{q} x16", q, 16) for q in ("fp8-block", "bf16", "fp8-tensor")]
        return models if which == "model" else layers + models
    out = [one(f"{q} x64", q, 64) for q in ("fp8-block", "bf16", "fp8-tensor", "nvfp4", "mxfp8")]
    out.append(one("mxfp4 x128 (gpt-oss)", "mxfp4", 128, family="gpt-oss"))
    if quick:
        return out[:2]
    if which == "layers":
        return out
    big = [one("fp8-block x256", "fp8-block", 256)]
    if which == "model":
        return models
    return big if which == "big" else out + big + models


def model_cases(dev: str, names: list[str] | None = None) -> list[dict]:
    """Whole models at real proportions (scripts/bench_models.py), TP 1 and rank 0 of TP 8:
    `names`, else all on CUDA and Qwen3-30B-A3B's on CPU (at `make bench`'s size there)."""
    names = names or (list(bm.MODELS) if dev == "cuda" else ["Qwen3-30B-A3B"])
    out = []
    for name in names:
        spec, scheme = bm.spec_of(name, dev == "cuda")
        first = spec.dense_layers if spec.family == "deepseek-v3" else 0
        for tp in (1, 8):
            out.append(
                {
                    "name": f"{name} {'TP 1' if tp == 1 else 'TP 8 rank 0'}",
                    "source": name,
                    "scheme": scheme,
                    "experts": spec.experts,
                    "spec": spec,
                    "prefixes": [
                        f"model.layers.{k}.mlp.experts" for k in range(first, spec.layers)
                    ],
                    "model": True,
                    "tp": tp,
                    "rank": 0,
                    "head_dim": bm.HEAD_DIM.get(spec.family),
                }
            )
    return out


def profile(case: dict, src: Path, out: Path, dev: str, where: Path) -> None:
    """One warm plugin load of a whole-model case under cProfile: the 40 entries of most
    cumulative time and the 30 of most own time, into `where`/profile-<case>.txt."""
    import cProfile
    import io
    import pstats

    with OutputReader(out) as rd:
        infos = bm.non_expert_infos(out, rd.is_expert_tensor)
    model = _model_of(case, infos)
    prof = cProfile.Profile()
    prof.enable()
    r = plugin_model_path(src, out, case["prefixes"], dev, model)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    name = "".join(c if c.isalnum() else "-" for c in case["name"])
    (where / f"profile-{name}.txt").write_text(f"read_s {r['read_s']:.3f}\n" + text.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two cases, warm only")
    ap.add_argument("--warm-only", action="store_true", help="no cold runs")
    ap.add_argument("--tmp", default=None, help="where checkpoints are written")
    ap.add_argument(
        "--cases-dir",
        default=None,
        help="write the checkpoints here and keep them (a later run with it reuses them: A/B "
        "runs of two trees in turn)",
    )
    ap.add_argument(
        "--limit",
        default=None,
        metavar="THREADSxMiB",
        help="the limit's threads and chunk (e.g. 16x16) instead of sweeping them",
    )
    ap.add_argument(
        "--limit-also",
        action="append",
        default=[],
        metavar="THREADSxMiB",
        help="with --gap: the limit also at these threads and chunk, side by side",
    )
    ap.add_argument(
        "--cases",
        choices=["all", "layers", "big", "model"],
        default="all",
        help="layers: one layer per scheme; big: 256 experts and the whole model (CUDA); "
        "model: the whole model alone",
    )
    ap.add_argument("--only", default=None, help="only the cases whose name starts with this")
    ap.add_argument(
        "--tp", type=int, default=None, help="only the whole-model cases of this TP size (1 or 8)"
    )
    ap.add_argument(
        "--models",
        default=None,
        help=f"the whole models, comma-separated, of {', '.join(bm.MODELS)} (default: all on "
        "CUDA, Qwen3-30B-A3B on CPU, at a smaller size there)",
    )
    ap.add_argument(
        "--more",
        type=int,
        default=0,
        help="warm: the plugin and the limit (each under a second) this many more times, "
        "alternating, so that their medians are of repeat + more runs",
    )
    ap.add_argument(
        "--gap",
        type=int,
        default=0,
        help="also, warm, this many runs each of the limit, the plugin's read mechanism on the "
        "limit's byte ranges, and the plugin's load (read_gap: where the plugin's time over "
        "the limit goes)",
    )
    ap.add_argument(
        "--alt-bulk",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="with --gap: the plugin's load also with the BulkRead of another bulk_read.py "
        "(an older commit's: git show REV:fi_convert/bulk_read.py > PATH), side by side; "
        "or NAME=set:MODULE:ATTR=VALUE[,...]: with those module attributes set",
    )
    ap.add_argument(
        "--gap-only",
        action="store_true",
        help="with --gap: only that (no vLLM default path, no cold runs)",
    )
    ap.add_argument(
        "--sweep", action="store_true", help="also the plugin's threads x host memory, on case 1"
    )
    ap.add_argument(
        "--stand-in",
        choices=["vllm", "plain"],
        default="vllm",
        help="the whole models' stand-in for vLLM's model: built of vLLM's own layers and "
        "loaded by its AutoWeightsLoader (Qwen3-30B-A3B, gpt-oss-120b; default), or the plain "
        "one, whose load_weights copies each tensor in a few lines",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also one warm plugin load of each whole-model case under cProfile "
        "(OUT/profile-<case>.txt: where the time outside the read goes)",
    )
    a = ap.parse_args()
    globals()["STAND_IN"] = a.stand_in
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    can_drop = dev == "cuda" and drop_caches()
    results: list[dict] = []
    report = {"device": dev, "cold": can_drop, "cpus": os.cpu_count(), "results": results}
    report["stand_in"] = a.stand_in
    if dev == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"vllm-load-{dev}{'' if a.cases == 'all' else '-' + a.cases}.json"
    limit = None
    with (
        contextlib.nullcontext(a.cases_dir)
        if a.cases_dir
        else tempfile.TemporaryDirectory(dir=a.tmp)
    ) as tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)
        # the model's answers of where its other tensors go, kept by this run's loads alone
        os.environ.setdefault(plan_cache.ENV, str(Path(tmp) / f"plans-{os.getpid()}"))
        todo = [
            c
            for c in cases(dev, a.quick, a.cases, a.models.split(",") if a.models else None)
            if (not a.only or c["name"].startswith(a.only))
            and (a.tp is None or c.get("tp", 1) == a.tp)
        ]
        for i, case in enumerate(todo):
            key = case.get("source", case["name"].split()[0])
            src, out = make_case(
                key, case["scheme"], case["spec"], Path(tmp), dev, case.get("tp", 1)
            )
            if limit is None and a.limit:
                limit = list(_threads_chunk(a.limit))
            if limit is None:  # (swept on the first case's experts)
                spans = _ranges(out, case["prefixes"], False)
                *limit, tried = best_limit(spans, dev)
                report["limit_sweep"] = tried
                print(f"limit: {limit[0]} threads x {limit[1] // MiB} MiB (of {len(tried)} tried)")
                if a.sweep:
                    report["plugin_sweep"] = plugin_sweep(src, out, case["prefixes"], dev)
            if a.gap:
                alt = dict(x.split("=", 1) for x in a.alt_bulk)
                also = [_threads_chunk(x) for x in a.limit_also]
                gap = read_gap(case, src, out, dev, tuple(limit), a.gap, alt, also)
                report.setdefault("read_gap", []).append(gap)
                path.write_text(json.dumps(report, indent=2))
                if a.profile and a.gap_only and case.get("model"):
                    profile(case, src, out, dev, Path(a.out))
            for cold in (
                ()
                if a.gap and a.gap_only
                else (False, True)
                if can_drop and not a.quick and not a.warm_only
                else (False,)
            ):
                r = measure(case, src, out, dev, tuple(limit), cold, a.repeat, a.more)
                if a.profile and not cold and case.get("model"):
                    profile(case, src, out, dev, Path(a.out))
                r |= {"case": case["name"], "scheme": case["scheme"], "experts": case["experts"]}
                results.append(r)
                print(_row(r), flush=True)
                path.write_text(json.dumps(report, indent=2))  # a call cut short keeps these
            with contextlib.suppress(OSError):
                import shutil

                if a.cases_dir:
                    continue
                shutil.rmtree(out)
                if not any(c.get("source") == key for c in todo[i + 1 :]):
                    shutil.rmtree(src)
    if not can_drop:
        print("cold: not measured (the page cache cannot be dropped here)")
    print(f"wrote {path}")
    with contextlib.suppress(ImportError):
        from scripts.bench_chart import chart

        if results:  # (--gap-only: no chart)
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
