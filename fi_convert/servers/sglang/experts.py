"""Put one rank's converted experts into an SGLang FusedMoE layer (0.5.20-0.5.23), then set up
its kernel only.

SGLang allocates each expert parameter at its final (padded, per-rank) size, so each tensor is
read from the shards (this rank's byte range) straight into the parameter's own storage, then
viewed in the stored shape. SGLang has no "weights already processed" mode, and its
`process_weights_after_loading` is not run: `finish` leaves the state it would leave on the
layer and its method, with SGLang's own functions, and transforms nothing. The tests compare
every parameter and every attribute with SGLang's own loading and processing of the source.
Each method's setup follows SGLang 0.5.23's processing (the line numbers below are its); where
an older release's differs, `older_releases` reads the difference from the installed release.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...bulk_read import BulkRead
from ...format.reader import OutputReader
from . import older_releases
from .checks import PluginError


def install(
    layer: Any, reader: OutputReader, prefix: str, tp_rank: int, bulk: BulkRead | None = None
) -> list[str]:
    """Read the layer's tensors for `tp_rank` into `layer`'s parameters (in place: no new
    memory); returns their names. Under expert parallelism, each tensor's slices of this EP
    rank's experts instead (`local_experts`; `rank_experts` says which tensors are sliced).
    With `bulk`, the bytes are read when `bulk` runs (with every other layer's); without, now."""
    now = bulk or reader.bulk(next(layer.parameters()).device)
    ids = local_experts(layer, reader.root)
    method = type(layer.quant_method).__name__
    retyped, derived = RETYPED.get(method, ()), DERIVED.get(method, ())
    resized = RESIZED.get(method, ())
    new = new_shapes(layer)
    loaded = []
    for name in reader.layer(prefix)["tensors"]:
        param = layer._parameters.get(name)
        _, shape, dtype = reader.info(prefix, name)
        sliced = rank_experts(ids, param, shape, layer.num_experts)
        if sliced is not None:
            shape = (len(sliced), *shape[1:])
        if param is None and name in derived and not hasattr(layer, name):
            # what processing makes from the loaded scalars: a new parameter (as there), of
            # the output's size (this rank's experts'), read into
            device = next(layer.parameters()).device
            param = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device), False)
            layer.register_parameter(name, param)
        if param is None:
            raise PluginError(
                f"{reader.root}: layer {prefix}: SGLang's {type(layer.quant_method).__name__} "
                f"has no parameter {name}; convert the source again for SGLang"
            )
        data = _storage(layer, param, name, (tuple(shape), dtype), reader, new, retyped, resized)
        if data.dtype != dtype or data.numel() != math.prod(shape) or not data.is_contiguous():
            raise PluginError(
                f"{reader.root}: layer {prefix}: {name} is {dtype} {list(shape)} in the output, "
                f"SGLang allocated {data.dtype} {list(data.shape)}; convert the source again "
                "for SGLang"
            )
        if sliced is None:
            reader.read_into(prefix, name, tp_rank, data, bulk=now)
        else:
            reader.read_experts_into(prefix, name, sliced, data, bulk=now, tp_rank=tp_rank)
        param.data = data.view(shape)
        loaded.append(name)
    if bulk is None:
        now.run()
    return loaded


def rank_experts(
    ids: list[int] | None, param: Any, shape: tuple[int, ...], num_experts: int
) -> list[int] | None:
    """The experts of an output tensor (its per-rank `shape`) an EP rank reads: `ids`, for a
    tensor of one row per expert; None (the whole tensor) without EP, for a value shared by
    all experts, and for a parameter SGLang keeps for every expert on every rank
    (`_sglang_require_global_experts`: ModelOpt NVFP4's input scales, which its processing
    reduces over all experts)."""
    if ids is None or not shape or shape[0] != num_experts:
        return None
    if getattr(param, "_sglang_require_global_experts", False):
        return None
    return ids


