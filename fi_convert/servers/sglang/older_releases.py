"""Where SGLang 0.5.20-0.5.22's load and processing differ from 0.5.23's, in what the plugin
follows: each difference read from the running release (a function or attribute it has or
lacks), never from its version number, so that the plugin leaves each layer as *that* release's
own processing leaves it (tests/test_sglang_plugin.py, test_sglang_models.py and
test_sglang_ep.py compare every parameter and attribute, run in each release's venv).

It imports neither SGLang nor torch until a function runs (the plugin's checks use it).
Each function names the releases whose code it follows where it found the difference (read
from their wheels, `python/sglang/srt/...`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def modules_with_quant_method(model: torch.nn.Module) -> Iterator[tuple[Any, Any]]:
    """The modules `DefaultModelLoader.postprocess_weights` processes, with their quant
    methods: SGLang's own `_modules_with_quant_method` (0.5.21 on: every module with a
    `quant_method` but LoRA wrappers), else 0.5.20's loop there (every module with one)."""
    from sglang.srt.model_loader import loader

    own = getattr(loader, "_modules_with_quant_method", None)
    yield from (own or every_module_with_quant_method)(model)


def every_module_with_quant_method(model: torch.nn.Module) -> Iterator[tuple[Any, Any]]:
    """0.5.20's `postprocess_weights` loop: every module with a `quant_method`."""
    for _, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            yield module, method


def cutlass_swiglu_params(layer: Any) -> None:
    """The FlashInfer CUTLASS SwiGLU parameters (`layer._cutlass_swiglu_params`), by SGLang's
    own function, which its BF16, ModelOpt FP8 and NVFP4 processing on flashinfer_cutlass calls
    (0.5.21 on); 0.5.20 has no such function and sets none."""
    from sglang.srt.layers.moe.moe_runner import flashinfer_cutlass

    make = getattr(flashinfer_cutlass, "materialize_swiglu_params_for_cutlass", None)
    if make is not None:
        layer._cutlass_swiglu_params = make(
            layer.moe_runner_config, int(layer.num_local_experts), layer.w13_weight.device
        )


def bf16_canonical_rows(layer: Any, method: Any, name: str) -> int:
    """The rows of one expert of `name` (w13_weight, w2_weight) as `create_weights` allocated
    it: SGLang's own `_canonical_expert_weight_shape` (0.5.23), else its rule (0.5.20-0.5.22's
    `maybe_restore_flashinfer_trtllm_bf16_weight_shape_for_load`: w13 2I rows, I non-gated;
    w2 H rows)."""
    own = getattr(method, "_canonical_expert_weight_shape", None)
    if own is not None:
        return int(own(layer, name)[1])
    return canonical_rows(layer, name)


def canonical_rows(layer: Any, name: str) -> int:
    """0.5.20-0.5.22's rule for the rows of one expert of `name`, as allocated."""
    if name == "w2_weight":
        return int(layer.hidden_size)
    i = int(layer.intermediate_size_per_partition)
    return 2 * i if layer.moe_runner_config.is_gated else i


def bf16_row_permutation(layer: Any, method: Any, name: str, tile: torch.Tensor) -> None:
    """FlashInfer's row permutation of one BF16 expert tile (uint8 `[rows, bytes]`), cached in
    the method's `_cache_permute_indices` as SGLang's TRT-LLM block packing caches it: by its
    own `_trtllm_bf16_row_permutation` (0.5.23), else by the FlashInfer functions 0.5.20-0.5.22's
    `process_weights_after_loading` calls inline (epilogue tile 128, the w13 one gated as the
    layer is)."""
    own = getattr(method, "_trtllm_bf16_row_permutation", None)
    if own is not None:
        own(layer, name, tile)
    else:
        flashinfer_row_permutation(layer, method, name, tile)


def flashinfer_row_permutation(layer: Any, method: Any, name: str, tile: torch.Tensor) -> None:
    """0.5.20-0.5.22's inline calls: FlashInfer's permutation of the tile, cached."""
    from flashinfer.fused_moe.core import (
        _maybe_get_cached_w3_w1_permute_indices,
        get_w2_permute_indices_with_cache,
    )

    cache = method._cache_permute_indices
    if name == "w13_weight":
        gated = layer.moe_runner_config.is_gated
        _maybe_get_cached_w3_w1_permute_indices(cache, tile, 128, is_gated_act_gemm=gated)
    else:
        get_w2_permute_indices_with_cache(cache, tile, 128)


def nvfp4_trtllm_layout(method: Any) -> bool:
    """Whether ModelOpt NVFP4 holds the layer's experts in FlashInfer TRT-LLM's weight layout:
    its own `use_flashinfer_trtllm_weight_layout` (0.5.23: the TRT-LLM runner, but not under
    MegaMoE), else its TRT-LLM runner alone (0.5.20-0.5.22, `enable_flashinfer_trtllm_moe`)."""
    own = getattr(method, "use_flashinfer_trtllm_weight_layout", None)
    if own is not None:
        return bool(own)
    return bool(getattr(method, "enable_flashinfer_trtllm_moe", False))


def moe_runner_backend(layer: Any, method: Any) -> Any:
    """The MoE runner backend a method runs the layer on: its own answer (0.5.23's
    `get_moe_runner_backend(layer)`: ModelOpt FP8 takes Triton where the model declares no
    routing method), else the server's --moe-runner-backend (0.5.20-0.5.22, whose methods
    decide by it alone)."""
    own = getattr(method, "get_moe_runner_backend", None)
    if own is not None:
        return own(layer)
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    return get_moe_runner_backend()
