"""`fp8-block`: DeepSeek-style FP8 E4M3 experts with 128x128 block scales (`weight_scale_inv`).

TRT-LLM (vLLM `_shuffle_deepseek_fp8_moe_weights`): w13 = [up; gate] on weights and scales, no
padding; weights row-shuffled with epilogue tile 64 and in BlockMajorK (128-byte blocks), held
as [E, K/128, M, 128]; scales not shuffled. Both backends clamp scales to >= 1e-10. CUTLASS:
[up; gate] on weights and scales, weights MajorK.

Non-gated experts (Nemotron-H): w13 the up projection alone (weights and scales), no swap.

SGLang on TRT-LLM (`Layout(shuffled=False, clamped=False)`): [up; gate] weights MajorK, no
shuffle, and the scales as loaded (no clamp). Its split of I by the padded size is the even
one here: I/TP must be a multiple of 128 (`shard_padded` changes nothing).
"""

from __future__ import annotations

import torch

from .. import layout as L
from ..errors import SchemeMismatchError
from ..source import Checkpoint, ExpertLayer
from ..target import VLLM_LAYOUT, Layout
from .base import (
    Backend,
    Ctx,
    LayerPlan,
    OutputTensor,
    Scheme,
    SchemeName,
    Synthetic,
    layer_plan,
    per_rank,
    refuse_other_format,
    require_dtype,
    require_multiples,
    require_param,
    require_shapes,
    stage_w2,
    stage_w13,
    w13_index,
    w13_order,
    weight_dtype,
)

BLOCK = 128  # quantization block (rows and columns)
TILE = 64  # epilogue tile of the row shuffle
BLOCK_K = 128  # BlockMajorK block, in fp8 elements (= bytes)
MIN_SCALE = 1e-10
SCALE = "weight_scale_inv"


