"""Put one rank's converted experts into a vLLM 0.33 MoE layer, then set up its kernel only.

Each tensor is read from the shards (this rank's byte range) straight into the layer's own
parameter storage where vLLM allocated it at the same byte size, else into a parameter of the
final shape that replaces the allocated one (freed first). Then the layer's padded sizes are set
from the manifest and vLLM's own `process_weights_after_loading` runs in its pre-processed mode,
which builds the kernel and transforms nothing; for the methods that have no such mode
(KERNEL_ONLY), the end of their processing runs without its transforms, with vLLM's functions.
"""

from __future__ import annotations

import math
import os
from functools import partial
from typing import Any

import torch

from ...bulk_read import BulkRead
from ...format.reader import OutputReader
from .checks import PluginError, backend_of

# Where vLLM 0.33 keeps the checkpoint-shaped parameter and lets the kernel view the bytes
# (trtllm_bf16_moe.py: BlockMajorK views at dispatch): the stored 4-D shape is not the param's.
KEEP_ALLOCATED_SHAPE = {("bf16", "trtllm")}
TEST_CPU_ENV = "FI_CONVERT_VLLM_TEST_CPU"  # test-only: "undo" or "raw", see test_cpu_mode()


def test_cpu_mode() -> str | None:
    """The engine tests' mode on vLLM's CPU MoE backend, which cannot run FlashInfer layouts:
    "undo" puts the checkpoint layout back so vLLM's CPU path processes it as usual (to test
    the plumbing: ranks, names, non-expert loading), "raw" hands it the FlashInfer bytes (the
    negative control). Never set outside tests."""
    mode = os.environ.get(TEST_CPU_ENV) or None
    if mode not in (None, "undo", "raw"):
        raise PluginError(f"{TEST_CPU_ENV}={mode!r}: test-only, 'undo' or 'raw'")
    return mode


def local_experts(experts: Any) -> list[int] | None:
    """Under expert parallelism, the global experts this rank holds, in the order of its local
    slots, from vLLM's own expert map (linear or round-robin placement alike); None without."""
    emap = getattr(experts, "_expert_map", None)
    if emap is None or not experts.moe_config.moe_parallel_config.use_ep:
        return None
    emap = emap.cpu()
    slots = {int(local): g for g, local in enumerate(emap.tolist()) if local >= 0}
    if sorted(slots) != list(range(experts.local_num_experts)):
        raise PluginError(
            f"{experts.layer_name}: vLLM's expert map gives this rank slots {sorted(slots)} for "
            f"{experts.local_num_experts} local experts (redundant experts?); start vLLM "
            "without --enable-eplb"
        )
    return [slots[j] for j in range(experts.local_num_experts)]


def install(
    experts: Any,
    reader: OutputReader,
    prefix: str,
    tp_rank: int,
    bulk: BulkRead | None = None,
) -> list[str]:
    """Read the layer's tensors for `tp_rank` into `experts`' parameters; returns their names.
    Under expert parallelism, each tensor's slices of this rank's experts instead. With `bulk`,
    the parameters are placed now and their bytes read when `bulk` runs (with every other
    layer's); without, read now.

    Tensors that are not parameters of the allocated layer (g1_scale_c for nvfp4/trtllm) are not
    read: vLLM's kernel setup computes them from the parameters, as it does on its own path."""
    m = reader.manifest
    keep = (m["scheme"], m["backend"]) in KEEP_ALLOCATED_SHAPE
    ids = local_experts(experts)
    now = bulk or reader.bulk(next(experts.parameters()).device)
    loaded = []
    for name in reader.layer(prefix)["tensors"]:
        param = experts._parameters.get(name)
        if param is None:
            continue
        _, shape, dtype = reader.info(prefix, name)
        if ids is None:
            read = partial(reader.read_into, prefix, name, tp_rank, bulk=now)
        else:
            shape = (len(ids), *shape[1:])
            read = partial(reader.read_experts_into, prefix, name, ids, bulk=now)
        data = param.data
        if data.dtype == dtype and data.numel() == math.prod(shape) and data.is_contiguous():
            read(data)
            if not keep:
                param.data = data.view(shape)
        else:  # the padded shape differs from the allocated one: replace it, freeing it first
            device = data.device
            del data
            param.data = torch.empty(0, dtype=dtype, device=device)
            new = torch.empty(shape, dtype=dtype, device=device)
            read(new)
            param.data = new
        loaded.append(name)
    if bulk is None:
        now.run()
    return loaded


