"""`mxfp8`: E4M3 weights with a UE8M0 scale per 32 values (ModelOpt / compressed-tensors MXFP8),
or BF16 experts quantized offline with the OCP MX rule (as vLLM's online MXFP8).

TRT-LLM only (vLLM has no FlashInfer CUTLASS MXFP8 path), as vLLM 0.33's
`align_mxfp8_moe_weights_for_fi_trtllm` + `_shuffle_mxfp8_moe_weights`: pad I per rank to 128
(each half) and H to 256, weights with 0 and scales with 127 (2**0); [up; gate]; gated
interleave + row shuffle (tile 128) on weights; the same rows on scales, then the 128x4 swizzle.
Scales are held swizzled, reshaped to [E, M, K/32]. Non-gated experts (Nemotron-H): w13 the
up projection alone, padded to 128, no swap or interleave.

SGLang 0.5.23 (its native `mxfp8` method, `Fp8MoEMethod`, on `flashinfer_trtllm`; MXFP8
sources only): the same transforms, but I per rank padded to 128 by its FusedMoE and sharded
by the padded size (`shard_padded`), H not padded (`hidden_padded` False; its processing needs
H a multiple of 128), the scale padding 0 (`zero_scale_pad`: its scales are allocated
zero-filled), and the scales named w13_weight_scale_inv, w2_weight_scale_inv
(`scale_inv_names`).
"""

from __future__ import annotations

import functools

import torch

from .. import layout as L
from ..errors import LayoutError, SchemeMismatchError
from ..quant import MX_BLOCK, UE8M0_ONE, mx_quantize
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
    compressed_tensors,
    flat_swizzled_index,
    layer_plan,
    modelopt,
    per_rank,
    quant_algo,
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

TILE = 128
PAD_I = 128
PAD_H = 256
SCALE = "weight_scale"


def _is_mx_source(layer: ExpertLayer) -> bool:
    scales = [t for (_, p, _), t in layer.params.items() if p == SCALE]
    return weight_dtype(layer) == "F8_E4M3" and any(t.dtype in ("U8", "F8_E8M0") for t in scales)