def local_experts(layer: Any, root: Any) -> list[int] | None:
    """Under expert parallelism, the global experts this EP rank holds, in the order of its
    local slots, by SGLang's own map (`FusedMoE._map_global_expert_id_to_local_expert_id`, which
    its weight loader applies: rank r holds [r*E/N, (r+1)*E/N)); where SGLang has an expert
    location (the server's, `--init-expert-location`), the logical experts it puts in those
    physical slots must be the same. None without EP."""
    if layer.moe_ep_size == 1:
        return None
    slots = {}
    for g in range(layer.num_experts):
        local = layer._map_global_expert_id_to_local_expert_id(g)
        if local >= 0:
            slots[local] = g
    n = layer.num_local_experts
    if sorted(slots) != list(range(n)) or layer.num_fused_shared_experts:
        raise PluginError(
            f"{root}: layer {layer.layer_name}: SGLang's expert map gives EP rank "
            f"{layer.moe_ep_rank} slots {sorted(slots)} for {n} local experts (fused shared "
            "or redundant experts?); start SGLang with --disable-shared-experts-fusion and "
            "without --enable-eplb"
        )
    ids = [slots[j] for j in range(n)]
    placed = _placed(layer, ids)
    if placed is not None and placed != ids:
        raise PluginError(
            f"{root}: layer {layer.layer_name}: SGLang places logical experts {placed} in EP "
            f"rank {layer.moe_ep_rank}'s slots, not {ids}; start SGLang without "
            "--init-expert-location and --enable-eplb"
        )
    return ids


def _placed(layer: Any, ids: list[int]) -> list[int] | None:
    """The logical experts SGLang's expert location (where it has one, as a server does) puts
    in the physical slots `ids` of the layer (its weight loader reads each logical expert into
    the physical slots `logical_to_all_physical` gives); None where it has none."""
    from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

    # (SGLang 0.5.23 marks the layers that use it; before, every layer's loader did)
    meta = (
        get_global_expert_location_metadata()
        if getattr(layer, "uses_expert_location", True)
        else None
    )
    if meta is None:
        return None
    row = meta.physical_to_logical_map[layer.layer_id].tolist()
    return [int(row[p]) if p < len(row) else -1 for p in ids]


