"""Whole models at real proportions for `scripts/bench_vllm_load.py --cases model`.

Qwen3-30B-A3B, gpt-oss-120b and DeepSeek-V3 shapes: every layer, the embeddings, the head and
the attention at their real sizes (fewer layers; on CPU, fewer experts and a smaller
vocabulary too). A model holds vLLM 0.33's own MoE layers (`tests/vllm_moe.make_layer`) and,
for every other tensor, the parameter one rank of vLLM's model holds for it, filled by a
`load_weights` that does what vLLM's weight loaders do with it: Q, K and V into one QKV
parameter and a dense MLP's gate and up into one (each at its shard's rows), DeepSeek's q_a and
kv_a projections into one; column-parallel tensors (QKV, gate/up, MLA's q_b and kv_b, the
embeddings and the head) split by rows, row-parallel ones (o_proj, down_proj) by columns, the
rest replicated. (vLLM's own model classes build on this CPU only for some families and not at
all on the GPU machine's vLLM without its compiled parts; tests/test_vllm_models.py proves the
plugin against them where they build.) That `RankModel` costs a fifth of what vLLM's own Python
costs a tensor; `vllm_rank_model` builds a rank's model of vLLM's own layers instead, loaded by
vLLM's own `AutoWeightsLoader`, for the families whose other tensors are BF16 (Qwen3-30B-A3B,
gpt-oss-120b): the whole-model bench's default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from fi_convert.st_io import TensorInfo, read_header
from fi_convert.testing.synthetic import Spec

QWEN3_ATTN = (("q_proj", (4096, 2048)), ("k_proj", (512, 2048)), ("v_proj", (512, 2048)))
GPT_OSS_ATTN = (("q_proj", (4096, 2880)), ("k_proj", (512, 2880)), ("v_proj", (512, 2880)))
MLA = (
    ("q_a_proj", (1536, 7168)),
    ("q_b_proj", (24576, 1536)),
    ("kv_a_proj_with_mqa", (576, 7168)),
    ("kv_b_proj", (32768, 512)),
    ("o_proj", (7168, 16384)),
)
# name -> (spec at full size on the GPU machine, scheme)
MODELS: dict[str, tuple[Spec, str]] = {
    "Qwen3-30B-A3B": (
        Spec(
            "qwen3-moe",
            layers=8,
            experts=128,
            hidden=2048,
            intermediate=768,
            vocab=151936,
            quant="bf16",
            shards=8,
            attention=(*QWEN3_ATTN, ("o_proj", (2048, 4096))),
        ),
        "bf16",
    ),
    "gpt-oss-120b": (
        Spec(
            "gpt-oss",
            layers=4,
            experts=128,
            hidden=2880,
            intermediate=2880,
            vocab=201088,
            quant="mxfp4",
            shards=8,
            attention=(*GPT_OSS_ATTN, ("o_proj", (2880, 4096))),
        ),
        "mxfp4",
    ),
    "DeepSeek-V3": (
        Spec(
            "deepseek-v3",
            layers=2,
            dense_layers=1,
            experts=256,
            hidden=7168,
            intermediate=2048,
            dense_intermediate=18432,
            vocab=129280,
            quant="fp8-block",
            shards=8,
            attention=MLA,
        ),
        "fp8-block",
    ),
}
CPU_SIZE = dict(layers=2, experts=16, vocab=16384, shards=4)  # `make bench` on a 2-core VM

FUSED = {  # checkpoint projection -> (vLLM's parameter, the members in order)
    "q_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "k_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "v_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "gate_proj": ("gate_up_proj", ("gate_proj", "up_proj")),
    "up_proj": ("gate_up_proj", ("gate_proj", "up_proj")),
    "q_a_proj": ("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa")),
    "kv_a_proj_with_mqa": ("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa")),
}
ROWS = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "q_b_proj", "kv_b_proj"}
ROWS |= {"embed_tokens", "lm_head"}
COLUMNS = {"o_proj", "down_proj"}
# vLLM's vocabulary-parallel embedding and head: the loader copies the rank's rows, then zeroes
# the padding rows after them (VocabParallelEmbedding.weight_loader)
VOCAB = ("embed_tokens", "lm_head")
REPLICATED = {"q_a_proj", "kv_a_proj_with_mqa"}
KV = {"k_proj", "v_proj"}  # split by heads: a rank of more ranks than heads keeps a whole one
# the attention's head size of the families whose model `vllm_rank_model` builds of vLLM's own
# layers (their other tensors are BF16, which those layers take as they are)
HEAD_DIM = {"qwen3-moe": 128, "gpt-oss": 64}


def spec_of(name: str, cuda: bool) -> tuple[Spec, str]:
    spec, scheme = MODELS[name]
    return (spec if cuda else replace(spec, **CPU_SIZE)), scheme  # type: ignore[arg-type]


@dataclass(frozen=True)
class Place:
    """Where one rank's vLLM model puts a checkpoint tensor: rows [start, start + size) of
    dim `dim` (None: all of it) into rows [at, at + size) of parameter `param`."""

    param: str
    dim: int | None
    start: int
    size: int
    at: int
    shape: tuple[int, ...]  # the parameter's


def places(
    infos: dict[str, TensorInfo], tp: int, rank: int, head_dim: int | None = None
) -> dict[str, Place]:
    """Each non-expert tensor's place in one rank's model (vLLM's loaders' rules above). With
    `head_dim`, K and V split by heads as vLLM's QKV layer splits them: where there are fewer
    heads than ranks, each rank keeps one whole head, ranks in turn sharing it."""
    out: dict[str, Place] = {}
    groups: dict[str, list[str]] = {}
    for name in infos:
        module, _, kind = name.rpartition(".")
        parent, _, proj = module.rpartition(".")
        dim = _dim(proj, infos[name].shape, tp)
        shape = list(infos[name].shape)
        size = shape[dim] // tp if dim is not None else (shape[0] if shape else 1)
        start = rank * size if dim is not None else 0
        if proj in KV and head_dim and shape[0] // head_dim < tp:
            heads = shape[0] // head_dim  # (replicated tp // heads times)
            dim, size, start = 0, head_dim, rank // (tp // heads) * head_dim
        if proj in FUSED:
            param, members = FUSED[proj]
            key = f"{parent}.{param}.{kind}"
            groups.setdefault(key, [])
            groups[key].append(name)
            out[name] = Place(key, dim, start, size, 0, ())
        else:
            if dim is not None:
                shape[dim] = size
            out[name] = Place(name, dim, start, size, 0, tuple(shape))
    for names in groups.values():  # each member at its shard's rows, in vLLM's order
        order = FUSED[names[0].rpartition(".")[0].rpartition(".")[2]][1]
        names.sort(key=lambda n: order.index(n.rpartition(".")[0].rpartition(".")[2]))
        at = 0
        for n in names:
            p = out[n]
            rows = p.size if p.dim == 0 else infos[n].shape[0]
            rest = tuple(infos[n].shape[1:])
            out[n] = replace(p, at=at)
            at += rows
        for n in names:
            out[n] = replace(out[n], shape=(at, *rest))
    return out


def _dim(proj: str, shape: tuple[int, ...], tp: int) -> int | None:
    """The dim a tensor of `proj` is split by over `tp` ranks (None: replicated)."""
    if tp == 1 or proj in REPLICATED or len(shape) < 2:
        return None
    dim = 0 if proj in ROWS else 1 if proj in COLUMNS else None
    return dim if dim is not None and shape[dim] % tp == 0 else None


class RankModel(torch.nn.Module):
    """One rank's model: vLLM's MoE layers (added by the caller) and a parameter for every
    other tensor, as `places` puts it; `load_weights` does what vLLM's loaders do."""

    def __init__(self, infos: dict[str, TensorInfo], places: dict[str, Place], dtypes) -> None:
        super().__init__()
        self.places = places
        self.names: dict[str, str] = {}
        for name, p in places.items():
            if p.param not in self.names:
                self.names[p.param] = p.param.replace(".", "__")
                t = torch.empty(p.shape, dtype=dtypes(infos[name]))
                self.register_parameter(self.names[p.param], torch.nn.Parameter(t, False))

    def load_weights(self, weights) -> set[str]:
        done = set()
        for name, t in weights:
            p = self.places[name]
            dst = getattr(self, self.names[p.param]).data
            src = t if p.dim is None else t.narrow(p.dim, p.start, p.size)
            rows = src.shape[0] if src.dim() else 1
            (dst.narrow(0, p.at, rows) if dst.dim() and dst.shape != src.shape else dst).copy_(src)
            if name.rpartition(".")[0].endswith(VOCAB):  # its padding rows zeroed (none here)
                dst[rows:].fill_(0)
            done.add(p.param)
        return done


