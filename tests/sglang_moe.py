"""SGLang 0.5.23's own fused-MoE layers, built and processed on this CPU machine (test support):
the harness is library code (`fi_convert.servers.sglang.moe_layer`, which the load-time proof
runs too); here, FlashInfer's CUDA-only functions as the tests run them (versions that refuse
a shape not checked against FlashInfer's on the GPU), and a checkpoint edit of the tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from fi_convert.servers.sglang import moe_layer
from fi_convert.servers.sglang.moe_layer import (  # noqa: F401  (the tests' names for them)
    BACKEND,
    MIXTRAL_NAMES,
    SHARD_IDS,
    _bytes,
    _per_tensor_quant_fp8,
    blackwell,
    build,
    cuda_gate,
    ep_ranks,
    fp8_quant,
    hopper,
    layer_state,
    load,
    load_gpt_oss,
    make_layer,
    mxfp4_registered,
    params,
    process,
    quant_config,
    sglang_context,
    source_tensors,
)


def _block_scale_interleave(sf: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """FlashInfer's `block_scale_interleave` (CUDA only) on CPU: the 128x4 swizzle of a
    [M, K/16] (or [E, M, K/16]) scale tensor, M padded to 128 and K/16 to 4 with zeros, flat.
    Built from fi_convert.layout's index, so SGLang's scale bytes here are checked up to this
    swizzle; the swizzle itself is checked against FlashInfer's on the GPU machine, for the
    shapes tests/swizzle_shapes.py lists (any other shape is refused here)."""
    from fi_convert.layout import swizzle_128x4_index
    from tests.swizzle_shapes import SGLANG_SCALE_SHAPES

    if tuple(sf.shape) not in SGLANG_SCALE_SHAPES or sf.dtype != torch.uint8:
        raise AssertionError(
            f"block_scale_interleave of {tuple(sf.shape)} {sf.dtype}: a shape the CPU version "
            "has not been checked against FlashInfer's for; add it to tests/swizzle_shapes.py "
            "and run tests/test_gpu.py on the GPU machine"
        )
    e = sf.shape[0] if sf.ndim == 3 else 1
    x = sf.reshape(e, sf.shape[-2], sf.shape[-1])
    idx = swizzle_128x4_index(x.shape[1], x.shape[2])
    flat = torch.cat([x.reshape(e, -1), torch.zeros(e, 1, dtype=x.dtype)], dim=1)
    res = flat[:, idx].reshape(-1)
    if out is not None:
        return out.copy_(res)
    return res


def _sm90_weight_interleave(weight: torch.Tensor, quant_type: str = "fp4") -> torch.Tensor:
    """FlashInfer's `interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")` (CUDA only) on CPU:
    fi_convert.layout's `sm90_interleave_weights` (its byte move and bit permutation of each
    expert's [n, K/2] packed FP4 bytes), into a new tensor as FlashInfer returns. So SGLang's
    SM90 weight bytes here are checked up to this interleave; the interleave itself is checked
    against FlashInfer's CUDA kernel on the GPU machine (tests/test_sglang_gpu.py), for the
    shapes tests/swizzle_shapes.py lists (any other shape is refused here)."""
    from fi_convert.layout import sm90_interleave_weights
    from tests.swizzle_shapes import SGLANG_SM90_WEIGHT_SHAPES

    assert quant_type == "fp4" and weight.dtype == torch.uint8 and weight.ndim == 3
    if tuple(weight.shape[1:]) not in SGLANG_SM90_WEIGHT_SHAPES:
        raise AssertionError(
            f"interleave_moe_weights_for_sm90_mixed_gemm of {tuple(weight.shape[1:])} per "
            "expert: a shape the CPU version has not been checked against FlashInfer's for; add "
            "it to tests/swizzle_shapes.py and run tests/test_sglang_gpu.py on the GPU machine"
        )
    return sm90_interleave_weights(weight)


def makes_cutlass_swiglu_params() -> bool:
    """Whether the installed SGLang's processing on flashinfer_cutlass leaves
    `layer._cutlass_swiglu_params` (0.5.21 on: it has the function that makes them; 0.5.20
    makes none), as the plugin's kernel setup reads it (older_releases)."""
    from fi_convert.servers.sglang import stand_ins

    with stand_ins.installed():
        from sglang.srt.layers.moe.moe_runner import flashinfer_cutlass

    return hasattr(flashinfer_cutlass, "materialize_swiglu_params_for_cutlass")


moe_layer.scale_swizzle = _block_scale_interleave
moe_layer.sm90_interleave = _sm90_weight_interleave


def set_up_scales(ckpt: Path, prefix: str, factors: dict[int, float]) -> None:
    """Give expert x's up_proj the gate_proj's global weight scale (weight_scale_2) times
    factors[x] (float32), in the checkpoint's shards: a ModelOpt checkpoint where some experts'
    gate and up scales agree (1.0), or where the up one is the smaller."""
    from safetensors.torch import load_file, save_file

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    for x, factor in factors.items():
        gate, up = (f"{prefix}.{x}.{p}_proj.weight_scale_2" for p in ("gate", "up"))
        with safe_open(ckpt / index[gate], framework="pt") as f:
            value = f.get_tensor(gate) * torch.tensor(factor, dtype=torch.float32)
        tensors = load_file(ckpt / index[up])
        tensors[up] = value
        save_file(tensors, ckpt / index[up], metadata={"format": "pt"})
