"""vLLM's own fused-MoE layers, built and processed on this CPU machine (test support): the
harness is library code (`fi_convert.servers.vllm.moe_layer`, which the load-time proof runs
too); these are the tests' assertions over it."""

from __future__ import annotations

from pathlib import Path

import torch

from fi_convert.servers.vllm.moe_layer import (  # noqa: F401  (the tests' names for them)
    KERNEL_SCALES,
    MIXTRAL_NAMES,
    MOE_BACKEND,
    _bytes,
    held,
    kernel_state,
    load_gpt_oss,
    make_layer,
    params,
    process,
    quant_config,
    source_tensors,
    vllm_context,
    vllm_load_and_process,
)


def assert_holds_output_bytes(layer: torch.nn.Module, out: Path, prefix: str, rank: int) -> None:
    """(a): every parameter vLLM holds after its processing is a tensor of the output, byte
    for byte, for this rank (and the output has no tensor vLLM does not hold). Under expert
    parallelism, the output's slices of the experts vLLM's expert map gives this rank."""
    from fi_convert.format.reader import OutputReader

    local = layer._expert_map if layer.moe_config.moe_parallel_config.use_ep else None
    ids = None if local is None else [int(g) for g in torch.argsort(local)[(local < 0).sum() :]]

    with OutputReader(out) as reader:
        names = list(reader.layer(prefix)["tensors"])
        assert set(params(layer)) <= set(names), (
            f"vLLM holds {sorted(set(params(layer)) - set(names))}"
        )
        for name in names:
            _, shape, dtype = reader.info(prefix, name)
            if ids is None:
                ours = torch.empty(shape, dtype=dtype, device="cpu")
                reader.read_into(prefix, name, rank, ours)
            else:
                ours = torch.empty((len(ids), *shape[1:]), dtype=dtype, device="cpu")
                reader.read_experts_into(prefix, name, ids, ours)
            # a tensor that is not a parameter is one of the kernel's scales
            theirs = held(layer, name)
            assert theirs is not None, f"{name}: neither a parameter nor a kernel scale of vLLM's"
            # vLLM views TRT-LLM MXFP4's UE8M0 scale bytes as float8_e4m3fn for the kernel
            viewed = (dtype, theirs.dtype) == (torch.uint8, torch.float8_e4m3fn)
            assert theirs.dtype == dtype or viewed, name
            assert theirs.numel() == ours.numel(), name
            assert _bytes(theirs) == _bytes(ours), f"{name} differs from vLLM's"


def assert_same_layer(theirs: torch.nn.Module, ours: torch.nn.Module) -> None:
    """(b): the two layers hold the same parameters (names, shapes, dtypes, bytes), MoE config
    sizes, kernel class and kernel state."""
    a, b = params(theirs), params(ours)
    assert sorted(a) == sorted(b)
    for name in a:
        assert (a[name].dtype, a[name].shape) == (b[name].dtype, b[name].shape), name
        assert _bytes(a[name]) == _bytes(b[name]), name
    for field in ("intermediate_size_per_partition", "hidden_dim", "hidden_dim_unpadded"):
        assert getattr(theirs.moe_config, field) == getattr(ours.moe_config, field), field
    kinds = [type(x.quant_method.moe_kernel.fused_experts).__name__ for x in (theirs, ours)]
    assert kinds[0] == kinds[1]
    assert kernel_state(ours) == kernel_state(theirs)


def plugin_layer(
    prefix: str, ckpt: Path, out: Path, tp: int, groups: int | None = None
) -> torch.nn.Module:
    """The plugin's path (call inside vllm_context): a fresh layer, the output's tensors read
    into it, kernel setup only."""
    from fi_convert.format.reader import OutputReader
    from fi_convert.servers.vllm import experts as plugin

    layer = make_layer(prefix, ckpt, tp, groups=groups)
    with OutputReader(out) as reader:
        plugin.install(layer, reader, prefix, layer.moe_config.moe_parallel_config.tp_rank)
        plugin.finish(layer, reader.layer(prefix))
    return layer