def vllm_rank_model(
    infos: dict[str, TensorInfo],
    places_: dict[str, Place],
    moe: dict[str, torch.nn.Module],
    head_dim: int,
) -> torch.nn.Module:
    """One rank's model built of vLLM's own layers (call inside vLLM's config and groups, as
    the MoE layers in `moe`, keyed by their prefix, were built): its vocabulary-parallel
    embedding and head, QKV and row-parallel linear layers, replicated router, RMS norms (and
    Qwen3's per-head ones where the checkpoint has them), in a module tree named as vLLM's
    Qwen3-MoE model names it, the MoE layers in their place.
    Its `load_weights` is vLLM's own `AutoWeightsLoader`, through the body's, with the
    `WeightsMapper` of stacked names vLLM's Qwen3-MoE model gives it, each parameter taking
    its tensor by its own `weight_loader`: what a tensor costs a load in vLLM's own Python, as
    `scripts/bench_probe.py --vllm` measures on vLLM's own Qwen3-MoE class. `places` is kept
    for the bench's vLLM side (which names the model takes)."""
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import (
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )
    from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper

    stacked = WeightsMapper(
        orig_to_new_stacked={f".{p}": (".qkv_proj", p[0]) for p in ("q_proj", "k_proj", "v_proj")}
    )

    class Body(torch.nn.Module):
        def load_weights(self, weights):
            return AutoWeightsLoader(self).load_weights(weights, mapper=stacked)

    class Top(torch.nn.Module):
        def load_weights(self, weights):
            return AutoWeightsLoader(self).load_weights(weights)

    bf16 = dict(params_dtype=torch.bfloat16)
    vocab, hidden = infos["model.embed_tokens.weight"].shape
    top, body = Top(), Body()
    top.model, top.places = body, places_
    body.embed_tokens = VocabParallelEmbedding(vocab, hidden, **bf16)
    body.norm = RMSNorm(hidden, dtype=torch.bfloat16)
    top.lm_head = ParallelLMHead(vocab, hidden, **bf16)
    layers = 1 + max(int(n.split(".")[2]) for n in infos if n.startswith("model.layers."))
    body.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(layers))
    for k, layer in enumerate(body.layers):
        p = f"model.layers.{k}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            layer.add_module(norm, RMSNorm(hidden, dtype=torch.bfloat16))
        q, kv = (infos[f"{p}.self_attn.{x}_proj.weight"].shape[0] for x in "qk")
        layer.self_attn = torch.nn.Module()
        layer.self_attn.qkv_proj = QKVParallelLinear(
            hidden, head_dim, q // head_dim, kv // head_dim, bias=False, **bf16
        )
        layer.self_attn.o_proj = RowParallelLinear(q, hidden, bias=False, **bf16)
        for norm in ("q_norm", "k_norm"):  # (Qwen3's, per head)
            if f"{p}.self_attn.{norm}.weight" in infos:
                layer.self_attn.add_module(norm, RMSNorm(head_dim, dtype=torch.bfloat16))
        layer.mlp = torch.nn.Module()
        for router in ("gate", "router"):
            w = infos.get(f"{p}.mlp.{router}.weight")
            if w is not None:
                bias = f"{p}.mlp.{router}.bias" in infos
                made = ReplicatedLinear(hidden, w.shape[0], bias=bias, **bf16)
                layer.mlp.add_module(router, made)
        if f"{p}.mlp.experts" in moe:
            layer.mlp.experts = moe[f"{p}.mlp.experts"]
    unknown = set(infos) - {n for n, _ in top.named_parameters()} - _stacked_names(top)
    if unknown:
        raise ValueError(f"vllm_rank_model: no vLLM layer for {sorted(unknown)[:3]}")
    return top


def _stacked_names(model: torch.nn.Module) -> set[str]:
    """The checkpoint's names of the model's QKV parameters' members."""
    return {
        n.replace(".qkv_proj.", f".{x}_proj.")
        for n, _ in model.named_parameters()
        if ".qkv_proj." in n
        for x in "qkv"
    }


def non_expert_infos(out: Path, is_expert) -> dict[str, TensorInfo]:
    """The output's non-expert tensors, by name (its shards' headers)."""
    index = sorted({p for p in out.glob("model-*.safetensors")})
    return {n: i for shard in index for n, i in read_header(shard)[0].items() if not is_expert(n)}


def kept_spans(infos: dict[str, TensorInfo], places: dict[str, Place]) -> list[tuple]:
    """The byte ranges one rank reads of the non-expert tensors: the rows it keeps of a tensor
    split by rows, all of any other (a column split keeps a part of every row)."""
    spans = []
    for name, info in infos.items():
        p = places[name]
        if p.dim == 0:
            row = info.nbytes // info.shape[0]
            spans.append((str(info.file), info.start + p.start * row, p.size * row))
        else:
            spans.append((str(info.file), info.start, info.nbytes))
    return spans
