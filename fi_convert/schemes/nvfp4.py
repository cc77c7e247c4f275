"""`nvfp4`: packed E2M1 weights with an E4M3 scale per 16 values and a float32 global scale
(ModelOpt NVFP4, e.g. nvidia/DeepSeek-R1-FP4; compressed-tensors NVFP4, whose global scales
are stored as reciprocals).

TRT-LLM (vLLM 0.33 `prepare_nvfp4_moe_layer_for_fi_or_cutlass`, `TrtLlmNvFp4Experts`): pad H
to 256 and I per rank to 64 (each half; weights and scales with 0), [up; gate], gated
interleave + row shuffle (tile 128) on packed weights, the same rows on scales, then the 128x4
swizzle. Global scales: w1's `weight_scale_2` per expert (w3's if it differs is ignored, as
vLLM does, with a warning); activation scales reduced to one max per layer and folded:
w13_weight_scale_2 = s2(w1) * a13, w2_weight_scale_2 = s2(w2) * a2, g1_scale_c = that * (1 / a2).
CUTLASS: [up; gate], per-expert 128x4 swizzle of the scales (`swizzle_blockscale`), no row
shuffle and no padding; the kernel's scale products are written beside the weights.
Non-gated experts (Nemotron-H, relu2_no_mul): w13 the up projection alone, no swap or
interleave; TRT-LLM pads I per rank to 128 and g1_scale_c = a2_gscale; CUTLASS pads w13's rows
(and w2's columns) to the scale swizzle's 128, its MoE config keeping I per rank.

SGLang 0.5.23 on TRT-LLM (`ModelOptNvFp4FusedMoEMethod`, `flashinfer_trtllm`): the same
weight and block-scale transforms, but I per rank padded to 64 and sharded by the padded size
(`shard_padded`), H not padded (`hidden_padded` False; SGLang's processing then needs H a
multiple of 128), and SGLang's scalars (`split_scales`): w13_weight_scale_2 [E, 2] (gate, up)
and w2_weight_scale_2 as loaded; w13_input_scale [E, 2] holding, per expert, the input scale
of w1 or w3 that SGLang's loader reads last (its loader writes one value into both columns;
it reads the shards in sorted order, the names in each sorted) and w2_input_scale [E];
a13 = max(w13_input_scale), a2 = max(w2_input_scale); g1_alphas = a13 * s2(w1),
g1_alphas_up = a13 * s2(w3), g2_alphas = a2 * s2(w2), w13_input_scale_quant = 1 / a13 and
w2_input_scale_quant = 1 / a2 (0-dim), g1_scale_c = w2_input_scale_quant * g1_alphas_up.
With a SwiGLU clamp L (`ExpertLayer.swiglu_limit`: DeepSeek's config.json `swiglu_limit`, which
SGLang's DeepSeek MoE passes its experts), where some expert's g1_alphas and g1_alphas_up
differ, SGLang multiplies each half's w13 block scales (as loaded, before any reordering) by
its alpha / max(g1_alphas, g1_alphas_up) (1 where they agree), rounded back to E4M3, and sets
both alphas to that max; then gemm1_clamp_limit = L / g1_alphas (the layer entry records L).
On CUTLASS (`flashinfer_cutlass`): vLLM's weights and swizzled block scales ([up; gate], its
`swizzle_blockscale`, written in place), SGLang's scalars without g1_scale_c; where the
swizzle pads (w2's rows where H % 128, w13's columns where H % 64) SGLang cannot write it in
place: the scales stay as loaded and the swizzle is `w*_blockscale_swizzled` (`swizzle_apart`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .. import layout as L
from ..errors import LayoutError, SourceError
from ..quant import rescale_e4m3
from ..source import Checkpoint, ExpertLayer
from ..st_io import SourceFiles
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
    flat_swizzled_index,
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
# TRT-LLM pads I per rank to a multiple of: 64 for gated experts (2*64 rows of w13: FlashInfer's
# block-scale shuffle needs 128), 128 for non-gated ones (vLLM 0.33 prepare_nvfp4_moe_layer_
# for_fi_or_cutlass: min_alignment = 64 if is_gated else 128)
PAD_I = {True: 64, False: 128}
# CUTLASS: the scale swizzle pads w13's rows to 128; vLLM pads a non-gated w13 (and w2's
# columns) along to those rows, and refuses to pad a gated one
CUTLASS_ROWS = 128
PAD_H = 256
SF = 16  # values per scale
SCALE = "weight_scale"
# (ModelOpt name, compressed-tensors name of its reciprocal)
GLOBAL = ("weight_scale_2", "weight_global_scale")
ACT = ("input_scale", "input_global_scale")


def _pick(layer: ExpertLayer, names: tuple[str, str]) -> tuple[str, bool]:
    """The global-scale param this checkpoint has, and whether it is stored inverted."""
    have = layer.param_names()
    if names[0] in have:
        return names[0], False
    if names[1] in have:
        return names[1], True
    return names[0], False


def synthetic_nvfp4(shape: tuple[int, int], g: torch.Generator, ct: bool = False) -> dict:
    """A synthetic ModelOpt NVFP4 linear (or compressed-tensors, `ct`): packed E2M1 pairs,
    E4M3 scales per 16."""
    n, k = shape
    w = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    s = torch.randint(0x20, 0x58, (n, k // 16), generator=g, dtype=torch.uint8)
    s2 = (torch.rand((), generator=g) * 1e-3 + 1e-4).float()
    a = (torch.rand((), generator=g) * 0.05 + 0.01).float()
    if ct:  # compressed-tensors keeps the reciprocals of the global scales, shaped [1]
        return {
            "weight_packed": w,
            "weight_scale": s.view(torch.float8_e4m3fn),
            "weight_global_scale": (1.0 / s2).reshape(1),
            "input_global_scale": (1.0 / a).reshape(1),
        }
    return {
        "weight": w,
        "weight_scale": s.view(torch.float8_e4m3fn),
        "weight_scale_2": s2,
        "input_scale": a,
    }


# (as LLM Compressor's NVFP4 preset writes it: the tensor_group strategy is what vLLM's
# compressed-tensors config takes for NVFP4, `_is_nvfp4_format`)
_NVFP4_ARGS = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "group_size": 16,
    "strategy": "tensor_group",
}
_CT_NVFP4 = compressed_tensors(
    "nvfp4-pack-quantized",
    _NVFP4_ARGS | {"dynamic": False},
    _NVFP4_ARGS | {"dynamic": "local"},
)


class Nvfp4Scheme(Scheme):
    name = SchemeName.NVFP4
    backends: tuple[Backend, ...] = (Backend.TRTLLM, Backend.CUTLASS)
    source_label = "NVFP4"
    stand_ins = (("U8", True),)
    synthetic = {
        "nvfp4": Synthetic(synthetic_nvfp4, modelopt("NVFP4")),
        "nvfp4-ct": Synthetic(lambda shape, g: synthetic_nvfp4(shape, g, ct=True), _CT_NVFP4),
    }
    # SGLang's: TRT-LLM's split and unpadded H, its scalars, CUTLASS's padded swizzles apart
    variants = frozenset({"shard_padded", "hidden_padded", "split_scales", "swizzle_apart"})
    non_gated = True  # vLLM's layouts (SGLang's are not proven for non-gated experts)
    form_kinds = ("per_expert",)

    def matches(self, ckpt: Checkpoint, layers: list[ExpertLayer]) -> bool:
        scales = [t for (_, p, _), t in layers[0].params.items() if p == SCALE]
        return weight_dtype(layers[0]) == "U8" and any(t.dtype == "F8_E4M3" for t in scales)

    def check(self, ckpt: Checkpoint, layer: ExpertLayer) -> None:
        refuse_other_format(layer, "nvfp4", ckpt.config)
        if layer.form.kind not in self.form_kinds:
            raise SourceError(
                f"{layer.source_names()[0]}: nvfp4 reads per-expert tensors only, gate, up and "
                f"down apart (these are {layer.form.kind})"
            )
        require_dtype(layer, "weight", ("U8",), "NVFP4 weights are packed E2M1 bytes")
        require_param(layer, SCALE, "NVFP4 needs an E4M3 scale per 16 values (weight_scale)")
        require_dtype(layer, SCALE, ("F8_E4M3",), "NVFP4 block scales are E4M3")
        for names, what in ((GLOBAL, "a global weight scale"), (ACT, "an activation scale")):
            name, _ = _pick(layer, names)
            require_param(layer, name, f"NVFP4 experts need {what} ({' or '.join(names)})")
            require_dtype(layer, name, ("F32",), f"{what} is one float32")
        i, h = layer.intermediate_size, layer.hidden_size
        if h % SF or i % SF:
            raise LayoutError(f"{layer.prefix}: H {h} and I {i} must be multiples of {SF}")
        require_shapes(layer, "weight", (i, h // 2), (h, i // 2))
        require_shapes(layer, SCALE, (i, h // SF), (h, i // SF))

    def plan_stand_in(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        # no source data to read
        return self.plan_layer(layer, backend, tp, differ=[], layout=layout)

    def plan_layer(
        self,
        layer: ExpertLayer,
        backend: Backend,
        tp: int,
        differ: list[int] | None = None,
        *,
        layout: Layout = VLLM_LAYOUT,
    ) -> LayerPlan:
        """`differ`: the experts whose w1 and w3 global scales differ, read from the source
        when not given (`verify` re-plans a layer from its manifest entry, without the source)."""
        e, h = layer.num_experts, layer.hidden_size
        i_r = per_rank(layer.intermediate_size, tp, f"{layer.prefix}: intermediate size")
        if i_r % SF:
            raise LayoutError(
                f"{layer.prefix}: intermediate size per rank {i_r} is not a multiple of {SF} "
                "(one NVFP4 scale block); choose a --tp-size that keeps I/tp a multiple of 16"
            )
        trt = backend is Backend.TRTLLM
        if not trt and layer.gated and (2 * i_r) % CUTLASS_ROWS:
            # vLLM 0.33 prepare_nvfp4_moe_layer_for_fi_or_cutlass: the swizzle pads the w13
            # scale rows to 128, and the weights cannot follow ("Intermediate size padding for
            # w1 and w3 ... not currently supported"), so vLLM cannot serve such an output
            raise LayoutError(
                f"{layer.prefix}: intermediate size per rank {i_r}: the FlashInfer CUTLASS NVFP4 "
                "paths of vLLM 0.33 and SGLang 0.5.23 need 2*I/tp to be a multiple of 128 and "
                "refuse to pad it; "
                "use --backend trtllm or a --tp-size that keeps I/tp a multiple of 64"
            )
        # CUTLASS: a non-gated w13 is padded along to the swizzle's rows (CUTLASS_ROWS), w2's
        # columns with it, while vLLM's MoE config keeps I_r (the layer entry's I_p)
        i_p = L.round_up(i_r, PAD_I[layer.gated]) if trt else i_r
        rows_p = i_p if trt or layer.gated else L.round_up(i_r, CUTLASS_ROWS)
        h_p = L.round_up(h, PAD_H) if trt and layout.hidden_padded else h
        if trt and not layout.hidden_padded and h % TILE:
            raise LayoutError(
                f"{layer.prefix}: hidden size {h} is not a multiple of {TILE}; SGLang 0.5.23 does "
                "not pad H for NVFP4 on FlashInfer TRT-LLM and its w2 scale shuffle asserts it "
                "(FlashInfer's get_shuffle_matrix_sf_a_row_indices), so SGLang cannot serve it "
                "on flashinfer_trtllm; use --backend cutlass (flashinfer_cutlass), or "
                "--server vllm (vLLM pads H to 256)"
            )
        # SGLang on TRT-LLM: a SwiGLU clamp changes the w13 block scales and the alphas
        clamp = layer.swiglu_limit if trt and layout.split_scales else None
        sc = _Scales(layer)
        if layout.split_scales and (sc.g_inv or sc.a_inv):
            raise LayoutError(
                f"{layer.prefix}: compressed-tensors NVFP4: SGLang loads it with a method of its "
                "own, whose layout fi-convert does not write yet (it writes ModelOpt NVFP4's)"
            )
        differ = sc.w1_w3_differ() if differ is None else differ
        rows = RankRows(layer.intermediate_size, tp, i_p, layout.shard_padded)
        rescale = sc.block_scale_ratios if clamp is not None else None
        if trt:
            outs = _trtllm(layer, e, h_p, rows, rescale)
        else:
            outs = _cutlass(layer, e, h, i_r, rows_p, layout.swizzle_apart)
        if layout.split_scales:
            outs += sc.sglang_outputs(e, trt, clamp)
        else:
            outs += sc.outputs(e, backend)
        notes = []
        if differ and not layout.split_scales:
            notes.append(
                f"{layer.prefix}: w1 and w3 global scales (weight_scale_2) differ for some "
                "experts; using w1's, as vLLM does"
            )
        return layer_plan(
            layer,
            outs,
            i_r,
            i_p,
            h_p=h_p,
            notes=notes,
            group_size=SF,
            activation_scheme="static",
            w13_scale_2_differs_for_experts=differ,
            **(rows.info() if trt else {}),
            **({"swiglu_limit": clamp} if clamp is not None else {}),
        )


def _trtllm(
    layer, e, h_p, rows: RankRows, rescale: Callable[[Ctx], torch.Tensor | None] | None = None
) -> list[OutputTensor]:
    """`rows`: the rows of I each rank holds, padded to `rows.padded` (a rank past I holds
    only padding: zeros). `rescale`: [E, 2] ratios (up, gate) the w13 block scales are
    multiplied by before any reordering (SGLang's SwiGLU clamp; None: not rescaled)."""
    i_p, gated, parts = rows.padded, layer.gated, layer.w13_parts

    @functools.cache
    def rows13(n: int) -> torch.Tensor:  # a rank holding n rows of I
        return w13_index(gated, n, i_p, interleave=True, tile=TILE)

    @functools.cache
    def sf13(n: int) -> torch.Tensor:
        return flat_swizzled_index(rows13(n), h_p // SF)

    rows2 = L.shuffle_row_index(h_p, TILE)
    sf2 = flat_swizzled_index(rows2, i_p // SF)
    u8 = torch.uint8

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        first, n = rows.span(rank)
        if n == 0:
            out.zero_()
            return
        src = stage_w13(ctx, layer, "weight", rank, experts, n, u8, cols=h_p // 2, start=first)
        L.gather_rows(src, rows13(n), out)

    def w13_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        first, n = rows.span(rank)
        if n == 0:
            out.zero_()
            return
        src = stage_w13(ctx, layer, SCALE, rank, experts, n, u8, cols=h_p // SF, start=first)
        ratios = rescale(ctx) if rescale is not None else None
        if ratios is not None:  # staged [gate; up; zero row]
            r = ratios[experts.start : experts.stop].to(src.device)
            rescale_e4m3(src[:, :n], r[:, 1])
            rescale_e4m3(src[:, n : 2 * n], r[:, 0])
        L.gather_flat(src, sf13(n), out)

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        first, n = rows.span(rank)
        if n == 0:
            out.zero_()
            return
        src = stage_w2(
            ctx,
            layer,
            "weight",
            rank,
            experts,
            n // 2,
            i_p // 2,
            u8,
            padded_rows=h_p,
            start=first // 2,
        )
        L.gather_rows(src, rows2, out)

    def w2_s(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        first, n = rows.span(rank)
        if n == 0:
            out.zero_()
            return
        src = stage_w2(
            ctx,
            layer,
            SCALE,
            rank,
            experts,
            n // SF,
            i_p // SF,
            u8,
            padded_rows=h_p,
            start=first // SF,
        )
        L.gather_flat(src, sf2, out)

    lay = {"layout": "MajorK", "epilogue_tile_m": TILE, "packing": "e2m1x2"}
    s_lay = {"layout": "swizzled_128x4", "epilogue_tile_m": TILE, "block": [1, SF], "pad": 0}
    inter = {"row_order": w13_order(gated), "gated_interleave": gated}
    m13 = parts * i_p
    return [
        OutputTensor("w13_weight", "U8", (e, m13, h_p // 2), w13, {**lay, **inter}),
        OutputTensor("w2_weight", "U8", (e, h_p, i_p // 2), w2, lay),
        OutputTensor("w13_weight_scale", "F8_E4M3", (e, m13, h_p // SF), w13_s, {**s_lay, **inter}),
        OutputTensor("w2_weight_scale", "F8_E4M3", (e, h_p, i_p // SF), w2_s, s_lay),
    ]


def _cutlass(layer, e, h, i_r, i_p, apart: bool) -> list[OutputTensor]:
    """[up; gate] weights, w2 as loaded, and the block scales 128x4-swizzled per expert (the
    swizzle zero-pads rows to 128 and columns to 4). `apart` (`Layout.swizzle_apart`): where
    that swizzle pads, it is `w*_blockscale_swizzled` and `w*_weight_scale` holds the scales as
    loaded (w13's [up; gate]). Non-gated experts: w13 the up rows, zero-padded to `i_p` (the
    swizzle's rows), w2's columns and its scales' too (`i_p` is `i_r` for gated ones)."""
    swap = w13_index(layer.gated, i_r, i_p)
    m13 = layer.w13_parts * i_p
    u8 = torch.uint8

    def w13(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        src = stage_w13(ctx, layer, "weight", rank, experts, i_r, u8)
        L.gather_rows(src, swap, out)

    def w2(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        out.copy_(stage_w2(ctx, layer, "weight", rank, experts, i_r // 2, i_p // 2, u8))

    lay = {"layout": "MajorK", "packing": "e2m1x2"}
    order = {"row_order": w13_order(layer.gated)}
    return [
        OutputTensor("w13_weight", "U8", (e, m13, h // 2), w13, {**lay, **order}),
        OutputTensor("w2_weight", "U8", (e, h, i_p // 2), w2, lay),
        *_cutlass_scales("w13", e, m13, h // SF, _w13_scales(layer, i_r, swap), apart),
        *_cutlass_scales("w2", e, h, i_p // SF, _w2_scales(layer, i_r, i_p), apart),
    ]


Stage = Callable[[Ctx, int, range], torch.Tensor]


def _w13_scales(layer, i_r: int, swap: torch.Tensor) -> tuple[Stage, torch.Tensor]:
    """The rank's w13 scales staged ([gate; up; one zero row], non-gated [up; zero row]) and
    the rows to gather from them: `swap`'s ([up; gate], or the up rows and their padding),
    then the zero row."""

    def stage(ctx: Ctx, rank: int, experts: range) -> torch.Tensor:
        return stage_w13(ctx, layer, SCALE, rank, experts, i_r, torch.uint8)

    return stage, torch.cat([swap, torch.tensor([layer.w13_parts * i_r])])


def _w2_scales(layer, i_r: int, i_p: int) -> tuple[Stage, torch.Tensor]:
    """The rank's w2 scales staged ([H rows; one zero row], columns zero-padded to `i_p`'s)
    and the rows to gather: as is."""
    h = layer.hidden_size

    def stage(ctx: Ctx, rank: int, experts: range) -> torch.Tensor:
        n, n_p = i_r // SF, i_p // SF
        return stage_w2(ctx, layer, SCALE, rank, experts, n, n_p, torch.uint8, padded_rows=h + 1)

    return stage, torch.arange(h + 1)


def _cutlass_scales(
    w: str, e: int, m: int, ks: int, staged: tuple[Stage, torch.Tensor], apart: bool
) -> list[OutputTensor]:
    """One projection's block scales, [m, ks] a rank: `staged` gives the staged rows (the last
    one zeros) and the rows of the [m, ks] matrix among them. The swizzle is flat index
    `rows[q // ks] * ks + q % ks` for q the 128x4 swizzle index (its padding q = m*ks: the
    zero row). Apart (see `_cutlass`): the swizzle is `{w}_blockscale_swizzled` and
    `{w}_weight_scale` the gathered rows as loaded."""
    stage, rows = staged
    m_p, k_p = L.round_up(m, 128), L.round_up(ks, 4)
    swz = L.swizzle_128x4_index(m, ks)
    swz = rows[swz // ks] * ks + swz % ks

    def swizzled(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        L.gather_flat(stage(ctx, rank, experts), swz, out)

    def loaded(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
        L.gather_rows(stage(ctx, rank, experts), rows[:m], out.view(torch.uint8))

    s_lay = {"layout": "swizzled_128x4", "block": [1, SF], "pad": 0}
    if w == "w13":
        s_lay["row_order"] = "up_gate"
    if not apart or (m_p, k_p) == (m, ks):
        return [OutputTensor(f"{w}_weight_scale", "F8_E4M3", (e, m_p, k_p), swizzled, s_lay)]
    raw = {**s_lay, "layout": "MajorK"}
    del raw["pad"]
    return [
        OutputTensor(f"{w}_weight_scale", "F8_E4M3", (e, m, ks), loaded, raw),
        OutputTensor(f"{w}_blockscale_swizzled", "F8_E4M3", (e, m_p, k_p), swizzled, s_lay),
    ]


class _Scales:
    """Global and activation scales as vLLM holds them, and the warnings they call for."""

    def __init__(self, layer: ExpertLayer) -> None:
        self.layer = layer
        self.g_name, self.g_inv = _pick(layer, GLOBAL)
        self.a_name, self.a_inv = _pick(layer, ACT)
        self._cache: dict[str, torch.Tensor] = {}

    def _read(self, ctx: Ctx, role: str, name: str, inverted: bool) -> torch.Tensor:
        key = role + name
        if key not in self._cache:
            t = expert_scalars(ctx, self.layer, role, name)
            # compressed-tensors stores reciprocals; vLLM inverts them (an IEEE division)
            self._cache[key] = torch.ones((), dtype=torch.float32) / t if inverted else t
        return self._cache[key]

    def scale_2(self, ctx: Ctx, role: str) -> torch.Tensor:
        return self._read(ctx, role, self.g_name, self.g_inv)

    def act(self, ctx: Ctx, which: str) -> torch.Tensor:
        """0-dim: the max over all experts (for w13, over w1 and w3; non-gated, w1's)."""
        if which == "w13":
            roles = [r for r in self.layer.roles if r != "w2"]
            a = torch.cat([self._read(ctx, r, self.a_name, self.a_inv) for r in roles])
        else:
            a = self._read(ctx, "w2", self.a_name, self.a_inv)
        return a.max()

    def outputs(self, e: int, backend: Backend) -> list[OutputTensor]:
        s = self
        fns: dict[str, Callable[[Ctx], torch.Tensor]] = {
            "w13_input_scale": lambda c: s.act(c, "w13").expand(e),
            "w2_input_scale": lambda c: s.act(c, "w2").expand(e),
        }
        # Both backends' experts fold the input scales into the global weight scales in place
        # (vLLM 0.33 TrtLlmNvFp4Experts and FlashInferExperts.process_weights_after_loading), so
        # the folded products are what the layer holds as w13/w2_weight_scale_2.
        one = torch.ones((), dtype=torch.float32)
        g1 = lambda c: s.scale_2(c, "w1") * s.act(c, "w13")  # noqa: E731
        g2 = lambda c: s.scale_2(c, "w2") * s.act(c, "w2")  # noqa: E731
        a2_gscale = lambda c: one / s.act(c, "w2")  # noqa: E731  (make_nvfp4_moe_quant_config)
        fns |= {"w13_weight_scale_2": g1, "w2_weight_scale_2": g2}
        if backend is Backend.TRTLLM and not self.layer.gated:
            # _compute_g1_scale_c of non-gated experts: a2_gscale alone
            fns["g1_scale_c"] = lambda c: a2_gscale(c).expand(e)
        elif backend is Backend.TRTLLM:
            # _compute_g1_scale_c: g1_alphas * a2_gscale, a multiplication by the reciprocal
            fns["g1_scale_c"] = lambda c: g1(c) * a2_gscale(c)
        else:
            fns |= {
                "g1_alphas": g1,
                "g2_alphas": g2,
                "a1_gscale": lambda c: (one / s.act(c, "w13")).expand(e),
                "a2_gscale": lambda c: a2_gscale(c).expand(e),
            }

        def make(fn: Callable[[Ctx], torch.Tensor]):
            def produce(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
                out.copy_(fn(ctx))

            return produce

        lay = {"layout": "per_expert", "row_order": None}
        return [OutputTensor(n, "F32", (e,), make(f), lay, chunked=False) for n, f in fns.items()]

    def last_loaded(self, ctx: Ctx) -> torch.Tensor:
        """[E]: each expert's w1 or w3 input scale, whichever SGLang's loader reads last (it
        writes each into both columns of its w13_input_scale): it reads the shards in sorted
        order, each shard's tensors by sorted name."""
        w1 = self._read(ctx, "w1", self.a_name, self.a_inv)
        w3 = self._read(ctx, "w3", self.a_name, self.a_inv)

        def order(role: str, x: int) -> tuple[str, str]:
            info = self.layer.tensor(role, self.a_name, x)
            return str(info.file), info.name

        up = [order("w3", x) > order("w1", x) for x in range(self.layer.num_experts)]
        return torch.where(torch.tensor(up), w3, w1)

    def a13(self, ctx: Ctx) -> torch.Tensor:
        """0-dim float32: SGLang's w13 input scale, the max of the ones it loaded last."""
        return self.last_loaded(ctx).max().to(torch.float32)

    def loaded_alphas(self, ctx: Ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's GEMM1 alphas from the loaded scales: (a13 * s2(w1), a13 * s2(w3)), [E]."""
        f32 = torch.float32
        a13 = self.a13(ctx)
        return (a13 * self.scale_2(ctx, "w1")).to(f32), (a13 * self.scale_2(ctx, "w3")).to(f32)

    def sglang_alphas(self, ctx: Ctx, clamp: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """g1_alphas, g1_alphas_up as SGLang's processing leaves them: the loaded ones; with a
        SwiGLU clamp, where any expert's two differ, both max(g1, g1_up) for every expert."""
        g1, up = self.loaded_alphas(ctx)
        if clamp is None or not bool((g1 != up).any()):
            return g1, up
        shared = torch.maximum(g1, up)
        return shared, shared

    def block_scale_ratios(self, ctx: Ctx) -> torch.Tensor | None:
        """[E, 2] float32 (up, gate): what SGLang's clamp multiplies each half's w13 block
        scales by, g1_up / max(g1, g1_up) and g1 / max(g1, g1_up) where they differ, else 1;
        None where no expert's differ (it rescales nothing)."""
        g1, up = self.loaded_alphas(ctx)
        untied = g1 != up
        if not bool(untied.any()):
            return None
        shared = torch.maximum(g1, up)
        ratios = torch.stack([up, g1], dim=1)
        return torch.where(untied[:, None], ratios / shared[:, None], 1.0)

    def sglang_outputs(self, e: int, trt: bool, clamp: float | None = None) -> list[OutputTensor]:
        """The scalars as SGLang 0.5.23's ModelOpt NVFP4 method holds them (module doc), in the
        order its processing makes them; on TRT-LLM with a SwiGLU clamp `clamp`, the alphas
        tied (`sglang_alphas`) and gemm1_clamp_limit = clamp / g1_alphas; g1_scale_c on
        TRT-LLM only."""
        s = self
        f32 = torch.float32
        a13 = lambda c: s.last_loaded(c).unsqueeze(1).expand(e, 2)  # noqa: E731
        a2 = lambda c: s._read(c, "w2", s.a_name, s.a_inv)  # noqa: E731
        a2_max = lambda c: a2(c).max().to(f32)  # noqa: E731
        g1 = lambda c: s.sglang_alphas(c, clamp)[0]  # noqa: E731
        g1_up = lambda c: s.sglang_alphas(c, clamp)[1]  # noqa: E731
        a2_quant = lambda c: (1 / a2_max(c)).to(f32)  # noqa: E731
        fns: dict[str, tuple[Callable[[Ctx], torch.Tensor], tuple[int, ...]]] = {
            "w13_weight_scale_2": (
                lambda c: torch.stack([s.scale_2(c, "w1"), s.scale_2(c, "w3")], dim=1),
                (e, 2),
            ),
            "w2_weight_scale_2": (lambda c: s.scale_2(c, "w2"), (e,)),
            "w13_input_scale": (a13, (e, 2)),
            "w2_input_scale": (a2, (e,)),
            "g1_alphas": (g1, (e,)),
            "g1_alphas_up": (g1_up, (e,)),
            "g2_alphas": (lambda c: (a2_max(c) * s.scale_2(c, "w2")).to(f32), (e,)),
            "w13_input_scale_quant": (lambda c: (1 / s.a13(c)).to(f32), ()),
            "w2_input_scale_quant": (a2_quant, ()),
        }
        if trt and clamp is not None:
            fns["gemm1_clamp_limit"] = (lambda c: (clamp / g1(c)).to(f32), (e,))
        if trt:
            fns["g1_scale_c"] = (lambda c: (a2_quant(c) * g1_up(c)).to(f32), (e,))

        def make(fn: Callable[[Ctx], torch.Tensor]):
            def produce(ctx: Ctx, rank: int, experts: range, out: torch.Tensor) -> None:
                out.copy_(fn(ctx))

            return produce

        return [
            OutputTensor(
                n,
                "F32",
                shape,
                make(f),
                {"layout": "per_expert" if shape else "scalar", "row_order": None},
                chunked=False,
            )
            for n, (f, shape) in fns.items()
        ]

    def w1_w3_differ(self) -> list[int]:
        """Experts whose w1 and w3 global scales differ (read now, at planning; none for
        non-gated experts, which have no w3)."""
        if not self.layer.gated:
            return []
        files = SourceFiles()
        try:
            ctx = Ctx(files, torch.device("cpu"))
            w1, w3 = self.scale_2(ctx, "w1"), self.scale_2(ctx, "w3")
        finally:
            files.close()
        return torch.nonzero(w1 != w3).flatten().tolist()
