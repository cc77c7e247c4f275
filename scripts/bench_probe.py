"""The cost of asking a model where its non-expert tensors go (format/probe.py), on the CPU:
Qwen3-30B-A3B's 8 layers' non-expert tensors (75) through a model that slices them as vLLM's
loaders do at tensor parallelism (scripts/bench_models.RankModel), the probe and the second pass
(`replay`) timed apart, medians of 30; with `--alt PATH`, another probe.py's probe in turn with it.

With `--vllm`: vLLM 0.33's own Qwen3-MoE model class at Qwen3-30B-A3B's 48 layers (435
non-expert tensors; tiny sizes: the asking's cost is per tensor, not per byte), rank 0 of TP,
built on this CPU as tests/test_vllm_models.py builds it: the asking (`DenseLoad`: the model's
tensors and state, its `load_weights` over the probes), against the model's own `load_weights`
over the same tensors with their data (what vLLM's default load runs, less the reading), and
the asking on the whole-model bench's stand-in built of vLLM's layers
(`bench_models.vllm_rank_model`) from the same checkpoint, and the load that takes the first
asking's answer instead of asking (`format/plan_cache.py`), each side in turn, medians of 15;
and what a first start adds to the asking to keep its answer: the model's state copied and
looked at (`format/as_found.py`).
Another probe.py's asking beside it with `--alt PATH`.

    python scripts/bench_probe.py [TP] [--alt PATH]    # TP 1 or 8 (default 8)
    python scripts/bench_probe.py --vllm [TP] [--alt PATH]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fi_convert.format.dense import _held, dtypes_of  # noqa: E402
from fi_convert.format.probe import probe, replay, storage_key  # noqa: E402
from fi_convert.st_io import TensorInfo  # noqa: E402
from scripts import bench_models as bm  # noqa: E402

H, VOCAB, LAYERS = 2048, 151936, 8
PER_LAYER = (
    ("self_attn.q_proj", (4096, H)),
    ("self_attn.k_proj", (512, H)),
    ("self_attn.v_proj", (512, H)),
    ("self_attn.o_proj", (H, 4096)),
    ("self_attn.q_norm", (128,)),
    ("self_attn.k_norm", (128,)),
    ("input_layernorm", (H,)),
    ("post_attention_layernorm", (H,)),
    ("mlp.gate", (128, H)),
)


def infos() -> dict[str, TensorInfo]:
    shapes = {"model.embed_tokens.weight": (VOCAB, H), "lm_head.weight": (VOCAB, H)}
    shapes["model.norm.weight"] = (H,)
    for layer in range(LAYERS):
        for name, shape in PER_LAYER:
            shapes[f"model.layers.{layer}.{name}.weight"] = shape
    out, offset = {}, 0
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        out[name] = TensorInfo(name, "BF16", shape, offset, nbytes, Path("model.safetensors"))
        offset += nbytes
    return out


def vllm_model(tp: int, alt: str | None) -> None:
    """--vllm: the asking on vLLM's own model class against its own load_weights (its
    checkpoint in a temporary folder, removed at the end)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        _vllm_model(tp, alt, Path(tmp))


