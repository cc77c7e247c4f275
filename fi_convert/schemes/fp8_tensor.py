"""`fp8-tensor`: FP8 E4M3 experts with one scale per tensor (ModelOpt FP8, compressed-tensors
FP8 with the tensor strategy), or BF16 experts quantized offline per tensor.

As vLLM 0.33 (`fp8_utils.py` requantization, `prepare_fp8_moe_layer_for_fi`):
1. activation scales reduced to one max per layer (w13: over w1 and w3 of all experts);
2. w13 requantized so gate and up share one scale per expert: each half dequantized with its
   own scale (`fp8_dequantize_f16`, the GPU's float16 arithmetic), requantized with the max;
3. I per rank padded to 16 per half (zeros); [up; gate];
4. TRT-LLM: gated interleave + row shuffle (tile 128) on w13, row shuffle on w2;
5. the scale products each kernel takes (see docs/FORMAT.md).
BF16 sources: each expert's rank slice of w13 ([gate; up]) and of w2 is quantized with a
dynamic per-tensor scale (amax / 448), as vLLM's online FP8; activation scales are dynamic
then, so no activation-scale products are written.

SGLang 0.5.23 (`ModelOptFp8MoEMethod`, ModelOpt FP8 sources with static activation scales): the
same requantization (its `per_tensor_dequantize` and `scaled_fp8_quant` are vLLM's arithmetic).
On TRT-LLM (`flashinfer_trtllm`) the same transforms, but I per rank padded to 128 by its
FusedMoE (`pad_i_128`) and sharded by the padded size (`shard_padded`). On CUTLASS
(`flashinfer_cutlass`) w13 stays [gate; up] as loaded, each half padded to 16
(`gate_up_rows`). Its scalars (`sglang_scalars`): each expert's w13 activation scale is the one
of w1's and w3's its loader reads last, A13 their max over experts; TRT-LLM output1 =
g1 * float32(1 / A2); CUTLASS fc1_dequant = S13 * A13, fc2_quant = float32(1 / A2),
fc2_dequant = A2 * S2, fc1_input_dequant = A13.

Non-gated experts (Nemotron-H, relu2_no_mul): w13 is the up projection alone, its bytes kept (one
scale per expert: no requantization), A13 the max of its input scales; I per rank padded to 128
(vLLM's min_alignment for non-gated experts, both backends; SGLang's CUTLASS path pads to 16, its
TRT-LLM FusedMoE to 128); no swap, no interleave; TRT-LLM's output1 is 1 / a2 (vLLM: ones / a2,
SGLang: ones * (1 / a2)).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .. import layout as L
from ..errors import LayoutError, SchemeMismatchError, SourceError
from ..quant import F32_TINY, fp8_dequantize_f16, fp8_dynamic_scale, fp8_quantize_static
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
    expert_scalars,
    last_loaded,
    layer_plan,
    modelopt,
    per_rank,
    refuse_other_format,
    require_dtype,
    require_param,
    require_shapes,
    stage_w2,
    stage_w13,
    w13_index,
    w13_order,
    weight_dtype,
)

TILE = 128
# I per rank padded to a multiple of: 16 for gated experts, 128 for non-gated ones (vLLM 0.33's
# prepare_fp8_moe_layer_for_fi: min_alignment = 16 if is_gated else 128, both backends)
PAD_I = {True: 16, False: 128}
SCALE, ACT = "weight_scale", "input_scale"


def _is_per_tensor(layer: ExpertLayer) -> bool:
    scales = [t for (_, p, _), t in layer.params.items() if p == SCALE]
    return weight_dtype(layer) == "F8_E4M3" and any(
        t.dtype == "F32" and t.nbytes == 4 for t in scales
    )


def synthetic_fp8_tensor(shape: tuple[int, int], g: torch.Generator, ct: bool = False) -> dict:
    """A synthetic ModelOpt FP8 linear (compressed-tensors, `ct`: its scales shaped [1])."""
    w = (torch.randn(shape, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    dim = (1,) if ct else ()
    s = (torch.rand(dim, generator=g) * 1e-3 + 1e-4).float()
    a = (torch.rand(dim, generator=g) * 0.05 + 0.01).float()
    return {"weight": w, "weight_scale": s, "input_scale": a}


_CT_FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}


class Fp8TensorScheme(Scheme):
    name = SchemeName.FP8_TENSOR
    backends: tuple[Backend, ...] = (Backend.TRTLLM, Backend.CUTLASS)
    source_label = "FP8"
    # static activation scales, none (dynamic), or BF16 experts quantized on conversion
    stand_ins = (("F8_E4M3", True), ("F8_E4M3", False), ("BF16", False))
    source_formats = ("fp8 per-tensor", "bf16, quantized per tensor")
    synthetic = {
        "fp8-tensor": Synthetic(synthetic_fp8_tensor, modelopt("FP8")),
        "fp8-tensor-ct": Synthetic(
            lambda shape, g: synthetic_fp8_tensor(shape, g, ct=True),
            compressed_tensors(
                "float-quantized", {**_CT_FP8, "dynamic": False}, {**_CT_FP8, "dynamic": False}
            ),
        ),
    }

    def precision(self, source: Scheme | None) -> str:
        if source is self:
            return (
                f"{source.source_label} -> {self.name.value} requantizes w13 to one scale per "
                "expert (gate and up share it), as vLLM does when it loads the source"
            )
        return super().precision(source)

    def matches(self, ckpt: Checkpoint, layers: list[ExpertLayer]) -> bool:
        return _is_per_tensor(layers[0])

    def check(self, ckpt: Checkpoint, layer: ExpertLayer) -> None:
        if weight_dtype(layer) != "F8_E4M3" or "weight_scale_inv" not in layer.param_names():
            refuse_other_format(layer, "fp8-tensor", ckpt.config)
        w = layer.tensor("w1", "weight", 0)
        i, h = layer.intermediate_size, layer.hidden_size
        if layer.form.kind not in self.form_kinds:
            raise SchemeMismatchError(
                f"{w.name}: fp8-tensor reads per-expert tensors only, gate, up and down apart "
                f"(these are {layer.form.kind})"
            )
        require_shapes(layer, "weight", (i, h), (h, i))
        if weight_dtype(layer) == "BF16":
            return
        if weight_dtype(layer) == "F8_E4M3" and not _is_per_tensor(layer):
            refuse_other_format(layer, "fp8-tensor", ckpt.config)
            other = "fp8-block" if layer.has("weight_scale_inv") else "mxfp8"
            raise SchemeMismatchError(
                f"{w.name}: the experts are not FP8 with per-tensor scales; use --scheme "
                f"{other} (or --scheme auto)"
            )
        require_dtype(layer, "weight", ("F8_E4M3",), "fp8-tensor reads E4M3 or BF16 weights")
        require_param(layer, SCALE, "FP8 per-tensor experts need a weight_scale each")
        if ACT in layer.param_names():
            require_param(layer, ACT, "static activation scales must be given for all or none")
        for (_, p, _), info in layer.params.items():
            if p in (SCALE, ACT) and (info.dtype != "F32" or info.nbytes != 4):
                raise SourceError(
                    f"{info.name}: a per-tensor scale must be one float32, got {info.dtype} "
                    f"{list(info.shape)}; this is not a per-tensor FP8 checkpoint"
                )

    # SGLang 0.5.23: TRT-LLM (shard_padded, pad_i_128) and CUTLASS (gate_up_rows), its scalars
    variants = frozenset({"shard_padded", "pad_i_128", "gate_up_rows", "sglang_scalars"})
    non_gated = True
    form_kinds = ("per_expert",)

    def plan_layer(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        e, h = layer.num_experts, layer.hidden_size
        i_r = per_rank(layer.intermediate_size, tp, f"{layer.prefix}: intermediate size")
        trt = backend is Backend.TRTLLM
        # SGLang's CUTLASS path (gate_up_rows) pads to 16 gated or not; vLLM by PAD_I
        pad = PAD_I[layer.gated or layout.gate_up_rows]
        i_p = L.round_up(i_r, TILE if trt and layout.pad_i_128 else pad)
        rows = RankRows(layer.intermediate_size, tp, i_p, trt and layout.shard_padded)
        if trt and h % 32:
            raise LayoutError(
                f"{layer.prefix}: hidden size {h} is not a multiple of 32, which the TRT-LLM "
                "row shuffle of w2 needs and vLLM does not pad - use --backend cutlass"
            )
        dynamic = weight_dtype(layer) == "BF16" or not layer.has(ACT)
        if dynamic and layout.sglang_scalars:
            raise LayoutError(
                f"{layer.prefix}: no static activation scales (input_scale); SGLang 0.5.23 "
                "would run these experts with activation scales of 1.0 - convert for vLLM "
                "(--server vllm)"
            )
        s = _Scales(layer, rows, layout.sglang_scalars)
        outs = _weights(layer, e, h, rows, backend, s, layout.gate_up_rows)
        outs += _scale_outputs(e, backend, dynamic, s, layout.sglang_scalars)
        notes = []
        if dynamic:
            notes.append(
                f"{layer.prefix}: no static activation scales (input_scale), so none are "
                "written; vLLM's FlashInfer FP8 per-tensor kernels take static scales - the "
                "server must supply calibrated ones"
            )
        fp8, bf16 = self.source_formats
        fmt = bf16 if weight_dtype(layer) == "BF16" else fp8
        return layer_plan(
            layer,
            outs,
            i_r,
            i_p,
            notes=notes,
            activation_scheme="dynamic" if dynamic else "static",
            source_format=fmt,
            **rows.info(),
        )


class _Scales:
    """Per-expert weight scales after requantization, the reduced activation scales, and each
    rank's requantized weights."""

    def __init__(self, layer: ExpertLayer, rows: RankRows, sglang: bool = False) -> None:
        self.layer, self.rows, self.sglang = layer, rows, sglang
        self.bf16 = weight_dtype(layer) == "BF16"
        self._cache: dict[tuple[int, str], torch.Tensor] = {}

    def checkpoint(self, ctx: Ctx, role: str, param: str) -> torch.Tensor:
        key = (-1, role + param)
        if key not in self._cache:
            self._cache[key] = expert_scalars(ctx, self.layer, role, param)
        return self._cache[key]

    def weight(self, ctx: Ctx, which: str, rank: int) -> torch.Tensor:
        """[E] float32: w13 (max of w1, w3) or w2 scales, as the server holds them for `rank`."""
        key = (rank, which)
        if key not in self._cache:
            if self.bf16:
                self._cache[key] = self._dynamic(ctx, which, rank)
            elif which == "w13" and not self.layer.gated:  # one projection: its own scale
                self._cache[key] = self.checkpoint(ctx, "w1", SCALE)
            elif which == "w13":
                w1, w3 = self.checkpoint(ctx, "w1", SCALE), self.checkpoint(ctx, "w3", SCALE)
                self._cache[key] = torch.maximum(w1, w3)
            else:
                self._cache[key] = self.checkpoint(ctx, "w2", SCALE)
        return self._cache[key]

    def _dynamic(self, ctx: Ctx, which: str, rank: int) -> torch.Tensor:
        out = []
        for e in range(self.layer.num_experts):
            x = self._bf16(ctx, which, rank, range(e, e + 1))
            out.append(fp8_dynamic_scale(x).clamp(min=F32_TINY).cpu())
        return torch.stack(out)

    def _bf16(self, ctx: Ctx, which: str, rank: int, experts: range) -> torch.Tensor:
        first, n = self.rows.span(rank)
        if which == "w13":
            x = stage_w13(ctx, self.layer, "weight", rank, experts, n, torch.bfloat16, start=first)
            return x[:, : self.layer.w13_parts * n]
        return stage_w2(ctx, self.layer, "weight", rank, experts, n, n, torch.bfloat16, start=first)

    def activation(self, ctx: Ctx, which: str) -> torch.Tensor:
        """0-dim float32: the max over experts of w2's, or for w13 of w1's and w3's (vLLM) or
        of the one of each expert's w1 and w3 that SGLang's loader reads last (SGLang)."""
        if which == "w2":
            return self.checkpoint(ctx, "w2", ACT).max()
        if not self.layer.gated:
            return self.checkpoint(ctx, "w1", ACT).max()
        w1, w3 = self.checkpoint(ctx, "w1", ACT), self.checkpoint(ctx, "w3", ACT)
        if self.sglang:
            up = last_loaded(self.layer, ACT, ("w1", "w3"))
            return torch.where(up, w3, w1).max()
        return torch.cat([w1, w3]).max()

    def quantized(self, ctx: Ctx, which: str, rank: int, experts: range) -> torch.Tensor:
        """FP8 bytes (uint8) of w13 ([gate; up; zero row], n rows each) or w2 (n columns, then
        zeros to I_p) for `experts` of `rank`, which holds n rows of I (`RankRows`)."""
        first, n = self.rows.span(rank)
        sel = slice(experts.start, experts.stop)
        target = self.weight(ctx, which, rank)[sel].to(ctx.device).view(-1, 1, 1)
        if self.bf16:
            q = fp8_quantize_static(self._bf16(ctx, which, rank, experts), target)
        elif which == "w2":
            i_p = self.rows.padded
            return stage_w2(
                ctx, self.layer, "weight", rank, experts, n, i_p, torch.uint8, start=first
            )
        elif not self.layer.gated:  # one scale per expert already: vLLM keeps the bytes
            return stage_w13(ctx, self.layer, "weight", rank, experts, n, torch.uint8, start=first)
        else:
            raw = stage_w13(ctx, self.layer, "weight", rank, experts, n, torch.uint8, start=first)
            w8 = raw.view(torch.float8_e4m3fn)
            s1 = self.checkpoint(ctx, "w1", SCALE)[sel].to(ctx.device).view(-1, 1, 1)
            s3 = self.checkpoint(ctx, "w3", SCALE)[sel].to(ctx.device).view(-1, 1, 1)
            gate = fp8_quantize_static(fp8_dequantize_f16(w8[:, :n], s1), target)
            up = fp8_quantize_static(fp8_dequantize_f16(w8[:, n : 2 * n], s3), target)
            q = torch.cat([gate, up], dim=1)
        q = q.view(torch.uint8)
        if which == "w13":  # the zero row the padding index points at
            return torch.cat([q, q.new_zeros((q.shape[0], 1, q.shape[2]))], dim=1)
        pad = self.rows.padded - q.shape[2]
        return q if pad == 0 else torch.nn.functional.pad(q, (0, pad))