def set_sizes(experts: Any, layer_meta: dict) -> None:
    """The padded sizes vLLM's own path leaves in the layer's MoE config (its pre-processed
    branch does not restore them)."""
    mc = experts.moe_config
    hp, ip = layer_meta["padded_hidden_size"], layer_meta["padded_intermediate_size_per_rank"]
    if hp != mc.hidden_dim:
        if mc.hidden_dim_unpadded is None:
            mc.hidden_dim_unpadded = mc.hidden_dim
        mc.hidden_dim = hp
    mc.intermediate_size_per_partition = ip


def finish(experts: Any, layer_meta: dict) -> None:
    """Kernel setup only: vLLM's pre-processed mode of the layer's MoE method where it has one,
    else the end of the method's own processing without its transforms (KERNEL_ONLY)."""
    from vllm.model_executor.utils import weights_already_processed

    set_sizes(experts, layer_meta)
    method = experts.quant_method
    kernel_only = KERNEL_ONLY.get(type(method).__name__)
    if kernel_only is not None:
        kernel_only(experts, method)
        return
    with weights_already_processed():
        type(method).process_weights_after_loading(method, experts)


def _mxfp8_kernel(experts: Any, method: Any) -> None:
    """ModelOptMxFp8FusedMoE.process_weights_after_loading (vLLM 0.33, modelopt.py:1454) after
    its convert_to_fp8_moe_kernel_format: the same attributes, quant config and kernel, built
    by vLLM's own functions from the parameters as they are."""
    experts._already_called_process_weights_after_loading = True
    method._check_weight_dtypes(experts)
    experts.weight_block_size = method.weight_block_size
    _fp8_family_kernel(experts, method, method.mxfp8_backend)


def _fp8_family_kernel(experts: Any, method: Any, backend: Any) -> None:
    """The quant config and kernel of an FP8-family method (vLLM 0.33, oracle/fp8.py)."""
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import make_fp8_moe_kernel

    method.moe_quant_config = method.get_fused_moe_quant_config(experts)
    method.moe_kernel = make_fp8_moe_kernel(
        moe_quant_config=method.moe_quant_config,
        moe_config=method.moe,
        fp8_backend=backend,
        experts_cls=method.experts_cls,
        routing_tables=experts._expert_routing_tables(),
    )


def _fp8_tensor_kernel(experts: Any, method: Any) -> None:
    """ModelOptFp8MoEMethod._setup_kernel (vLLM 0.33, modelopt.py:586) after its
    convert_to_fp8_moe_kernel_format, and without the requantization and activation-scale
    reduction before it (modelopt.py:625): the output holds their results. The end of
    CompressedTensorsW8A8Fp8MoEMethod.process_weights_after_loading is the same. vLLM's
    own functions then derive what the kernel reads from the parameters: CUTLASS's
    g1/g2_alphas parameters (oracle/fp8.py make_fp8_moe_quant_config), TRT-LLM's _g1_alphas,
    _g2_alphas and _g1_scale_c (experts/trtllm_fp8_moe.py)."""
    _fp8_family_kernel(experts, method, method.fp8_backend)


