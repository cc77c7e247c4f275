"""`bf16`: unquantized BF16 experts (Mixtral, Qwen3-MoE, fused gate_up_proj checkpoints).

TRT-LLM (vLLM `convert_moe_weights_to_flashinfer_trtllm_block_layout`): I per rank padded to
128 per half; w13 = [up; gate] gated-interleaved, row-shuffled (tile 128) and in BlockMajorK
with 128-byte blocks (64 bf16 values); w2 row-shuffled (tile 128), BlockMajorK. Held as
[E, K/64, M, 64]. CUTLASS: w13 = [up; gate], w2 as is.

Non-gated experts (Nemotron-H, relu2_no_mul): w13 is the up projection alone ([I_p, H]),
padded to 128 (TRT-LLM), with no swap and no interleave (`base.w13_index`).

SGLang on TRT-LLM (`Layout.shard_padded`): the same transforms, but rank r holds rows
[r*I_p, (r+1)*I_p) of I, as many as there are, and zeros after (`RankRows`).
"""

from __future__ import annotations

import functools

import torch

from .. import layout as L
from ..errors import LayoutError
from ..source import Checkpoint, ExpertLayer
from ..target import VLLM_LAYOUT, Layout
from .base import (
    Backend,
    Ctx,
    LayerPlan,
    OutputTensor,
    RankRows,
    Scheme,
    SchemeName,
    Synthetic,
    layer_plan,
    per_rank,
    refuse_other_format,
    require_dtype,
    require_shapes,
    stage_w2,
    stage_w13,
    w13_index,
    w13_order,
    weight_dtype,
)

TILE = 128
PAD_I = 128
BLOCK_K = 64  # elements: 128 bytes of bf16


def synthetic_bf16(shape: tuple[int, int], g: torch.Generator) -> dict[str, torch.Tensor]:
    """A synthetic BF16 linear (`fi_convert.testing.synthetic`)."""
    return {"weight": (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)}


class Bf16Scheme(Scheme):
    name = SchemeName.BF16
    backends: tuple[Backend, ...] = (Backend.TRTLLM, Backend.CUTLASS)
    source_label = "BF16"
    quantized = False
    stand_ins = (("BF16", False),)
    variants = frozenset({"shard_padded"})  # SGLang on TRT-LLM
    non_gated = True
    synthetic = {"bf16": Synthetic(synthetic_bf16)}

    def matches(self, ckpt: Checkpoint, layers: list[ExpertLayer]) -> bool:
        return weight_dtype(layers[0]) == "BF16"

    def check(self, ckpt: Checkpoint, layer: ExpertLayer) -> None:
        refuse_other_format(layer, "bf16", ckpt.config)
        require_dtype(layer, "weight", ("BF16",), "convert the checkpoint to BF16 first")
        i, h = layer.intermediate_size, layer.hidden_size
        require_shapes(layer, "weight", (i, h), (h, i))

    def plan_layer(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        e, h = layer.num_experts, layer.hidden_size
        i_r = per_rank(layer.intermediate_size, tp, f"{layer.prefix}: intermediate size")
        if backend is Backend.CUTLASS:
            outs = _cutlass_outputs(layer, e, h, i_r)
            i_p = i_r
        else:
            if h % BLOCK_K:
                raise LayoutError(
                    f"{layer.prefix}: hidden size {h} is not a multiple of {BLOCK_K}; FlashInfer's "
                    "TRT-LLM BF16 BlockMajorK layout needs it and vLLM does not pad H - "
                    "use --backend cutlass"
                )
            i_p = L.round_up(i_r, PAD_I)
            rows = RankRows(layer.intermediate_size, tp, i_p, layout.shard_padded)
            outs = _trtllm_outputs(layer, e, h, rows)
            return layer_plan(layer, outs, i_r, i_p, **rows.info())
        return layer_plan(layer, outs, i_r, i_p)


def _trtllm_outputs(layer: ExpertLayer, e: int, h: int, rows: RankRows) -> list[OutputTensor]:
    i_p, gated, parts = rows.padded, layer.gated, layer.w13_parts

    @functools.cache
    def w13_idx(n: int) -> torch.Tensor:  # a rank holding n rows of I
        return w13_index(gated, n, i_p, interleave=True, tile=TILE)

    w2_idx = L.shuffle_row_index(h, TILE)

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        first, n = rows.span(rank)
        if n == 0:  # a rank past I (sharded by the padded size): only padding
            out.zero_()
            return
        src = stage_w13(ctx, layer, "weight", rank, experts, n, torch.bfloat16, start=first)
        L.gather_rows_block_major(src, w13_idx(n), BLOCK_K, out)

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        first, n = rows.span(rank)
        if n == 0:
            out.zero_()
            return
        src = stage_w2(ctx, layer, "weight", rank, experts, n, i_p, torch.bfloat16, start=first)
        L.gather_rows_block_major(src, w2_idx, BLOCK_K, out)

    lay = {
        "layout": "BlockMajorK",
        "block_k_bytes": 128,
        "epilogue_tile_m": TILE,
        "row_order": w13_order(gated),
        "gated_interleave": gated,
    }
    return [
        OutputTensor("w13_weight", "BF16", (e, h // BLOCK_K, parts * i_p, BLOCK_K), w13, lay),
        OutputTensor(
            "w2_weight",
            "BF16",
            (e, i_p // BLOCK_K, h, BLOCK_K),
            w2,
            {**lay, "row_order": "rows", "gated_interleave": False},
        ),
    ]


def _cutlass_outputs(layer: ExpertLayer, e: int, h: int, i_r: int) -> list[OutputTensor]:
    swap = w13_index(layer.gated, i_r, i_r)

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage_w13(ctx, layer, "weight", rank, experts, i_r, torch.bfloat16)
        L.gather_rows(src, swap, out)

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        out.copy_(stage_w2(ctx, layer, "weight", rank, experts, i_r, i_r, torch.bfloat16))

    lay = {"layout": "MajorK", "row_order": w13_order(layer.gated)}
    return [
        OutputTensor("w13_weight", "BF16", (e, layer.w13_parts * i_r, h), w13, lay),
        OutputTensor("w2_weight", "BF16", (e, h, i_r), w2, {**lay, "row_order": "rows"}),
    ]
