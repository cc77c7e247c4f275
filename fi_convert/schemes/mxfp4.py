"""`mxfp4`: gpt-oss MXFP4 experts (`*_blocks` packed E2M1, `*_scales` UE8M0 per 32, `*_bias`),
fused per layer with gate/up rows interleaved (even rows gate, odd rows up).

TRT-LLM (vLLM 0.33 gpt-oss loader + `Mxfp4MoEMethod` with FlashInfer TRT-LLM):
* TP: I per rank = ceil(I / 32 / tp) * 32; rank r takes w13 rows [2*start, 2*end) and w2
  columns [start, end) with start = r * I_rank, end = min(start + I_rank, I) (the last ranks
  may hold fewer rows, or none); w2's bias only on rank 0 (zeros elsewhere).
* allocation padding: I per rank to 128 and H to 256, with zeros (weights, scales, biases);
* every pair of w13 rows swapped ([up, gate] pairs), then the row shuffle (tile 128) on w13 and
  w2 weights; the same rows on the scales, then the 128x4 swizzle; biases as float32, permuted
  with the same rows.

CUTLASS (vLLM's FLASHINFER_CUTLASS_MXFP4_MXFP8, SM100): the same TP split, padding I and H to
128; w13 de-interleaved into [up; gate] halves (weights, scales, bias), scales 128x4-swizzled,
w2 as loaded, biases in their checkpoint dtype. (vLLM's SM90 BF16-activation variant
interleaves weights with a CUDA op and is not produced.)

SGLang 0.5.23 on TRT-LLM (`--moe-runner-backend flashinfer_mxfp4`, `Mxfp4MoEMethod`): vLLM's
bytes, but for two layout variants: the scale padding holds UE8M0 1.0 (byte 127, the fill of
SGLang's scale parameters) where vLLM's holds 0 (`unit_scale_pad`), and the biases are named
w13_weight_bias and w2_weight_bias, as SGLang's parameters are (`weight_bias_names`).

SGLang 0.5.23 on CUTLASS (`flashinfer_mxfp4` on SM90: `Mxfp4MoEMethod.
_process_weights_for_sm90_cutlass`, FlashInfer's mixed-input MoE GEMM; `sm90_mixed`):
* TP: SGLang's loader takes vLLM's slices into parameters of I/TP rows, so it loads only where
  I/32 % TP == 0 (every rank then holds I_r = I/TP rows); refused elsewhere;
* H padded to 256 by FusedMoE (the loader's tail: weights 0, scales 127), then w13
  de-interleaved into [up; gate] halves, each padded to I_a = round_up(I_r, 128) with zeros
  (weights, scales, biases), w2's columns padded to I_a with zeros (its scales too);
* weights: FlashInfer's SM90 interleave (a byte move and a bit permutation of each 32-bit
  word, `layout.sm90_mixed_weight_index`, `layout.sm90_fp4_bits_`); scales: its 64x128 fold
  (`layout.sm90_scale_fold_index`), [E, rows/64, K/128, 16, 16]; biases BF16 (SGLang's
  parameters), w2's on rank 0 only.
"""

from __future__ import annotations

import functools
import math
import re

import torch

from .. import dtypes
from .. import layout as L
from ..errors import LayoutError, SchemeMismatchError, SourceError
from ..families import Form
from ..source import Checkpoint, ExpertLayer, expert_rows, read_rows_into
from ..st_io import TensorInfo
from ..target import VLLM_LAYOUT, Layout
from .base import (
    Backend,
    Ctx,
    LayerPlan,
    OutputTensor,
    Scheme,
    SchemeName,
    Synthetic,
    flat_swizzled_index,
    layer_plan,
    quant_algo,
    refuse_other_format,
    stand_in,
)

TILE = 128
PAD_I = 128
PAD_H = 256
MX = 32  # values per scale
UE8M0_ONE = 127  # UE8M0 1.0: SGLang's scale fill
PARAMS = ("blocks", "scales", "bias")
BIASES = ("w13_bias", "w2_bias")  # vLLM's parameter names


def _read(
    ctx: Ctx,
    info: TensorInfo,
    experts: range,
    rows: tuple[int, int],
    cols: tuple[int, int] | None,
    dst: torch.Tensor,
) -> None:
    """dst[i, :b-a, :w] = info[e, a:b] (flattened past dim 1), columns [c, d) when given."""
    flat, per = expert_rows(info), info.shape[1]
    for i, e in enumerate(experts):
        read_rows_into(ctx.files, flat, e * per + rows[0], rows[1] - rows[0], cols, dst[i])