def _mxfp4_kernel(experts: Any, method: Any) -> None:
    """GptOssMxfp4MoEMethod._setup_kernel (vLLM 0.33, mxfp4.py:294) after its
    convert_gpt_oss_weight_to_mxfp4_moe_kernel_format: the quant config, the kernel and the
    experts' own post-load step, by vLLM's functions. TRT-LLM's kernel takes the UE8M0 scale
    bytes viewed as float8_e4m3fn, as vLLM's conversion leaves them (oracle/mxfp4.py)."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import make_mxfp4_moe_kernel

    if backend_of(method) == "trtllm":
        for name in ("w13_weight_scale", "w2_weight_scale"):
            param = experts._parameters[name]
            param.data = param.data.view(torch.float8_e4m3fn)
    method.moe_quant_config = method.get_fused_moe_quant_config(experts)
    if method.moe_quant_config is not None and method.experts_cls is not None:
        method.moe_kernel = make_mxfp4_moe_kernel(
            moe_quant_config=method.moe_quant_config,
            moe_config=method.moe,
            mxfp4_backend=method.mxfp4_backend,
            experts_cls=method.experts_cls,
            routing_tables=experts._expert_routing_tables(),
        )
        method.moe_kernel.fused_experts.process_weights_after_loading(experts)


def _nvfp4_cutlass_kernel(experts: Any, method: Any) -> None:
    """ModelOptNvFp4FusedMoE._build_moe_kernel (vLLM 0.33, modelopt.py:1099) without its last
    step, FlashInferExperts.process_weights_after_loading: that folds the input scales into
    w13/w2_weight_scale_2 in place, and the output's are folded already. (Its TRT-LLM twin skips
    the fold in pre-processed mode; the CUTLASS one has no such mode.)"""
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import (
        NvFp4MoeBackend,
        make_nvfp4_moe_kernel,
    )

    if method.nvfp4_backend != NvFp4MoeBackend.FLASHINFER_CUTLASS:
        raise PluginError(f"{experts.layer_name}: NVFP4 backend {method.nvfp4_backend}")
    method.moe_quant_config = method.get_fused_moe_quant_config(experts)
    method.moe_kernel = make_nvfp4_moe_kernel(
        moe_quant_config=method.moe_quant_config,
        moe_config=method.moe,
        experts_cls=method.experts_cls,
        backend=method.nvfp4_backend,
        routing_tables=experts._expert_routing_tables(),
        per_token_activation=per_token_activation(method),
    )


def per_token_activation(method: Any) -> bool:
    """Whether the NVFP4 method quantizes activations per token. vLLM 0.30 and 0.31 have no
    such mode (no `per_token_activation` attribute) and build the kernel with the default,
    False, as their own `_build_moe_kernel` does."""
    return bool(getattr(method, "per_token_activation", False))


def _nvfp4_kernel(experts: Any, method: Any) -> None:
    from vllm.model_executor.utils import weights_already_processed

    if backend_of(method) == "cutlass":
        _nvfp4_cutlass_kernel(experts, method)
        return
    with weights_already_processed():  # TRT-LLM: vLLM's own pre-processed mode
        type(method).process_weights_after_loading(method, experts)


# vLLM 0.33 MoE methods without a pre-processed mode (for some backend): their kernel setup, by
# class name.
KERNEL_ONLY = {
    "ModelOptFp8MoEMethod": _fp8_tensor_kernel,
    "CompressedTensorsW8A8Fp8MoEMethod": _fp8_tensor_kernel,  # the same end (w8a8_fp8.py:320)
    "ModelOptMxFp8FusedMoE": _mxfp8_kernel,
    "GptOssMxfp4MoEMethod": _mxfp4_kernel,
    "ModelOptNvFp4FusedMoE": _nvfp4_kernel,
}


def undo_for_cpu(experts: Any, manifest: dict, mode: str) -> None:
    """Test-only (see test_cpu_mode): bf16/cutlass w13 is [up; gate]; vLLM's CPU path wants
    [gate; up]. "raw" leaves the bytes as they are."""
    if (manifest["scheme"], manifest["backend"]) != ("bf16", "cutlass"):
        raise PluginError(f"{TEST_CPU_ENV}: test-only mode, for bf16/cutlass outputs only")
    if mode == "undo":
        w = experts.w13_weight.data
        half = w.shape[1] // 2
        w.copy_(torch.cat([w[:, half:], w[:, :half]], dim=1))


def set_up_kernel_only(experts: Any, layer_meta: dict) -> None:
    """Make vLLM's post-load driver run `finish` for this layer instead of the method's own
    processing, once (the instance attribute removes itself, so a later reload is vLLM's)."""
    method = experts.quant_method

    def process_weights_after_loading(layer: torch.nn.Module) -> None:
        del method.process_weights_after_loading
        finish(experts, layer_meta)

    method.process_weights_after_loading = process_weights_after_loading