def synthetic_fp8_block(shape: tuple[int, int], g: torch.Generator) -> dict[str, torch.Tensor]:
    """A synthetic DeepSeek FP8 linear: 128x128 `weight_scale_inv` blocks (one near zero, as
    dead experts have in real checkpoints)."""
    # random E4M3 bytes, never NaN (0x7F/0xFF): fast enough for multi-GB benchmark checkpoints
    w = torch.randint(0, 0x7F, shape, generator=g, dtype=torch.uint8)
    w |= torch.randint(0, 2, shape, generator=g, dtype=torch.uint8) << 7
    w = w.view(torch.float8_e4m3fn)
    sb = (-(-shape[0] // 128), -(-shape[1] // 128))
    s = torch.rand(sb, generator=g) * 1e-3 + 1e-5
    s.view(-1)[0] = 1e-23  # a dead block: clamped to 1e-10 on conversion
    return {"weight": w, "weight_scale_inv": s}


DEEPSEEK_FP8 = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


class Fp8BlockScheme(Scheme):
    name = SchemeName.FP8_BLOCK
    backends: tuple[Backend, ...] = (Backend.TRTLLM, Backend.CUTLASS)
    source_label = "FP8"
    stand_ins = (("F8_E4M3", False),)
    synthetic = {"fp8-block": Synthetic(synthetic_fp8_block, DEEPSEEK_FP8, dense_too=True)}
    # SGLang on TRT-LLM; shard_padded holds as the even split (I/TP a multiple of 128)
    variants = frozenset({"shard_padded", "shuffled", "clamped"})
    non_gated = True  # vLLM's layouts (SGLang's are not proven for non-gated experts)

    def matches(self, ckpt: Checkpoint, layers: list[ExpertLayer]) -> bool:
        return weight_dtype(layers[0]) == "F8_E4M3" and SCALE in layers[0].param_names()

    def check(self, ckpt: Checkpoint, layer: ExpertLayer) -> None:
        if weight_dtype(layer) in ("BF16", "F16", "F32"):
            raise SchemeMismatchError(
                f"{layer.tensor('w1', 'weight', 0).name}: the experts are "
                f"{weight_dtype(layer)}, not FP8 block-quantized; use --scheme bf16 "
                "(or --scheme auto)"
            )
        refuse_other_format(layer, "fp8-block", ckpt.config)
        require_dtype(layer, "weight", ("F8_E4M3",), "fp8-block reads E4M3 weights")
        require_param(
            layer, SCALE, "fp8-block needs a 128x128 block scale per weight (weight_scale_inv)"
        )
        require_dtype(layer, SCALE, ("F32", "BF16"), "block scales must be float32 (or bfloat16)")
        i, h = layer.intermediate_size, layer.hidden_size
        require_shapes(layer, "weight", (i, h), (h, i))
        ib, hb = -(-i // BLOCK), -(-h // BLOCK)
        require_shapes(layer, SCALE, (ib, hb), (hb, ib))

    def plan_layer(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        e, h = layer.num_experts, layer.hidden_size
        i_r = per_rank(layer.intermediate_size, tp, f"{layer.prefix}: intermediate size")
        require_multiples(
            layer,
            {"hidden size": h, "intermediate size per rank": i_r},
            BLOCK,
            "the 128x128 scale blocks cannot be split (vLLM 0.33 pads such shards only for "
            "some kernels, not FlashInfer's) - use a --tp-size that keeps I/tp a multiple of 128",
        )
        outs = _outputs(layer, e, h, i_r, backend, layout)
        notes = []
        if backend is Backend.TRTLLM and (e % 4 or e > 512):
            notes.append(
                f"{e} experts: FlashInfer's TRT-LLM block-FP8 kernel needs a multiple of 4 "
                "(at most 512) experts per rank; serve this with expert parallelism that gives "
                "each rank such a count, or convert with --backend cutlass"
            )
        return layer_plan(layer, outs, i_r, i_r, notes=notes, weight_block_size=[BLOCK, BLOCK])


def _scale_producers(layer: ExpertLayer, i_r: int, clamped: bool):
    sb = i_r // BLOCK
    swap = w13_index(layer.gated, sb, sb)

    def w13_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage_w13(ctx, layer, SCALE, rank, experts, sb, _scale_dtype(layer))
        L.gather_rows(src.float(), swap, out)
        if clamped:
            out.clamp_(min=MIN_SCALE)

    def w2_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage_w2(ctx, layer, SCALE, rank, experts, sb, sb, _scale_dtype(layer))
        out.copy_(src)
        if clamped:
            out.clamp_(min=MIN_SCALE)

    return w13_s, w2_s


def _scale_dtype(layer: ExpertLayer) -> torch.dtype:
    return torch.bfloat16 if layer.tensor("w1", SCALE, 0).dtype == "BF16" else torch.float32


def _outputs(
    layer: ExpertLayer, e: int, h: int, i_r: int, backend: Backend, layout: Layout
) -> list[OutputTensor]:
    trt = backend is Backend.TRTLLM and layout.shuffled  # row shuffle + BlockMajorK
    w13_shape: tuple[int, ...]
    w2_shape: tuple[int, ...]
    w13_idx = w13_index(layer.gated, i_r, i_r, tile=TILE if trt else None)
    w2_idx: torch.Tensor | None = None
    if trt:
        w2_idx = L.shuffle_row_index(h, TILE)
    m13, order = layer.w13_parts * i_r, w13_order(layer.gated)

    def place(src: torch.Tensor, idx: torch.Tensor | None, out: torch.Tensor) -> None:
        if idx is None:
            out.copy_(src)
        elif trt:
            L.gather_rows_block_major(src, idx, BLOCK_K, out)
        else:
            L.gather_rows(src, idx, out)

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage_w13(ctx, layer, "weight", rank, experts, i_r, torch.uint8)
        place(src, w13_idx, out.view(torch.uint8))

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage_w2(ctx, layer, "weight", rank, experts, i_r, i_r, torch.uint8)
        place(src, w2_idx, out.view(torch.uint8))

    w13_s, w2_s = _scale_producers(layer, i_r, layout.clamped)
    if trt:
        lay = {"layout": "BlockMajorK", "block_k_bytes": BLOCK_K, "epilogue_tile_m": TILE}
        w13_shape = (e, h // BLOCK_K, m13, BLOCK_K)
        w2_shape = (e, i_r // BLOCK_K, h, BLOCK_K)
    else:
        lay = {"layout": "MajorK"}
        w13_shape, w2_shape = (e, m13, h), (e, h, i_r)
    s_lay: dict = {"layout": "row_major_blocks", "block": [BLOCK, BLOCK]}
    if layout.clamped:
        s_lay["min"] = MIN_SCALE
    sb, hb = i_r // BLOCK, h // BLOCK
    return [
        OutputTensor("w13_weight", "F8_E4M3", w13_shape, w13, {**lay, "row_order": order}),
        OutputTensor("w2_weight", "F8_E4M3", w2_shape, w2, {**lay, "row_order": "rows"}),
        OutputTensor(
            "w13_weight_scale_inv",
            "F32",
            (e, layer.w13_parts * sb, hb),
            w13_s,
            {**s_lay, "row_order": order},
        ),
        OutputTensor(
            "w2_weight_scale_inv", "F32", (e, hb, sb), w2_s, {**s_lay, "row_order": "rows"}
        ),
    ]