def _weights(
    layer, e, h, rows: RankRows, backend, s: _Scales, gate_up: bool = False
) -> list[OutputTensor]:
    trt, i_p, gated = backend is Backend.TRTLLM, rows.padded, layer.gated

    @functools.cache
    def w13_idx(n: int) -> torch.Tensor:  # a rank holding n rows of I
        return w13_index(
            gated, n, i_p, swap=not gate_up, interleave=trt, tile=TILE if trt else None
        )

    w2_idx = L.shuffle_row_index(h, TILE) if trt else None

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        n = rows.span(rank)[1]
        if n == 0:  # a rank past I (sharded by the padded size): only padding
            out.zero_()
            return
        L.gather_rows(s.quantized(ctx, "w13", rank, experts), w13_idx(n), out.view(torch.uint8))

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        if rows.span(rank)[1] == 0:
            out.zero_()
            return
        src = s.quantized(ctx, "w2", rank, experts)
        if w2_idx is None:
            out.view(torch.uint8).copy_(src)
        else:
            L.gather_rows(src, w2_idx, out.view(torch.uint8))

    lay = {"layout": "MajorK", "epilogue_tile_m": TILE if trt else None}
    order = w13_order(gated, swap=not gate_up)
    return [
        OutputTensor(
            "w13_weight",
            "F8_E4M3",
            (e, layer.w13_parts * i_p, h),
            w13,
            {**lay, "row_order": order, "gated_interleave": trt and gated},
        ),
        OutputTensor("w2_weight", "F8_E4M3", (e, h, i_p), w2, {**lay, "row_order": "rows"}),
    ]


