"""The scheme protocol and the pieces schemes share.

A scheme names the source tensors it needs, checks a layer against them, and plans a layer:
the output tensors (vLLM's fused-MoE parameter names), their per-rank shapes, and for each a
`produce` function that fills one chunk of experts of one tensor-parallel rank. The executor
(`fi_convert.pipeline`) owns reading order, chunking, devices and writing.

A scheme also holds every other fact about itself (`Scheme`'s attributes): what `inspect`
calls its source format, what converting to it does to a source's precision, the stand-in
layers `verify` plans a manifest's sizes with, and the synthetic sources of the tests. Adding
a scheme is adding its module and its line in `schemes/__init__.py`; what a server serves of
it is the server's fact (`fi_convert/servers/<name>/target.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from .. import dtypes, forms
from .. import layout as L
from ..errors import LayoutError, SchemeMismatchError, SourceError
from ..families import Form
from ..format.names import MANIFEST_NAME
from ..names import Backend, SchemeName
from ..source import Checkpoint, ExpertLayer
from ..st_io import SourceFiles, TensorInfo
from ..target import VLLM_LAYOUT, Layout


@dataclass
class Ctx:
    """What a `produce` function reads with and where it computes."""

    files: SourceFiles
    device: torch.device
    _free: list[torch.Tensor] = field(default_factory=list)
    _used: list[torch.Tensor] = field(default_factory=list)

    def stage(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host buffer to read source bytes into, valid until `release()`. Buffers are
        reused from chunk to chunk: fresh memory costs a page fault per 4 KiB on first touch,
        which on CPU took longer than reading and transforming the bytes."""
        n = math.prod(shape) * dtype.itemsize
        # by position: `list.remove` would compare tensors with `==`
        sizes = [b.numel() for b in self._free]
        fits = [k for k, size in enumerate(sizes) if size >= n]
        if fits:
            buf = self._free.pop(min(fits, key=sizes.__getitem__))
        else:
            if self._free:  # too small for this chunk: give it back rather than keep it
                self._free.pop(max(range(len(sizes)), key=sizes.__getitem__))
            # pinned for CUDA: the copy to the device then runs at full speed; the buffer is
            # reused only after the chunk's copy back to the host, which waits for it
            buf = torch.empty(n, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        self._used.append(buf)
        return buf[:n].view(dtype).view(shape)

    def release(self) -> None:
        """Every buffer `stage()` handed out is free again (the executor calls this once a
        chunk is produced and, on CUDA, copied to the device)."""
        self._free += self._used
        self._used.clear()

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)


# Every tensor's manifest entry has these keys (docs/FORMAT.md explains each).
LAYOUT_DEFAULTS: dict = {
    "layout": "MajorK",
    "epilogue_tile_m": None,
    "block_k_bytes": None,
    "row_order": "rows",
    "gated_interleave": False,
}

# produce(ctx, rank, experts, out): fill `out` ([len(experts), *rank_shape[1:]], on ctx.device)
Producer = Callable[[Ctx, int, range, torch.Tensor], None]


@dataclass
class OutputTensor:
    name: str  # vLLM fused-MoE parameter name, e.g. "w13_weight"
    dtype: str  # safetensors dtype name
    rank_shape: tuple[int, ...]  # shape one rank holds, experts first
    produce: Producer
    layout: dict = field(default_factory=dict)  # manifest description
    chunked: bool = True  # produced a chunk of experts at a time (False: whole, per rank)
    stage_nbytes: int = 0  # per expert, when producing reads more than it writes

    def __post_init__(self) -> None:
        self.layout = {**LAYOUT_DEFAULTS, **self.layout}

    @property
    def rank_nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.rank_shape)

    @property
    def expert_nbytes(self) -> int:
        return self.rank_nbytes // self.rank_shape[0] if self.rank_shape else self.rank_nbytes


@dataclass
class LayerPlan:
    prefix: str
    info: dict  # sizes and padding, for the manifest and `inspect`
    outputs: list[OutputTensor]
    source_names: list[str]
    source_bytes: int
    notes: list[str] = field(default_factory=list)  # warnings for the user; not errors