def synthetic_mxfp8(shape: tuple[int, int], g: torch.Generator) -> dict[str, torch.Tensor]:
    """A synthetic MXFP8 linear: E4M3 weights, a UE8M0 scale per 32."""
    w = (torch.randn(shape, generator=g) * 2).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.randint(110, 130, (shape[0], shape[1] // 32), generator=g, dtype=torch.uint8)
    return {"weight": w, "weight_scale": s}


_CT_MXFP8 = compressed_tensors(
    "mxfp8-quantized",
    {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32},
    {"num_bits": 8, "type": "float", "dynamic": True},
)


class Mxfp8Scheme(Scheme):
    name = SchemeName.MXFP8
    backends: tuple[Backend, ...] = (Backend.TRTLLM,)  # no CUTLASS layout: vLLM has no path
    source_label = "MXFP8"
    stand_ins = (("F8_E4M3", False), ("BF16", False))  # BF16 experts: quantized on conversion
    source_formats = ("mxfp8", "bf16, quantized (OCP MX, E4M3 + UE8M0 per 32)")
    variants = frozenset({"shard_padded", "hidden_padded", "zero_scale_pad", "scale_inv_names"})
    non_gated = True  # vLLM's layout (SGLang's is not proven for non-gated experts)
    synthetic = {
        "mxfp8": Synthetic(synthetic_mxfp8, modelopt("MXFP8")),
        "mxfp8-ct": Synthetic(synthetic_mxfp8, _CT_MXFP8),
    }

    def matches(self, ckpt: Checkpoint, layers: list[ExpertLayer]) -> bool:
        return _is_mx_source(layers[0]) or quant_algo(ckpt) in ("MXFP8",)

    def check(self, ckpt: Checkpoint, layer: ExpertLayer) -> None:
        if weight_dtype(layer) != "F8_E4M3" or "weight_scale_inv" not in layer.param_names():
            refuse_other_format(layer, "mxfp8", ckpt.config)
        w = layer.tensor("w1", "weight", 0)
        i, h = layer.intermediate_size, layer.hidden_size
        if weight_dtype(layer) == "BF16":
            require_shapes(layer, "weight", (i, h), (h, i))
            return
        if weight_dtype(layer) == "F8_E4M3" and layer.has("weight_scale_inv"):
            raise SchemeMismatchError(
                f"{w.name}: the experts are FP8 with 128x128 block scales; turning them into "
                "MXFP8 would requantize (lossy) - use --scheme fp8-block"
            )
        require_dtype(layer, "weight", ("F8_E4M3",), "mxfp8 reads E4M3 or BF16 weights")
        require_param(layer, SCALE, "MXFP8 needs a UE8M0 scale per 32 values (weight_scale)")
        require_dtype(layer, SCALE, ("U8", "F8_E8M0"), "MXFP8 scales are UE8M0 bytes")
        require_shapes(layer, "weight", (i, h), (h, i))
        require_shapes(layer, SCALE, (i, h // MX_BLOCK), (h, i // MX_BLOCK))

    def plan_layer(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        e, h = layer.num_experts, layer.hidden_size
        i_r = per_rank(layer.intermediate_size, tp, f"{layer.prefix}: intermediate size")
        require_multiples(
            layer,
            {"hidden size": h, "intermediate size per rank": i_r},
            MX_BLOCK,
            "an MX scale covers 32 values - use a --tp-size that keeps I/tp a multiple of 32",
        )
        i_p = L.round_up(i_r, PAD_I)
        h_p = L.round_up(h, PAD_H) if layout.hidden_padded else h
        quantize = weight_dtype(layer) == "BF16"
        if not layout.hidden_padded and h % TILE:
            raise LayoutError(
                f"{layer.prefix}: hidden size {h} is not a multiple of {TILE}; SGLang 0.5.23 does "
                "not pad H for MXFP8 on FlashInfer TRT-LLM and its scale shuffle needs it, so "
                "SGLang cannot serve this checkpoint on flashinfer_trtllm"
            )
        if quantize and layout.scale_inv_names:
            raise LayoutError(
                f"{layer.prefix}: BF16 experts: SGLang quantizes them to MXFP8 on the GPU at "
                "load, with its own kernels, whose bytes fi-convert does not write yet; convert "
                "an MXFP8 checkpoint, or for vLLM (--server vllm)"
            )
        rows = RankRows(layer.intermediate_size, tp, i_p, layout.shard_padded)
        outs = _outputs(layer, e, h, h_p, rows, quantize, layout)
        mxfp8, bf16 = self.source_formats
        fmt = bf16 if quantize else mxfp8
        return layer_plan(layer, outs, i_r, i_p, h_p=h_p, source_format=fmt, **rows.info())


def _staged(ctx, layer, which, part, rank, experts, span, i_p, h_p, quantize, s_pad):
    """The padded uint8 weights (`part` "w") or scales ("s") of w13 ([gate; up; pad row]) or
    w2, of the rank's `span` (first row, rows) of I. An MXFP8 source reads only that part; a
    BF16 source is read and quantized (the scales come with the weights; an even split)."""
    first, n = span
    if quantize:
        return _quantized(ctx, layer, which, rank, experts, n, i_p, h_p)["ws".index(part)]
    scale = part == "s"
    param, pad = (SCALE, s_pad) if scale else ("weight", 0)
    k = MX_BLOCK if scale else 1
    if which == "w13":
        return stage_w13(
            ctx, layer, param, rank, experts, n, torch.uint8, cols=h_p // k, pad=pad, start=first
        )
    return stage_w2(
        ctx,
        layer,
        param,
        rank,
        experts,
        n // k,
        i_p // k,
        torch.uint8,
        padded_rows=h_p,
        pad=pad,
        start=first // k,
    )


def _quantized(ctx, layer, which, rank, experts, i_r, i_p, h_p):
    """(weights, scales) of a BF16 source quantized with the OCP MX rule, padded."""
    if which == "w13":
        x = stage_w13(ctx, layer, "weight", rank, experts, i_r, torch.bfloat16)
        q, s = mx_quantize(x)
        return _pad(q.view(torch.uint8), 0, h_p), _pad(
            s, UE8M0_ONE, h_p // MX_BLOCK, last_row=UE8M0_ONE
        )
    x = stage_w2(ctx, layer, "weight", rank, experts, i_r, i_r, torch.bfloat16)
    q, s = mx_quantize(x)
    return (
        _pad(q.view(torch.uint8), 0, i_p, rows=h_p),
        _pad(s, UE8M0_ONE, i_p // MX_BLOCK, rows=h_p),
    )


def _pad(t: torch.Tensor, value: int, cols: int, rows: int | None = None, last_row=None):
    n, r, c = t.shape
    out = t.new_full((n, rows or r, cols), value)
    out[:, :r, :c] = t
    if last_row is not None:
        out[:, r - 1] = last_row
    return out


def _outputs(layer, e, h, h_p, rows: RankRows, quantize, layout: Layout) -> list[OutputTensor]:
    """`rows`: the rows of I each rank holds (a rank past I holds only padding)."""
    i_p, gated, parts = rows.padded, layer.gated, layer.w13_parts
    s_pad = 0 if layout.zero_scale_pad else UE8M0_ONE

    @functools.cache
    def w13_rows(n: int) -> torch.Tensor:  # a rank holding n rows of I
        return w13_index(gated, n, i_p, interleave=True, tile=TILE)

    w2_rows = L.shuffle_row_index(h_p, TILE)
    ks13, ks2 = h_p // MX_BLOCK, i_p // MX_BLOCK

    @functools.cache
    def w13_sf(n: int) -> torch.Tensor:
        return flat_swizzled_index(w13_rows(n), ks13)

    w2_sf = flat_swizzled_index(w2_rows, ks2)

    def staged(which: str, part: str, ctx: Ctx, rank: int, experts: range) -> torch.Tensor:
        span = rows.span(rank)
        return _staged(ctx, layer, which, part, rank, experts, span, i_p, h_p, quantize, s_pad)

    def empty(rank: int, out: torch.Tensor, fill: int) -> bool:
        if rows.span(rank)[1]:
            return False
        out.view(torch.uint8).fill_(fill)  # a rank past I (sharded by the padded size)
        return True

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        if not empty(rank, out, 0):
            n = rows.span(rank)[1]
            L.gather_rows(
                staged("w13", "w", ctx, rank, experts), w13_rows(n), out.view(torch.uint8)
            )

    def w13_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        if not empty(rank, out, s_pad):
            n = rows.span(rank)[1]
            L.gather_flat(staged("w13", "s", ctx, rank, experts), w13_sf(n), out)

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        if not empty(rank, out, 0):
            L.gather_rows(staged("w2", "w", ctx, rank, experts), w2_rows, out.view(torch.uint8))

    def w2_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        if not empty(rank, out, s_pad):
            L.gather_flat(staged("w2", "s", ctx, rank, experts), w2_sf, out)

    # scales of a BF16 source are made from its weights: chunk by the BF16 staging
    i_r = rows.span(0)[1]
    w13_stage = (parts * i_r + 1) * h * 2 if quantize else 0
    w2_stage = h * i_r * 2 if quantize else 0
    s13, s2 = ("w13_weight_scale", "w2_weight_scale")
    if layout.scale_inv_names:
        s13, s2 = s13 + "_inv", s2 + "_inv"
    lay = {"layout": "MajorK", "epilogue_tile_m": TILE}
    s_lay = {
        "layout": "swizzled_128x4",
        "epilogue_tile_m": TILE,
        "block": [1, MX_BLOCK],
        "pad": s_pad,
    }
    inter = {"row_order": w13_order(gated), "gated_interleave": gated}
    return [
        OutputTensor("w13_weight", "F8_E4M3", (e, parts * i_p, h_p), w13, {**lay, **inter}),
        OutputTensor("w2_weight", "F8_E4M3", (e, h_p, i_p), w2, {**lay, "row_order": "rows"}),
        OutputTensor(
            s13,
            "U8",
            (e, parts * i_p, ks13),
            w13_s,
            {**s_lay, **inter},
            stage_nbytes=w13_stage,
        ),
        OutputTensor(
            s2,
            "U8",
            (e, h_p, ks2),
            w2_s,
            {**s_lay, "row_order": "rows"},
            stage_nbytes=w2_stage,
        ),
    ]