def _vllm_model(tp: int, alt: str | None, root: Path) -> None:
    import contextlib

    from vllm.model_executor.model_loader.utils import initialize_model

    from fi_convert import Backend, Options, SchemeName, convert
    from fi_convert.format import dense, plan_cache
    from fi_convert.format.as_found import as_found
    from fi_convert.format.plan_cache import Context
    from fi_convert.format.reader import OutputReader
    from scripts.bench_vllm_load import _module_from
    from tests import hf_checkpoints
    from tests import vllm_moe as vm

    src = hf_checkpoints.save(
        "qwen3_moe",
        root / "src",
        num_hidden_layers=48,
        norm_topk_prob=True,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=8,
    )
    out = root / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, tp), device="cpu")
    cpu = torch.device("cpu")
    sides: dict[str, list[float]] = {"own load_weights": [], "asking": []}
    sides |= {"asking, --alt": []} if alt else {}
    sides["asking the stand-in"] = []
    sides["remembered"] = []  # (the answer of the first asking, kept: plan_cache)
    # a first start's look at the model's state (format/as_found.py): copied before the
    # asking, and compared after it
    look_sides: dict[str, list[float]] = {"state copied": [], "state looked at": []}
    ctx = Context("bench", "", (("tp", 0, tp),))
    os.environ[plan_cache.ENV] = str(root / "plans")
    layers = [f"model.layers.{k}.mlp.experts" for k in range(48)]
    plans: list[str] = []
    with vm.one_process_group(), vm.model_context(src, tp, 0, build_here=False) as cfg:
        with torch.device("cpu"):  # built as vLLM builds it; loaded outside, as vLLM loads
            model = initialize_model(vllm_config=cfg)
        with OutputReader(out, library_check=False) as reader:
            infos = dense.DenseLoad(reader, model, model.load_weights, cpu).infos
            data = [(n, torch.zeros(i.shape, dtype=dtypes_of(i))) for n, i in infos.items()]
            with torch.device("cpu"):
                # (named apart: vLLM's config holds the real model's layers by their names)
                moe = {p: vm.make_layer(f"standin.{p}", src, tp) for p in layers}
                places = bm.places(infos, tp, 0, head_dim=8)
                standin = bm.vllm_rank_model(infos, places, moe, head_dim=8)
            within: dict[str, list[float]] = {}  # the model's load_weights inside each asking

            def inside(side: str):
                def load_weights(weights):
                    t0 = time.perf_counter()
                    try:
                        return model.load_weights(weights)
                    finally:
                        within.setdefault(side, []).append(time.perf_counter() - t0)

                return load_weights

            for _ in range(15):
                for side, times in sides.items():
                    t0 = time.perf_counter()
                    if side == "own load_weights":
                        model.load_weights(iter(data))
                    elif side == "asking the stand-in":
                        dense.DenseLoad(reader, standin, standin.load_weights, cpu)
                    elif side == "remembered":
                        d = dense.DenseLoad(reader, model, model.load_weights, cpu, context=ctx)
                        d.keep()  # (the first: its entry written, as a whole load writes it)
                        plans.append(d.plan)
                    else:
                        swap = (
                            _module_from("fi_convert.format.probe", alt) if "alt" in side else None
                        )
                        with swap or contextlib.nullcontext():
                            dense.DenseLoad(reader, model, inside(side), cpu)
                    times.append(time.perf_counter() - t0)
                mods = [m for _, m in model.named_modules()]
                tensors = list(dense._held(list(model.named_modules()), cpu)[1].values())
                t0 = time.perf_counter()
                with as_found(mods, tensors) as found:
                    t1 = time.perf_counter()
                    assert found.changed() is None
                    look_sides["state looked at"].append(time.perf_counter() - t1)
                    found.keep = True
                look_sides["state copied"].append(t1 - t0)
    print(f"the plan: {plans[0]} at the first load, then {sorted(set(plans[1:]))}")
    sides["remembered"] = sides["remembered"][1:]  # (the first asked, and kept)
    own = statistics.median(sides["own load_weights"])
    print(
        f"vLLM's Qwen3-MoE class, 48 layers, rank 0 of TP {tp}, {len(infos)} tensors: "
        + ", ".join(
            f"{side} {statistics.median(t) * 1e3:.1f} ms ({statistics.median(t) / own:.2f}x)"
            for side, t in sides.items()
        )
        + " (medians of 15); of each asking, the model's load_weights over the probes: "
        + ", ".join(f"{side} {statistics.median(t) * 1e3:.1f} ms" for side, t in within.items())
        + "; the model's state, at a first start: "
        + ", ".join(
            f"{side} in {statistics.median(t) * 1e3:.2f} ms" for side, t in look_sides.items()
        )
        + f" ({len(mods)} modules, {len(tensors)} tensors)"
    )


def main() -> None:
    args = sys.argv[1:]
    alt = args[args.index("--alt") + 1] if "--alt" in args else None
    tps = [a for a in args if a.isdigit()]
    tp = int(tps[0]) if tps else 8
    if "--vllm" in args:
        vllm_model(tp, alt)
        return
    tensors = infos()
    model = bm.RankModel(tensors, bm.places(tensors, tp, 0), dtypes_of)
    held, _ = _held(list(model.named_modules()), torch.device("cpu"))
    wanted = [(n, i.shape, dtypes_of(i)) for n, i in tensors.items()]
    sides = {"probe": probe} | ({"--alt's probe": _probe_of(alt)} if alt else {})
    asked: dict[str, list[float]] = {side: [] for side in sides}
    again = []
    for _ in range(30):
        for side, ask in sides.items():  # (in turn: a noisy host falls on both alike)
            t0 = time.perf_counter()
            ask(model.load_weights, wanted, lambda t: storage_key(t) in held)
            asked[side].append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        replay(model.load_weights, ((n, (i.shape, dtypes_of(i))) for n, i in tensors.items()))
        again.append(time.perf_counter() - t1)
    print(
        f"TP {tp}, {len(tensors)} tensors: "
        + ", ".join(f"{side} {statistics.median(t) * 1e3:.2f} ms" for side, t in asked.items())
        + f", second pass {statistics.median(again) * 1e3:.2f} ms (medians of 30)"
    )


def _probe_of(path: str):
    """Another probe.py's `probe` (say an older commit's)."""
    from scripts.bench_vllm_load import _load_copy

    return _load_copy("fi_convert.format.probe", path).probe


if __name__ == "__main__":
    main()