def new_shapes(layer: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The parameters the layer's method's processing replaces by new storage of another size:
    their final (shape, dtype). SGLang's gpt-oss MXFP4 on SM90 (`Mxfp4MoEMethod.
    _process_weights_for_sm90_cutlass`) allocates them unpadded and makes each anew: I per rank
    padded to `_padded_intermediate` (N), H to `_padded_hidden` (K); weights [E, rows, K/2],
    scales folded [E, rows/64, K/128, 16, 16] (uint8), biases in the allocated dtype."""
    method = layer.quant_method
    if type(method).__name__ != "Mxfp4MoEMethod" or method._fi_kernel != "cutlass_sm90":
        return {}
    e, n, k = layer.num_local_experts, method._padded_intermediate, method._padded_hidden
    u8, bias = torch.uint8, layer.w13_weight_bias.dtype
    return {
        "w13_weight": ((e, 2 * n, k // 2), u8),
        "w13_weight_scale": ((e, 2 * n // 64, k // 128, 16, 16), u8),
        "w13_weight_bias": ((e, 2 * n), bias),
        "w2_weight": ((e, k, n // 2), u8),
        "w2_weight_scale": ((e, k // 64, n // 128, 16, 16), u8),
        "w2_weight_bias": ((e, k), bias),
    }


def _storage(
    layer: Any, param: Any, name: str, got: tuple, reader: Any, new: dict, retyped, resized
) -> torch.Tensor:
    """Where the output's `name` is read into: the parameter's own storage, or new storage
    where processing makes the parameter anew, the allocated one dropped first (so no more
    memory is held than SGLang's own processing holds)."""
    shape, dtype = got
    if name in new:
        return _resized(layer, param, name, new[name], got, reader)
    size, (was, was_dtype, was_size) = math.prod(shape), _form(param.data)
    if name in retyped and was_dtype != dtype and was_size == size:
        # processing gives it another dtype: the output holds it in that dtype
        return _fresh(param, was, dtype)
    if name in resized and was_dtype == dtype and was_size != size:
        # processing gives it another size (padded, or reduced to one value)
        return _fresh(param, shape, dtype)
    return param.data


def _form(t: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, int]:
    """A tensor's shape, dtype and size (no reference to its storage kept)."""
    return tuple(t.shape), t.dtype, t.numel()


def _fresh(param: Any, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """New storage of `shape`, `dtype` for `param`, its allocated storage dropped first."""
    device = param.data.device
    param.data = torch.empty(0, dtype=param.dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _resized(layer: Any, param: Any, name: str, want: tuple, got: tuple, reader: Any) -> Any:
    """New storage of the size processing gives `name`, the allocated one dropped first (so no
    more memory is held than SGLang's own processing holds); refused where the output's size
    is not that."""
    if got != want:
        raise PluginError(
            f"{reader.root}: layer {layer.layer_name}: {name} is {got[1]} {list(got[0])} in the "
            f"output, SGLang's processing makes {want[1]} {list(want[0])}; convert the source "
            "again for SGLang"
        )
    return _fresh(param, want[0], want[1])


def finish(layer: Any) -> None:
    """Kernel setup only: the state the layer's method's `process_weights_after_loading` leaves
    (SGLang 0.5.23's, or an older release's where it differs: older_releases), without its
    transforms. By method class name."""
    method = layer.quant_method
    setup = KERNEL_ONLY.get(type(method).__name__)
    if setup is None:
        raise PluginError(f"{layer.layer_name}: no kernel setup for {type(method).__name__}")
    setup(layer, method)


def _as_loaded(layer: Any) -> None:
    """What SGLang's expert weight loader (`FusedMoE.weight_loader`) leaves on its way: this
    cached property, evaluated."""
    layer.use_padded_loading  # noqa: B018


def _unquantized(layer: Any, method: Any) -> None:
    """UnquantizedFusedMoEMethod.process_weights_after_loading (SGLang 0.5.23, unquant.py:852)
    on FlashInfer's runners, where its other branches (aiter, AMX, DeepEP/MORI dispatchers,
    NPU, Triton's SwiGLU interleave) do not apply: CUTLASS's SwiGLU parameters, by SGLang's own
    function; TRT-LLM's BlockMajorK weights are the output's as read (SGLang packs only weights
    of the allocated canonical shape), and its cache of FlashInfer's row permutations, by its
    own function, holds what its packing leaves there."""
    _as_loaded(layer)
    if method.use_flashinfer_cutlass:
        older_releases.cutlass_swiglu_params(layer)
    if method.use_flashinfer_trtllm_moe:
        method._cache_permute_indices.clear()
        for name in ("w13_weight", "w2_weight"):
            rows = older_releases.bf16_canonical_rows(layer, method, name)
            # one expert's bytes as the [rows, bytes per row] tile SGLang permutes (a view)
            tile = getattr(layer, name).data[0].view(torch.uint8).reshape(rows, -1)
            older_releases.bf16_row_permutation(layer, method, name, tile)


def _fp8_block(layer: Any, method: Any) -> None:
    """Fp8MoEMethod.process_weights_after_loading (SGLang 0.5.23, fp8.py:2610) for DeepSeek
    block FP8 on FlashInfer TRT-LLM, where `process_weights_after_loading_block_quant`
    transforms nothing (its DeepGEMM UE8M0 requantization is for the DeepGEMM runner only; the
    AMD, FP4-expert and MXFP8 branches do not apply): the TRT-LLM SwiGLU parameters, by its own
    function, and the dispatcher's quantization config, as it sets them."""
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    if not method.block_quant:
        raise PluginError(f"{layer.layer_name}: Fp8MoEMethod is not block-quantized here")
    _as_loaded(layer)
    backend = get_moe_runner_backend()
    trtllm = backend.is_flashinfer_trtllm() or backend.is_flashinfer_trtllm_routed()
    if method.use_mxfp8:
        # _process_mxfp8_moe_weights for an MXFP8 checkpoint on TRT-LLM: the weights and
        # scales are the output's (interleaved, shuffled, swizzled), in the parameters SGLang
        # allocated; what it leaves besides
        if not trtllm or not method.quant_config.is_checkpoint_fp8_serialized:
            raise PluginError(
                f"{layer.layer_name}: the SGLang plugin loads MXFP8 checkpoints on FlashInfer "
                "TRT-LLM only"
            )
        layer.w13_weight_scale_inv.format_ue8m0 = True
        layer.w2_weight_scale_inv.format_ue8m0 = True
        layer.w13_input_scale = None
        layer.w2_input_scale = None
    if trtllm and method._owns_moe_runner:
        method._prepare_flashinfer_trtllm_activation_params(layer)
    if hasattr(layer, "dispatcher"):
        quant = getattr(getattr(layer, "w13_kernel", None), "DISPATCHER_QUANT_CONFIG", None)
        layer.dispatcher.set_quant_config(
            quant
            if quant is not None
            else {"weight_dtype": layer.w13_weight.dtype, "use_mxfp8": method.use_mxfp8}
        )


def _mxfp4(layer: Any, method: Any) -> None:
    """Mxfp4MoEMethod.process_weights_after_loading (SGLang 0.5.23, mxfp4.py:635) for gpt-oss
    MXFP4 on `flashinfer_mxfp4`, on SM100 (FlashInfer TRT-LLM) or SM90 (`_mxfp4_sm90`), without
    its transforms (the pair swap, row shuffles and scale swizzle are the output's bytes): the
    SwiGLU constants it makes from the layer's config, one per local expert, as it makes them
    (inline code there, no function of its own to call); each expert parameter replaced, as it
    replaces them, by a new Parameter (without the loader's attributes) on the same bytes, the
    scales viewed as float8_e4m3fn; the biases are float32 already (`install` read them so).
    (SGLang's gpt-oss loader, `GptOssForCausalLM._load_mxfp4_experts_weights`, copies into the
    parameters itself: `use_padded_loading` stays unevaluated.)"""
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    kernel = method._fi_kernel
    if kernel not in ("trtllm_sm100", "cutlass_sm90") or method.use_marlin or method.use_mega_moe:
        raise PluginError(
            f"{layer.layer_name}: Mxfp4MoEMethod does not run FlashInfer TRT-LLM (SM100) or "
            "CUTLASS (SM90) here (--moe-runner-backend flashinfer_mxfp4, no Marlin or MegaMoE)"
        )
    if method._use_sm90_humming:
        raise PluginError(
            f"{layer.layer_name}: SGLang runs gpt-oss MXFP4 with FP8 activations here (Humming), "
            "which rewrites the weights; start SGLang without --flashinfer-mxfp4-moe-precision fp8"
        )
    if get_moe_a2a_backend().is_mori() and hasattr(layer, "dispatcher"):
        layer.dispatcher.set_quant_config({})
    if kernel == "cutlass_sm90":
        _mxfp4_sm90(layer)
        return
    e = layer.num_local_experts
    _swiglu_parameters(layer, ("gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit"))
    layer._situ_routing_bias_bf16 = None
    for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
        data = getattr(layer, name).data
        if name.endswith("scale"):
            data = data.view(torch.float8_e4m3fn)
        setattr(layer, name, torch.nn.Parameter(data, requires_grad=False))
    for name in ("w13_weight_bias", "w2_weight_bias"):
        data = getattr(layer, name).data.reshape(e, -1)
        setattr(layer, name, torch.nn.Parameter(data, requires_grad=False))


def _swiglu_parameters(layer: Any, names: tuple[str, str, str]) -> None:
    """The SwiGLU constants SGLang's gpt-oss MXFP4 processing makes from the layer's config,
    under `names` (SM100: gemm1_*, SM90: swiglu_*): alpha (the config's, or 1.702), beta 1.0
    and limit (the config's clamp, or 7.0), each a float32 Parameter, one per local expert."""
    cfg = layer.moe_runner_config
    alpha = getattr(cfg, "gemm1_alpha", None) or 1.702
    limit = getattr(cfg, "gemm1_clamp_limit", None) or 7.0
    e, device = layer.num_local_experts, layer.w13_weight.device
    for name, value in zip(names, (alpha, 1.0, limit), strict=True):
        t = torch.full((e,), value, dtype=torch.float32, device=device)
        setattr(layer, name, torch.nn.Parameter(t, requires_grad=False))


def _mxfp4_sm90(layer: Any) -> None:
    """`Mxfp4MoEMethod._process_weights_for_sm90_cutlass` (SGLang 0.5.23, mxfp4.py:1138) with
    BF16 activations, without its transforms (the de-interleave, padding, weight interleave and
    scale fold are the output's bytes, `install` read them into storage of the final sizes):
    the SwiGLU constants it makes from the layer's config (swiglu_alpha: the config's alpha or
    1.702, swiglu_beta 1.0, swiglu_limit: the config's limit or 7.0; float32, one per local
    expert), and each expert parameter replaced, as it replaces them, by a new Parameter
    (without the loader's attributes) on the same bytes, the scales uint8."""
    _swiglu_parameters(layer, ("swiglu_alpha", "swiglu_beta", "swiglu_limit"))
    for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
        setattr(layer, name, torch.nn.Parameter(getattr(layer, name).data, requires_grad=False))
    for name in ("w13_weight_bias", "w2_weight_bias"):
        setattr(layer, name, torch.nn.Parameter(getattr(layer, name).data, requires_grad=False))


def _nvfp4(layer: Any, method: Any) -> None:
    """ModelOptNvFp4FusedMoEMethod.process_weights_after_loading (SGLang 0.5.23,
    modelopt_quant.py:2712) for ModelOpt NVFP4 on FlashInfer TRT-LLM or CUTLASS, gated SiLU
    (on TRT-LLM without a SwiGLU alpha; a clamp, as DeepSeek's `swiglu_limit`, rescales block
    scales and makes gemm1_clamp_limit there, the output's; on CUTLASS it changes only
    `_cutlass_swiglu_params`), static input scales, without its
    transforms (the weights and block scales are the output's, reordered, shuffled and
    swizzled; its scalars, the alphas, the inverse input scales and TRT-LLM's g1_scale_c, are
    the output's, `install` made their parameters): CUTLASS's SwiGLU parameters, by its own
    function; the dispatcher's quantization config, as it sets it (with its own functions
    deciding FP4 dispatch); the block-scale aliases the kernels read (CUTLASS: the swizzle it
    writes in place, aliased as TRT-LLM's is, or where it pads, apart: `_blockscale_aliases`);
    TRT-LLM's padded sizes."""
    from sglang.srt.layers.moe.utils import should_use_flashinfer_cutlass_moe_fp4_allgather
    from sglang.srt.layers.quantization.modelopt_quant import _use_nvfp4_dispatch

    cfg = layer.moe_runner_config
    trtllm = older_releases.nvfp4_trtllm_layout(method)
    cutlass = method.enable_flashinfer_cutlass_moe and not method.enable_flashinfer_cutedsl_moe
    # a SwiGLU alpha: on TRT-LLM its processing adds gemm1_alpha and gemm1_beta (not written;
    # a clamp's rescaled block scales and gemm1_clamp_limit are the output's, checks.check_clamp
    # holds it to the layer's); on CUTLASS both go only into _cutlass_swiglu_params
    plain = (
        (trtllm or cutlass)
        and cfg.is_gated
        and cfg.activation == "silu"
        and not (trtllm and cfg.gemm1_alpha is not None)
        and not method.quant_config.use_per_token_activation
        and not getattr(layer, "inference_moe_w13_interleaved", False)
    )
    if not plain:
        raise PluginError(
            f"{layer.layer_name}: the SGLang plugin loads NVFP4 for gated SiLU experts with "
            "static input scales only, on FlashInfer TRT-LLM without a SwiGLU alpha; serve the "
            "source with SGLang's own loader"
        )
    _as_loaded(layer)
    if cutlass:
        older_releases.cutlass_swiglu_params(layer)
    fp4_dispatch = _use_nvfp4_dispatch() or should_use_flashinfer_cutlass_moe_fp4_allgather()
    layer.dispatcher.set_quant_config(
        {"input_global_scale": layer.w13_input_scale_quant if fp4_dispatch else None}
    )
    if trtllm:
        layer.trtllm_padded_hidden_size = None  # SGLang pads H only for per-token non-gated
        layer.intermediate_size_per_partition = layer.w2_weight.shape[2] * 2
    _blockscale_aliases(layer)


def _blockscale_aliases(layer: Any) -> None:
    """`w*_blockscale_swizzled`, which the kernels read, as SGLang's processing leaves them:
    TRT-LLM aliases them to the (shuffled, swizzled) `w*_weight_scale`; CUTLASS writes the
    swizzle into `w*_weight_scale` and aliases it (`alias_or_bind_derived_param`, dropping the
    placeholder it allocated) where the swizzle has the scale's shape, and else copies it into
    that placeholder, the scale staying as loaded: the output holds both then, and `install`
    read the swizzle into the placeholder."""
    for w in ("w13", "w2"):
        scale, swizzled = (
            getattr(layer, f"{w}_weight_scale"),
            getattr(layer, f"{w}_blockscale_swizzled"),
        )
        if swizzled is None or swizzled.shape == scale.shape:
            setattr(layer, f"{w}_blockscale_swizzled", scale)


def _modelopt_fp8(layer: Any, method: Any) -> None:
    """ModelOptFp8MoEMethod.process_weights_after_loading (SGLang 0.5.23,
    modelopt_quant.py:1194) for ModelOpt FP8 with static input scales (gated SiLU or non-gated
    relu2 experts) on FlashInfer
    TRT-LLM or CUTLASS, without its transforms (the requantized, padded, reordered and, on
    TRT-LLM, interleaved and shuffled weights, the reduced scales and the scale products are
    the output's, `install` read them): every expert parameter replaced, as it replaces them,
    by a new Parameter (without the loader's attributes) on the same bytes; CUTLASS's SwiGLU
    parameters, by its own function."""
    cfg = layer.moe_runner_config
    backend = older_releases.moe_runner_backend(layer, method)
    trtllm, cutlass = backend.is_flashinfer_trtllm(), backend.is_flashinfer_cutlass()
    # gated SiLU experts, or non-gated relu2 ones (Nemotron-H: tests/test_sglang_non_gated.py)
    takes = (cfg.is_gated, cfg.activation) in ((True, "silu"), (False, "relu2"))
    if not (trtllm or cutlass) or not takes:
        raise PluginError(
            f"{layer.layer_name}: the SGLang plugin loads ModelOpt FP8 on FlashInfer TRT-LLM and "
            "CUTLASS for gated SiLU experts and non-gated relu2 ones only; serve the source "
            "with SGLang's own loader"
        )
    _as_loaded(layer)
    for name in ("w13_weight", "w2_weight", *FP8_TENSOR_SCALES):
        setattr(layer, name, torch.nn.Parameter(getattr(layer, name).data, requires_grad=False))
    if cutlass:
        older_releases.cutlass_swiglu_params(layer)


# ModelOpt FP8's loaded scales, which its processing reduces (w13: max of w1 and w3; the input
# scales: max over experts) and puts in new parameters
FP8_TENSOR_SCALES = ("w13_weight_scale", "w2_weight_scale", "w13_input_scale", "w2_input_scale")

# The parameters whose dtype a method's processing changes (new storage there too): the output
# holds them in their final dtype
RETYPED = {"Mxfp4MoEMethod": ("w13_weight_bias", "w2_weight_bias")}
# The parameters a method's processing makes (from the loaded scalars): the output holds them,
# `install` makes each a new parameter and reads it
DERIVED = {
    "ModelOptNvFp4FusedMoEMethod": (
        "g1_alphas",
        "g1_alphas_up",
        "g2_alphas",
        "w13_input_scale_quant",
        "w2_input_scale_quant",
        "gemm1_clamp_limit",
        "g1_scale_c",
    ),
    # TRT-LLM's scale products, CUTLASS's quant scales
    "ModelOptFp8MoEMethod": (
        "output1_scales_scalar",
        "output1_scales_gate_scalar",
        "output2_scales_scalar",
        "fc1_dequant",
        "fc2_quant",
        "fc2_dequant",
        "fc1_input_dequant",
    ),
}
# The parameters whose size a method's processing changes (new storage there too): ModelOpt
# FP8's w13 weight scales and its input scales reduced, its CUTLASS weights padded to 16
RESIZED = {"ModelOptFp8MoEMethod": ("w13_weight", "w2_weight", *FP8_TENSOR_SCALES)}


# SGLang 0.5.23 MoE methods the plugin sets up, by class name.
KERNEL_ONLY = {
    "UnquantizedFusedMoEMethod": _unquantized,
    "Fp8MoEMethod": _fp8_block,
    "Mxfp4MoEMethod": _mxfp4,
    "ModelOptNvFp4FusedMoEMethod": _nvfp4,
    "ModelOptFp8MoEMethod": _modelopt_fp8,
}