# make(shape, generator): one synthetic linear's tensors ({"weight": ..., "weight_scale": ...})
Maker = Callable[[tuple[int, int], torch.Generator], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Synthetic:
    """A synthetic source of a scheme's format (`fi_convert.testing.synthetic`): each expert
    linear's tensors, and config.json's `quantization_config`."""

    make: Maker | None  # None: the family makes the experts (gpt-oss's fused MXFP4 ones)
    quantization_config: dict | None = None
    dense_too: bool = False  # the other linears (attention, dense MLPs) in the format too


def compressed_tensors(format: str, weights: dict, activations: dict) -> dict:
    """A compressed-tensors `quantization_config` of one group over every Linear."""
    return {
        "quant_method": "compressed-tensors",
        "format": format,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": activations,
            }
        },
        "ignore": ["lm_head"],
    }


def modelopt(algo: str) -> dict:
    """A ModelOpt `quantization_config` (the synthetic writer adds its hf_quant_config.json)."""
    return {"quant_method": "modelopt", "quant_algo": algo}


class Scheme:
    """A scheme: its layouts (`plan_layer`) and every fact about it. Subclasses set `name`,
    `backends` (the FlashInfer backends it writes a layout for), `source_label`, `stand_ins`
    and `synthetic`, and implement `matches`, `check` and `plan_layer`."""

    name: SchemeName
    backends: tuple[Backend, ...]
    source_label: str  # what `inspect` calls its source format ("FP8")
    quantized = True  # its source format is quantized: converting BF16 to it quantizes
    # What of the source a plan depends on besides sizes, as (expert weight dtype, static
    # activation scales): one stand-in layer of each (`stand_in_layers`)
    stand_ins: tuple[tuple[str, bool], ...] = ()
    # the layer entry's `source_format` values it writes, where it records one
    source_formats: tuple[str, ...] = ()
    # Synthetic sources of its format by `Spec.quant` name (a variant: "fp8-tensor-ct")
    synthetic: ClassVar[dict[str, Synthetic]] = {}
    # The server layout variants it implements (`fi_convert.target.Layout` fields that a
    # server may ask to differ from vLLM's): `plan_layer` gets the server's `layout`
    variants: ClassVar[frozenset[str]] = frozenset()
    # it writes a layout of non-gated experts (w13 the up projection alone: Nemotron-H's
    # relu2_no_mul), proven against the server's own processing; else planning refuses them
    non_gated: ClassVar[bool] = False
    # the expert tensor forms it reads (`Form.kind`: "per_expert", "fused", ...); None: any
    form_kinds: ClassVar[tuple[str, ...] | None] = None

    def matches(self, ckpt: Checkpoint, layers: list[ExpertLayer]) -> bool:
        """Whether this scheme's source format is what the checkpoint holds (for `auto`)."""
        raise NotImplementedError

    def check(self, ckpt: Checkpoint, layer: ExpertLayer) -> None:
        """Raise a one-line error when the layer does not fit this scheme."""
        raise NotImplementedError

    def plan_layer(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        raise NotImplementedError

    def precision(self, source: Scheme | None) -> str:
        """What converting a checkpoint in `source`'s format to this scheme does to its values."""
        src = source.source_label if source else "the source"
        if source is not None and not source.quantized and self.quantized:
            return f"{src} -> {self.name.value} quantizes: loses precision"
        return f"{src} -> {self.name.value} keeps the source's bytes"

    def stand_in_layers(
        self, prefix: str, e: int, h: int, i: int, *, gated: bool = True
    ) -> list[ExpertLayer]:
        """Layers as `find_family` gives them, one for each source format of `stand_ins`:
        names and dtypes of the experts' tensors, no data (`plan_stand_in` reads none);
        `gated` False: non-gated experts (w1 the up projection, no w3)."""
        roles = {"w1": "w1", "w3": "w3", "w2": "w2"} if gated else {"w1": "w1", "w2": "w2"}
        per_expert = Form("per_expert", re.compile(""), roles)
        layers = []
        for dtype, act in self.stand_ins:
            params = {}
            for x in range(e):
                for r in forms.roles(per_expert):
                    params[(r, "weight", x)] = stand_in(prefix, f"{x}.{r}.weight", dtype)
                    if act:
                        name = f"{x}.{r}.input_scale"
                        params[(r, "input_scale", x)] = stand_in(prefix, name, "F32")
            layers.append(ExpertLayer(prefix, per_expert, e, h, i, params))
        return layers

    def plan_stand_in(
        self, layer: ExpertLayer, backend: Backend, tp: int, *, layout: Layout = VLLM_LAYOUT
    ) -> LayerPlan:
        """`plan_layer` of a stand-in layer, which has no data to read."""
        return self.plan_layer(layer, backend, tp, layout=layout)


def stand_in(prefix: str, name: str, dtype: str) -> TensorInfo:
    """A stand-in layer's tensor: a name and a dtype, no data."""
    return TensorInfo(f"{prefix}.{name}", dtype, (), 0, 0, Path(MANIFEST_NAME))


# ---------------------------------------------------------------- shared checks and helpers


def weight_dtype(layer: ExpertLayer) -> str | None:
    """The dtype of the experts' `weight` tensors (None for gpt-oss `*_blocks` experts)."""
    try:
        return layer.tensor("w1", "weight", 0).dtype
    except KeyError:
        return None


def first_name(layer: ExpertLayer) -> str:
    """The tensor to name in a message about the whole layer: expert 0's gate weight."""
    try:
        return layer.tensor("w1", "weight", 0).name
    except KeyError:
        return layer.source_names()[0]


def ct_fp8_strategy(config: dict | None) -> str | None:
    """The strategy of compressed-tensors' FP8 weights in config.json's `quantization_config`
    ("tensor", "channel", "block"), or None for another format."""
    qc = (config or {}).get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return None
    groups = qc.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        w = group.get("weights") if isinstance(group, dict) else None
        if isinstance(w, dict) and (w.get("num_bits"), w.get("type")) == (8, "float"):
            return w.get("strategy")
    return None


def unread_fp8(layer: ExpertLayer, config: dict | None = None) -> str | None:
    """Why no scheme reads the layer's FP8 experts, or None: E4M3 weights whose `weight_scale`
    is neither one per tensor (fp8-tensor) nor UE8M0 per 32 (mxfp8), as compressed-tensors'
    block strategy (a scale per 128x128 block: LLM Compressor's FP8_BLOCK, poolside/Laguna-
    XS.2-FP8) and its channel strategy (one per output row) write them: told by config.json's
    strategy (`config`), else by the scale's shape."""
    names = layer.param_names()
    if weight_dtype(layer) != "F8_E4M3" or "weight_scale" not in names:
        return None
    if "weight_scale_inv" in names:
        return None
    try:
        w, s = layer.tensor("w1", "weight", 0), layer.tensor("w1", "weight_scale", 0)
    except KeyError:
        return None
    strategy = ct_fp8_strategy(config)
    (n, k), got = w.shape[-2:], tuple(s.shape[-2:])
    if strategy == "block" or got == (-(-n // 128), -(-k // 128)) != (1, 1):
        what = "a weight_scale per 128x128 block (compressed-tensors' block strategy)"
    elif strategy == "channel" or (n > 1 and tuple(s.shape[-2:]) in ((n, 1), (1, n))):
        what = "a weight_scale per output channel (compressed-tensors' channel strategy)"
    elif s.dtype in ("U8", "F8_E8M0") or math.prod(s.shape) == 1:
        return None
    else:
        what = f"a weight_scale of shape {list(s.shape)}"
    return (
        f"{s.name}: FP8 experts with {what}, a source format no scheme of fi-convert reads "
        "yet (fp8-block reads DeepSeek's weight_scale_inv per 128x128 block, fp8-tensor one "
        "weight_scale per tensor); serve the checkpoint as it is"
    )


def refuse_other_format(layer: ExpertLayer, this: str, config: dict | None = None) -> None:
    """A clear error when the experts are in a format another scheme reads, or none does
    (`config`: config.json, whose quantization_config may tell)."""
    if why := unread_fp8(layer, config):
        raise SchemeMismatchError(why)
    dt = weight_dtype(layer)
    other = None
    if dt is None:
        other = "mxfp4"
    elif dt == "U8":
        other = "nvfp4"
    elif dt == "F8_E4M3":
        names = layer.param_names()
        if "weight_scale_inv" in names:
            other = "fp8-block"
        elif "weight_scale" in names:
            s = next(t for (_, p, _), t in layer.params.items() if p == "weight_scale")
            other = "mxfp8" if s.dtype in ("U8", "F8_E8M0") else "fp8-tensor"
    if other and other != this:
        raise SchemeMismatchError(
            f"{first_name(layer)}: the experts are in the {other} source format, which "
            f"--scheme {this} does not read; use --scheme {other} (or --scheme auto)"
        )


def require_dtype(layer: ExpertLayer, param: str, allowed: tuple[str, ...], fix: str) -> None:
    for (_, p, _), info in layer.params.items():
        if p == param and info.dtype not in allowed:
            raise SchemeMismatchError(
                f"{info.name}: dtype {info.dtype}, this scheme needs {' or '.join(allowed)}; {fix}"
            )


def require_param(layer: ExpertLayer, param: str, what: str) -> None:
    if not forms.per_expert(layer.form):
        for role in forms.stored_roles(layer.form):
            if (role, param, -1) not in layer.params:
                w = layer.params[(role, "weight", -1)].name
                raise SourceError(f"{w}: no {param} beside it; {what}")
        return
    for e in range(layer.num_experts):
        for r in forms.stored_roles(layer.form):
            if (r, param, e) not in layer.params:
                w = layer.params[(r, "weight", e)].name
                raise SourceError(f"{w}: no {w.rsplit('.', 1)[0]}.{param} beside it; {what}")


def require_shapes(layer: ExpertLayer, param: str, w13: tuple, w2: tuple) -> None:
    """Every expert's w1/w3 `param` has shape `w13` and w2 has `w2` (fused: per half; a
    stored tensor as its form keeps them, fi_convert/forms.py)."""
    if not forms.per_expert(layer.form):
        for role in forms.stored_roles(layer.form):
            matrix = w2 if role == "w2" else w13
            want = forms.stored_shape(layer.form, role, layer.num_experts, tuple(matrix))
            info = layer.params[(role, param, -1)]
            if info.shape != want:
                raise SourceError(f"{info.name}: shape {list(info.shape)}, expected {list(want)}")
        return
    for e in range(layer.num_experts):
        for r in forms.stored_roles(layer.form):
            info = layer.params[(r, param, e)]
            want = forms.stored_shape(layer.form, r, 1, tuple(w2 if r == "w2" else w13))
            if info.shape != want:
                raise SourceError(
                    f"{info.name}: shape {list(info.shape)}, expected {list(want)} "
                    "(from expert 0 and config.json); the checkpoint is inconsistent"
                )


def layer_plan(
    layer: ExpertLayer,
    outs: list[OutputTensor],
    i_r: int,
    i_p: int,
    *,
    h_p: int | None = None,
    notes: list[str] | None = None,
    **info: object,
) -> LayerPlan:
    """A layer's plan: its outputs, and its manifest entry, which starts with the sizes every
    scheme records (docs/FORMAT.md) and goes on with the scheme's own `info`."""
    sizes: dict = {
        "num_experts": layer.num_experts,
        "hidden_size": layer.hidden_size,
        "padded_hidden_size": h_p if h_p is not None else layer.hidden_size,
        "intermediate_size": layer.intermediate_size,
        "intermediate_size_per_rank": i_r,
        "padded_intermediate_size_per_rank": i_p,
    }
    if not layer.gated:  # w13 is the up projection alone (written for non-gated layers only)
        sizes["gated"] = False
    nbytes = sum(t.nbytes for t in layer.params.values())
    return LayerPlan(
        layer.prefix, {**sizes, **info}, outs, layer.source_names(), nbytes, notes or []
    )


@dataclass(frozen=True)
class RankRows:
    """Which rows of the intermediate size I (of w1/w3; columns of w2) each TP rank holds,
    before the rank's tensors are padded to `padded` rows (`fi_convert.target.Layout.
    shard_padded`): split evenly, rank r holding [r*I/TP, (r+1)*I/TP) (vLLM); or by the padded
    size, rank r holding [r*padded, (r+1)*padded) of I, as many rows as there are (SGLang on
    TRT-LLM: the last ranks may hold fewer, or none)."""

    size: int  # I
    tp: int
    padded: int  # the rows a rank holds after padding
    by_padded: bool = False

    def span(self, rank: int) -> tuple[int, int]:
        """(first row, row count) of rank `rank`."""
        if not self.by_padded:
            return rank * (self.size // self.tp), self.size // self.tp
        first = min(rank * self.padded, self.size)
        return first, min(self.padded, self.size - first)

    def info(self) -> dict:
        """The layer entry's record of the split: `tp_split` "padded" only where some rank's
        rows are not the even split's (never at TP 1, nor where I/TP needs no padding)."""
        even = RankRows(self.size, self.tp, self.padded)
        differs = any(self.span(r) != even.span(r) for r in range(self.tp))
        return {"tp_split": "padded"} if differs else {}


def per_rank(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise LayoutError(
            f"{what} {size} is not divisible by --tp-size {tp}; vLLM cannot split it either - "
            "choose a tp size that divides it"
        )
    return size // tp


def last_loaded(layer: ExpertLayer, param: str, roles: tuple[str, str]) -> torch.Tensor:
    """[E] bool: whether each expert's `param` of roles[1] is read after roles[0]'s by SGLang
    0.5.23's default loader, which reads the shards in sorted order and each shard's tensors
    by sorted name (where its loader keeps one value for both, the last one read stays)."""

    def order(role: str, e: int) -> tuple[str, str]:
        info = layer.tensor(role, param, e)
        return str(info.file), info.name

    a, b = roles
    return torch.tensor([order(b, e) > order(a, e) for e in range(layer.num_experts)])


def expert_scalars(ctx: Ctx, layer: ExpertLayer, role: str, param: str) -> torch.Tensor:
    """[E]: every expert's one-value `param` of `role` (per-tensor and global scales)."""
    infos = [layer.tensor(role, param, e) for e in range(layer.num_experts)]
    return torch.stack([ctx.files.read(i).reshape(()) for i in infos])


def require_multiples(layer: ExpertLayer, sizes: dict[str, int], block: int, why: str) -> None:
    """A LayoutError for the first size that is not a multiple of `block`."""
    for what, size in sizes.items():
        if size % block:
            raise LayoutError(f"{layer.prefix}: {what} {size} is not a multiple of {block}; {why}")


def stage_w13(
    ctx: Ctx,
    layer: ExpertLayer,
    param: str,
    rank: int,
    experts: range,
    rows: int,
    torch_dtype: torch.dtype,
    *,
    cols: int | None = None,
    pad: float = 0,
    start: int | None = None,
) -> torch.Tensor:
    """[n, 2*rows + 1, cols] on ctx.device: this rank's gate rows, its up rows, one pad row
    (non-gated experts: [n, rows + 1, cols], the up rows and the pad row; `w13_index`).

    The rank's rows start at `rank * rows` (an even split), or at `start` (`RankRows`).
    Columns past the checkpoint's K (when `cols` is larger) and the last row hold `pad`.
    """
    k = layer.proj_shape("w1", param)[1]
    cols = cols or k
    parts = layer.w13_parts
    buf = ctx.stage((len(experts), parts * rows + 1, cols), torch_dtype)
    first = rank * rows if start is None else start
    span = (first, first + rows)
    layer.read(ctx.files, "w1", param, experts, span, None, buf[:, :rows, :k])
    if parts == 2:
        layer.read(ctx.files, "w3", param, experts, span, None, buf[:, rows : 2 * rows, :k])
    buf[:, parts * rows].fill_(pad)
    if cols > k:
        buf[:, :, k:].fill_(pad)
    return ctx.to_device(buf)


def w13_index(
    gated: bool,
    n: int,
    padded: int,
    *,
    swap: bool = True,
    interleave: bool = False,
    tile: int | None = None,
) -> torch.Tensor:
    """The row index of a rank's w13 from what `stage_w13` staged (n rows of each projection,
    then a zero row): each projection padded to `padded` rows; for gated experts [gate; up]
    made [up; gate] where `swap` and gate/up rows interleaved where `interleave`; FlashInfer's
    row shuffle of `tile` where given. A non-gated w13 is the up projection alone: nothing
    to swap or interleave, whatever the backend does for gated ones (vLLM 0.33 skips both
    where `is_act_and_mul` is False)."""
    parts = 2 if gated else 1
    steps = [L.pad_halves_index(n, padded, zero_row=parts * n, parts=parts)]
    if gated and swap:
        steps.append(L.swap_halves_index(2 * padded))
    if gated and interleave:
        steps.append(L.gated_interleave_index(2 * padded))
    if tile is not None:
        steps.append(L.shuffle_row_index(parts * padded, tile))
    return L.compose(*steps)


def w13_order(gated: bool, swap: bool = True) -> str:
    """A w13 tensor's `row_order` in the manifest: "up_gate", "gate_up", or "up" (non-gated)."""
    return ("up_gate" if swap else "gate_up") if gated else "up"


def stage_w2(
    ctx: Ctx,
    layer: ExpertLayer,
    param: str,
    rank: int,
    experts: range,
    cols: int,
    padded_cols: int,
    torch_dtype: torch.dtype,
    *,
    padded_rows: int | None = None,
    pad: float = 0,
    start: int | None = None,
) -> torch.Tensor:
    """[n, padded_rows, padded_cols] on ctx.device: this rank's columns of w2, padded with `pad`.

    The rank's columns start at `rank * cols` (an even split), or at `start` (`RankRows`)."""
    h, k = layer.proj_shape("w2", param)
    rows = padded_rows or h
    buf = ctx.stage((len(experts), rows, padded_cols), torch_dtype)
    first = rank * cols if start is None else start
    span = None if (first, cols) == (0, k) else (first, first + cols)
    layer.read(ctx.files, "w2", param, experts, (0, h), span, buf[:, :h, :cols])
    if padded_cols > cols:
        buf[:, :, cols:].fill_(pad)
    if rows > h:
        buf[:, h:].fill_(pad)
    return ctx.to_device(buf)


def quant_algo(ckpt: Checkpoint) -> str | None:
    """The checkpoint's quantization format, upper-cased: ModelOpt `quant_algo` (from
    hf_quant_config.json or config.json) or else `quant_method` (fp8, mxfp4, ...)."""
    q = ckpt.quant_config or {}
    inner = q["quantization"] if isinstance(q.get("quantization"), dict) else {}
    algo = inner.get("quant_algo") or q.get("quant_algo") or q.get("quant_method")
    return str(algo).upper() if algo else None


def flat_swizzled_index(rows: torch.Tensor, ks: int) -> torch.Tensor:
    """One flat index: gather rows `rows` of a [R, ks] scale matrix, then 128x4-swizzle.

    The gathered matrix must have a multiple of 128 rows and ks % 4 == 0 (no swizzle padding).
    """
    m = rows.numel()
    if m % 128 or ks % 4:
        raise ValueError(
            f"scale swizzle without padding needs M % 128 == 0 and K % 4 == 0: {m}, {ks}"
        )
    swz = L.swizzle_128x4_index(m, ks)
    return rows[swz // ks] * ks + swz % ks
