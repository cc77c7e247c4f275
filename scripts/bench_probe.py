"""The cost of asking a model where its non-expert tensors go (format/probe.py), on the CPU:
Qwen3-30B-A3B's 8 layers' non-expert tensors (75) through a model that slices them as vLLM's
loaders do at tensor parallelism (scripts/bench_models.RankModel), the probe and the second pass
(`replay`) timed apart, medians of 30.

    python scripts/bench_probe.py [TP]     # TP 1 or 8 (default 8)
"""

from __future__ import annotations

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


def main() -> None:
    tp = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    tensors = infos()
    model = bm.RankModel(tensors, bm.places(tensors, tp, 0), dtypes_of)
    held = _held(model, torch.device("cpu"))
    wanted = [(n, i.shape, dtypes_of(i)) for n, i in tensors.items()]
    asked, again = [], []
    for _ in range(30):
        t0 = time.perf_counter()
        probe(model.load_weights, wanted, lambda t: storage_key(t) in held)
        t1 = time.perf_counter()
        replay(model.load_weights, ((n, (i.shape, dtypes_of(i))) for n, i in tensors.items()))
        asked.append(t1 - t0)
        again.append(time.perf_counter() - t1)
    print(
        f"TP {tp}, {len(tensors)} tensors: probe {statistics.median(asked) * 1e3:.2f} ms, "
        f"second pass {statistics.median(again) * 1e3:.2f} ms (medians of 30)"
    )


if __name__ == "__main__":
    main()