def _scale_outputs(
    e: int, backend: Backend, dynamic: bool, s: _Scales, sglang: bool = False
) -> list[OutputTensor]:
    """The weight scales, and with static activation scales the activation scales and the
    products each kernel takes, under the server's names (module doc)."""

    def per_expert(fn):
        def produce(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
            out.copy_(fn(ctx, rank))

        return produce

    def a13(ctx, rank):
        return s.activation(ctx, "w13")

    def a2(ctx, rank):
        return s.activation(ctx, "w2")

    def w13s(ctx, rank):
        return s.weight(ctx, "w13", rank)

    def w2s(ctx, rank):
        return s.weight(ctx, "w2", rank)

    def g1(ctx, rank):
        return w13s(ctx, rank) * a13(ctx, rank)

    def g2(ctx, rank):
        return w2s(ctx, rank) * a2(ctx, rank)

    def a2_inv(ctx, rank):
        return 1.0 / a2(ctx, rank)

    def out1(ctx, rank):  # vLLM 0.33's TRT-LLM experts divide: g1_alphas / a2
        if not s.layer.gated:  # non-gated: ones / a2 (TrtLlmFp8ExpertsMonolithic)
            return torch.ones_like(g1(ctx, rank)) / a2(ctx, rank)
        return g1(ctx, rank) / a2(ctx, rank)

    def out1_sglang(ctx, rank):  # SGLang multiplies by the reciprocal: g1 * (1.0 / a2)
        if not s.layer.gated:  # non-gated: ones * (1.0 / a2) (align_fp8_moe_weights_for_...)
            return torch.ones_like(g1(ctx, rank)) * a2_inv(ctx, rank)
        return g1(ctx, rank) * a2_inv(ctx, rank)

    fns: dict[str, tuple[Callable, tuple[int, ...]]] = {
        "w13_weight_scale": (w13s, (e,)),
        "w2_weight_scale": (w2s, (e,)),
    }
    if not dynamic:
        fns |= {"w13_input_scale": (a13, ()), "w2_input_scale": (a2, ())}
        if backend is Backend.TRTLLM:
            fns |= {
                "output1_scales_scalar": (out1_sglang if sglang else out1, (e,)),
                "output1_scales_gate_scalar": (g1, (e,)),
                "output2_scales_scalar": (g2, (e,)),
            }
        elif sglang:  # ModelOptFp8MoEMethod's CUTLASS quant scales, in its order
            fns |= {
                "fc1_dequant": (g1, (e,)),
                "fc2_quant": (a2_inv, ()),
                "fc2_dequant": (g2, (e,)),
                "fc1_input_dequant": (a13, ()),
            }
        else:
            fns |= {"g1_alphas": (g1, (e,)), "g2_alphas": (g2, (e,)), "a2_gscale": (a2_inv, ())}

    def entry(name: str, shape: tuple[int, ...]) -> dict:
        lay = {"layout": "per_expert" if shape else "scalar", "row_order": None}
        return lay | ({"formula": "sglang"} if sglang and name in SGLANG_FORMULA else {})

    return [
        OutputTensor(name, "F32", shape, per_expert(fn), entry(name, shape), chunked=False)
        for name, (fn, shape) in fns.items()
    ]


# The scalars whose value follows SGLang's rules where they are SGLang's (`sglang_scalars`):
# A13 from the input scale its loader reads last, and TRT-LLM's output1 by the reciprocal
SGLANG_FORMULA = frozenset(
    {
        "w13_input_scale",
        "output1_scales_scalar",
        "output1_scales_gate_scalar",
        "fc1_dequant",
        "fc1_input_dequant",
    }
)