# gpt-oss's own config (the experts are the gpt-oss family's: `fi_convert.testing.synthetic`)
GPT_OSS_MXFP4 = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
BIAS_DTYPES = ("BF16", "F16", "F32")


class Mxfp4Scheme(Scheme):
    name = SchemeName.MXFP4
    backends: tuple[Backend, ...] = (Backend.TRTLLM, Backend.CUTLASS)
    source_label = "MXFP4"
    synthetic = {"mxfp4": Synthetic(None, GPT_OSS_MXFP4)}
    # SGLang: on TRT-LLM the first two; on CUTLASS (SM90) the last two
    variants = frozenset({"unit_scale_pad", "weight_bias_names", "sm90_mixed"})

    def stand_in_layers(
        self, prefix: str, e: int, h: int, i: int, *, gated: bool = True
    ) -> list[ExpertLayer]:
        """gpt-oss's fused experts, with biases of each float dtype (CUTLASS keeps them); no
        server runs non-gated experts in MXFP4 (`gated` is not read)."""
        fused = Form("fused", re.compile(""), {})
        out = []
        for b13 in BIAS_DTYPES:
            for b2 in BIAS_DTYPES:
                params = {
                    (r, q, -1): stand_in(prefix, f"{r}_{q}", b if q == "bias" else "U8")
                    for r, b in (("w13", b13), ("w2", b2))
                    for q in ("blocks", "scales", "bias")
                }
                out.append(ExpertLayer(prefix, fused, e, h, i, params))
        return out

    def matches(self, ckpt: Checkpoint, layers: list[ExpertLayer]) -> bool:
        return ("w13", "blocks", -1) in layers[0].params or quant_algo(ckpt) == "MXFP4"

    def check(self, ckpt: Checkpoint, layer: ExpertLayer) -> None:
        if ("w13", "blocks", -1) not in layer.params:
            refuse_other_format(layer, "mxfp4", ckpt.config)
            raise SchemeMismatchError(
                f"{layer.source_names()[0]}: mxfp4 reads gpt-oss experts "
                "(gate_up_proj_blocks/_scales/_bias); use --scheme auto to pick the scheme "
                "for this checkpoint"
            )
        e, i, h = layer.num_experts, layer.intermediate_size, layer.hidden_size
        want = {
            ("w13", "blocks"): ((e, 2 * i, h // MX, 16), "U8"),
            ("w13", "scales"): ((e, 2 * i, h // MX), "U8"),
            ("w13", "bias"): ((e, 2 * i), None),
            ("w2", "blocks"): ((e, h, i // MX, 16), "U8"),
            ("w2", "scales"): ((e, h, i // MX), "U8"),
            ("w2", "bias"): ((e, h), None),
        }
        for (role, param), (shape, dtype) in want.items():
            info = layer.params.get((role, param, -1))
            proj = "gate_up_proj" if role == "w13" else "down_proj"
            if info is None:
                raise SourceError(
                    f"{layer.prefix}.{proj}_{param}: missing; gpt-oss MXFP4 experts need "
                    "blocks, scales and bias for gate_up_proj and down_proj"
                )
            if info.shape != shape or (dtype and info.dtype != dtype):
                raise SourceError(
                    f"{info.name}: {info.dtype} {list(info.shape)}, expected "
                    f"{dtype or 'float'} {list(shape)}; the checkpoint is inconsistent"
                )
            if param == "bias" and info.dtype not in ("BF16", "F16", "F32"):
                raise SourceError(f"{info.name}: bias dtype {info.dtype}, expected a float type")
        if i % MX or h % MX:
            raise LayoutError(f"{layer.prefix}: H {h} and I {i} must be multiples of {MX}")

    def plan_layer(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        e, h, i = layer.num_experts, layer.hidden_size, layer.intermediate_size
        if layout.sm90_mixed:
            return _plan_sm90(layer, tp)
        i_r = math.ceil(i / MX / tp) * MX
        pad_h = PAD_H if backend is Backend.TRTLLM else PAD_I  # CUTLASS rounds both to 128
        i_a, h_a = L.round_up(i_r, PAD_I), L.round_up(h, pad_h)
        outs = _outputs(layer, e, h, i, i_r, i_a, h_a, backend, layout)
        rows = [max(0, min(i, (r + 1) * i_r) - r * i_r) for r in range(tp)]
        return layer_plan(layer, outs, i_r, i_a, h_p=h_a, rows_per_rank=rows, group_size=MX)


def _outputs(layer, e, h, i, i_r, i_a, h_a, backend: Backend, layout: Layout) -> list[OutputTensor]:
    """TRT-LLM: pair swap + row shuffle on w13 (rows13), row shuffle on w2 (rows2), float32
    biases. CUTLASS (vLLM's FLASHINFER_CUTLASS_MXFP4_MXFP8): w13 de-interleaved into
    [up; gate] halves, w2 as loaded, scales 128x4-swizzled, biases kept in their dtype.
    `layout`: the scale padding's byte, the biases' names."""
    trt = backend is Backend.TRTLLM
    if trt:
        pairs = torch.arange(2 * i_a) ^ 1  # [gate, up] pairs -> [up, gate]
        rows13 = L.compose(pairs, L.shuffle_row_index(2 * i_a, TILE))
        rows2 = L.shuffle_row_index(h_a, TILE)
    else:  # odd rows (up) first, then even rows (gate)
        rows13 = torch.cat([torch.arange(i_a) * 2 + 1, torch.arange(i_a) * 2])
        rows2 = torch.arange(h_a)
    sf13 = flat_swizzled_index(rows13, h_a // MX)
    sf2 = flat_swizzled_index(rows2, i_a // MX)
    p = {(r, q): layer.params[(r, q, -1)] for r in ("w13", "w2") for q in PARAMS}

    def span(rank: int) -> tuple[int, int]:
        start = rank * i_r
        return start, max(start, min(i, start + i_r))

    pad = UE8M0_ONE if layout.unit_scale_pad else 0

    def stage(n: int, rows: int, cols: int | None, dtype=torch.uint8) -> torch.Tensor:
        shape = (n, rows) if cols is None else (n, rows, cols)
        return torch.zeros(shape, dtype=dtype)

    def stage_s(n: int, rows: int, cols: int) -> torch.Tensor:
        return torch.full((n, rows, cols), pad, dtype=torch.uint8)

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        s, t = span(rank)
        src = stage(len(experts), 2 * i_a, h_a // 2)
        _read(ctx, p[("w13", "blocks")], experts, (2 * s, 2 * t), None, src)
        L.gather_rows(ctx.to_device(src), rows13, out)

    def w13_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        s, t = span(rank)
        src = stage_s(len(experts), 2 * i_a, h_a // MX)
        _read(ctx, p[("w13", "scales")], experts, (2 * s, 2 * t), None, src)
        L.gather_flat(ctx.to_device(src), sf13, out)

    def w13_b(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        s, t = span(rank)
        src = stage(len(experts), 2 * i_a, 1, _dtype(p[("w13", "bias")]))
        _read(ctx, p[("w13", "bias")], experts, (2 * s, 2 * t), None, src)
        _gather_bias(ctx.to_device(src), rows13, out)

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        s, t = span(rank)
        src = stage(len(experts), h_a, i_a // 2)
        _read(ctx, p[("w2", "blocks")], experts, (0, h), (s // 2, t // 2), src)
        L.gather_rows(ctx.to_device(src), rows2, out)

    def w2_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        s, t = span(rank)
        src = stage_s(len(experts), h_a, i_a // MX)
        _read(ctx, p[("w2", "scales")], experts, (0, h), (s // MX, t // MX), src)
        L.gather_flat(ctx.to_device(src), sf2, out)

    def w2_b(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage(len(experts), h_a, 1, _dtype(p[("w2", "bias")]))
        if rank == 0:  # vLLM adds the down bias once: on rank 0
            _read(ctx, p[("w2", "bias")], experts, (0, h), None, src)
        _gather_bias(ctx.to_device(src), rows2, out)

    tile = {"epilogue_tile_m": TILE} if trt else {}
    lay = {"layout": "MajorK", "packing": "e2m1x2", **tile}
    s_lay = {"layout": "swizzled_128x4", "block": [1, MX], "pad": pad, **tile}
    b_lay = {"layout": "rows", **tile}
    inter = (
        {"row_order": "up_gate_pairs", "gated_interleave": True}
        if trt
        else {"row_order": "up_gate"}
    )
    bias_dt = "F32" if trt else p[("w13", "bias")].dtype
    b13, b2 = ("w13_weight_bias", "w2_weight_bias") if layout.weight_bias_names else BIASES
    return [
        OutputTensor("w13_weight", "U8", (e, 2 * i_a, h_a // 2), w13, {**lay, **inter}),
        OutputTensor("w13_weight_scale", "U8", (e, 2 * i_a, h_a // MX), w13_s, {**s_lay, **inter}),
        OutputTensor(b13, bias_dt, (e, 2 * i_a), w13_b, {**b_lay, **inter}),
        OutputTensor("w2_weight", "U8", (e, h_a, i_a // 2), w2, lay),
        OutputTensor("w2_weight_scale", "U8", (e, h_a, i_a // MX), w2_s, s_lay),
        OutputTensor(
            b2,
            "F32" if trt else p[("w2", "bias")].dtype,
            (e, h_a),
            w2_b,
            {**b_lay, "rank0_only": True},
        ),
    ]


def _gather_bias(src: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
    """out[e] = src[e, rows] (as float32, then in out's dtype: exact for 16-bit biases)."""
    tmp = torch.empty((*out.shape, 1), dtype=torch.float32, device=out.device)
    L.gather_rows(src.float(), rows, tmp)
    out.copy_(tmp.squeeze(-1))


def _dtype(info: TensorInfo) -> torch.dtype:
    return dtypes.to_torch(info.dtype)


# ---- SGLang 0.5.23's SM90 CUTLASS layout (`Layout.sm90_mixed`) ----

PAD_H_SM90 = 256  # FusedMoE rounds H for mxfp4 on flashinfer_mxfp4; CUTLASS's 128 then holds


def _plan_sm90(layer: ExpertLayer, tp: int) -> LayerPlan:
    """The layer's plan for SGLang's SM90 layout: every rank holds I/TP rows (see the module
    doc), padded to I_a = round_up(I/TP, 128); H to H_a = round_up(H, 256)."""
    e, h, i = layer.num_experts, layer.hidden_size, layer.intermediate_size
    if (i // MX) % tp:
        ok = [t for t in (1, 2, 4, 8, 16) if (i // MX) % t == 0]
        raise LayoutError(
            f"{layer.prefix}: I {i} at --tp-size {tp}: SGLang 0.5.23's SM90 CUTLASS MXFP4 path "
            f"cannot load it (its gpt-oss loader slices ceil(I/32/TP)*32 rows into a buffer of "
            f"I/TP rows); use --tp-size {', '.join(map(str, ok))}, or --backend trtllm (SM100)"
        )
    i_r = i // tp
    i_a, h_a = L.round_up(i_r, PAD_I), L.round_up(h, PAD_H_SM90)
    outs = _sm90_outputs(layer, e, h, i_r, i_a, h_a)
    return layer_plan(layer, outs, i_r, i_a, h_p=h_a, rows_per_rank=[i_r] * tp, group_size=MX)


@functools.lru_cache(maxsize=4)
def _up_gate_rows(i_r: int, i_a: int) -> torch.Tensor:
    """Row map of SGLang's [up; gate] halves, each padded to i_a rows, from the loaded gpt-oss
    rows (2q gate, 2q + 1 up; q < i_r) plus one row of zeros at 2*i_r (the padding's source)."""
    q = torch.arange(i_a)
    zero = torch.full_like(q, 2 * i_r)
    return torch.cat([torch.where(q < i_r, 2 * q + 1, zero), torch.where(q < i_r, 2 * q, zero)])


@functools.lru_cache(maxsize=8)
def _sm90_index(kind: str, rows: int, cols: int, i_r: int = 0) -> torch.Tensor:
    """The one flat source index per expert of a tensor of SGLang's SM90 layout: `kind`
    "weight" (FlashInfer's SM90 byte move) or "scale" (its 64x128 fold) of a [rows, cols]
    matrix; with `i_r`, w13's: its rows taken by `_up_gate_rows` from the staged source
    [2*i_r + 1, cols]. Cached by shape: a model's layers share them."""
    fn = L.sm90_mixed_weight_index if kind == "weight" else L.sm90_scale_fold_index
    idx = fn(rows, cols)
    if i_r:
        idx = L.remap_rows(idx, cols, _up_gate_rows(i_r, rows // 2))
    return idx


def _sm90_outputs(layer: ExpertLayer, e: int, h: int, i_r: int, i_a: int, h_a: int):
    """SGLang's SM90 tensors: w13 staged as loaded (2*i_r rows and a zero row, H_a columns:
    weight 0, scales 127 past H), w2 staged at its padded size (scales 127 in H's tail where
    the loaded columns are, 0 in I's); one gather each, then the weights' bit step."""
    p = {(r, q): layer.params[(r, q, -1)] for r in ("w13", "w2") for q in PARAMS}
    rows13 = _up_gate_rows(i_r, i_a)

    def stage(n: int, rows: int, cols: int, fill: int = 0, dtype=torch.uint8) -> torch.Tensor:
        return torch.full((n, rows, cols), fill, dtype=dtype)

    def weights(src: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> None:
        L.gather_flat(src, idx, out)
        L.sm90_fp4_bits_(out.view(torch.int32))

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage(len(experts), 2 * i_r + 1, h_a // 2)
        _read(ctx, p[("w13", "blocks")], experts, (2 * rank * i_r, 2 * (rank + 1) * i_r), None, src)
        weights(ctx.to_device(src), _sm90_index("weight", 2 * i_a, h_a // 2, i_r), out)

    def w13_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage(len(experts), 2 * i_r + 1, h_a // MX, UE8M0_ONE)
        src[:, -1] = 0
        _read(ctx, p[("w13", "scales")], experts, (2 * rank * i_r, 2 * (rank + 1) * i_r), None, src)
        L.gather_flat(ctx.to_device(src), _sm90_index("scale", 2 * i_a, h_a // MX, i_r), out)

    def w13_b(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage(len(experts), 2 * i_r + 1, 1, dtype=_dtype(p[("w13", "bias")]))
        _read(ctx, p[("w13", "bias")], experts, (2 * rank * i_r, 2 * (rank + 1) * i_r), None, src)
        _gather_bias(ctx.to_device(src), rows13, out)

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage(len(experts), h_a, i_a // 2)
        cols = (rank * i_r // 2, (rank + 1) * i_r // 2)
        _read(ctx, p[("w2", "blocks")], experts, (0, h), cols, src)
        weights(ctx.to_device(src), _sm90_index("weight", h_a, i_a // 2), out)

    def w2_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage(len(experts), h_a, i_a // MX, UE8M0_ONE)
        src[:, :, i_r // MX :] = 0
        cols = (rank * i_r // MX, (rank + 1) * i_r // MX)
        _read(ctx, p[("w2", "scales")], experts, (0, h), cols, src)
        L.gather_flat(ctx.to_device(src), _sm90_index("scale", h_a, i_a // MX), out)

    def w2_b(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage(len(experts), h_a, 1, dtype=_dtype(p[("w2", "bias")]))
        if rank == 0:  # SGLang's loader zeroes the down bias on the other ranks
            _read(ctx, p[("w2", "bias")], experts, (0, h), None, src)
        out.copy_(ctx.to_device(src).squeeze(-1))

    lay = {"layout": "sm90_mixed_interleave", "packing": "e2m1x2"}
    # the scale padding: UE8M0 1.0 in H's tail (the loader's fill), 0 in I's (processing's)
    pad = {"hidden": UE8M0_ONE, "intermediate": 0}
    s_lay = {"layout": "sm90_scale_fold_64x128", "block": [1, MX], "pad": pad}
    up_gate = {"row_order": "up_gate"}
    b_lay = {"layout": "rows"}

    def folded(rows: int, cols: int) -> tuple[int, ...]:
        return (e, rows // 64, cols // 128, 16, 16)

    return [
        OutputTensor("w13_weight", "U8", (e, 2 * i_a, h_a // 2), w13, {**lay, **up_gate}),
        OutputTensor("w13_weight_scale", "U8", folded(2 * i_a, h_a), w13_s, {**s_lay, **up_gate}),
        OutputTensor("w13_weight_bias", "BF16", (e, 2 * i_a), w13_b, {**b_lay, **up_gate}),
        OutputTensor("w2_weight", "U8", (e, h_a, i_a // 2), w2, lay),
        OutputTensor("w2_weight_scale", "U8", folded(h_a, i_a), w2_s, s_lay),
        OutputTensor("w2_weight_bias", "BF16", (e, h_a), w2_b, {**b_lay, "rank0_only": True}),
    ]
