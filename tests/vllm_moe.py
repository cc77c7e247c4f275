"""vLLM's own fused-MoE layers, built and processed on this CPU machine (test support): the
harness is library code (`fi_convert.servers.vllm.moe_layer`, which the load-time proof runs
too); these are the tests' assertions over it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

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
    layer = make_layer(prefix, ckpt, tp, groups=groups)
    plugin_load(layer, prefix, out)
    return layer


def plugin_load(layer: torch.nn.Module, prefix: str, out: Path) -> None:
    """The output's tensors read into `layer` by the plugin's path, then kernel setup only."""
    from fi_convert.format.reader import OutputReader
    from fi_convert.servers.vllm import experts as plugin

    with OutputReader(out) as reader:
        plugin.install(layer, reader, prefix, layer.moe_config.moe_parallel_config.tp_rank)
        plugin.finish(layer, reader.layer(prefix))


def assert_plugin_gives_memory_back(
    prefix: str, ckpt: Path, out: Path, tp: int, groups: int | None = None
) -> int:
    """The plugin's path (as `plugin_layer`, call inside vllm_context) holds on to none of the
    memory the layer gives up: every parameter's or buffer's memory the layer held before and
    does not hold after is freed (a parameter the install replaces, padded or in the kernel's
    dtype, as gpt-oss's biases in float32 for bfloat16 ones). Returns how many were replaced."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    def storages(layer: torch.nn.Module) -> dict[int, tuple[str, StorageWeakRef]]:
        tensors = [*layer.named_parameters(), *layer.named_buffers()]
        return {
            t.untyped_storage()._cdata: (n, StorageWeakRef(t.untyped_storage())) for n, t in tensors
        }

    layer = make_layer(prefix, ckpt, tp, groups=groups)
    before = storages(layer)
    plugin_load(layer, prefix, out)
    gc.collect()
    after = storages(layer)
    kept = [name for key, (name, ref) in before.items() if key not in after and not ref.expired()]
    assert kept == [], f"the memory of {kept} is held after the layer gave it up"
    return sum(key not in after for key in before)


def block_scale_interleave_cpu(
    sf: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """FlashInfer's `block_scale_interleave` (CUDA only) on CPU, as vLLM's processing calls it:
    the 128x4 swizzle of a [M, K] (or [E, M, K]) uint8 or float8 scale tensor, M padded to 128
    and K to 4 with zeros, flat, in the input's dtype. Built from fi_convert.layout's index, so
    vLLM's scale bytes here are checked up to this swizzle; the swizzle itself is checked
    against FlashInfer's on the GPU machine for every shape tests/swizzle_shapes.py lists
    (VLLM_SCALE_SHAPES; any other shape is refused here)."""
    from fi_convert.layout import swizzle_128x4_index
    from tests.swizzle_shapes import VLLM_SCALE_SHAPES

    shape = tuple(sf.shape[-2:])
    if shape not in VLLM_SCALE_SHAPES or sf.element_size() != 1:
        raise AssertionError(
            f"block_scale_interleave of {tuple(sf.shape)} {sf.dtype}: a shape the CPU version "
            "has not been checked against FlashInfer's for; add it to tests/swizzle_shapes.py "
            "(VLLM_SCALE_SHAPES) and run tests/test_gpu.py on the GPU machine"
        )
    e = sf.shape[0] if sf.ndim == 3 else 1
    x = sf.reshape(e, *shape).view(torch.uint8).cpu()
    idx = swizzle_128x4_index(*shape)
    flat = torch.cat([x.reshape(e, -1), torch.zeros(e, 1, dtype=torch.uint8)], dim=1)
    res = flat[:, idx].reshape(-1).view(sf.dtype).to(sf.device)
    return res if out is None else out.copy_(res)


SWIZZLES = ("block_scale_interleave", "nvfp4_block_scale_interleave")


@contextlib.contextmanager
def cpu_swizzle() -> Iterator[None]:
    """FlashInfer's CUDA-only scale swizzle replaced by the CPU version above wherever vLLM's
    processing (or FlashInfer's Python around it) takes it from: every FlashInfer and vLLM
    module that binds one of its names. The only stand-in in the NVFP4 and MXFP8 tests, with
    one move: vLLM's own NVFP4 CUTLASS swizzle (pure PyTorch, `swizzle_blockscale`) ends with
    `.cuda()`, which stays on the CPU here."""
    import flashinfer  # noqa: F401  (its submodules bind the names)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda t, *a, **k: t))
        for name, module in list(sys.modules.items()):
            if module is None or not name.startswith(("flashinfer", "vllm")):
                continue
            for attr in SWIZZLES:
                if callable(vars(module).get(attr)):
                    stack.enter_context(mock.patch.object(module, attr, block_scale_interleave_cpu))
        yield


def release_status(scheme: str, backend: str, spec, tp: int) -> str:
    """What the releases table (fi_convert/servers/vllm/releases.py) says of the installed vLLM
    for the output of checkpoint `spec` (a synthetic Spec) in `scheme` on `backend` at TP `tp`,
    its scheme, backend and per-rank sizes as the manifest will have them: "proven" (it holds
    the bytes), "fails" (its own processing fails on these sizes) or "not proven"."""
    from fi_convert.servers.vllm import releases
    from fi_convert.servers.vllm.checks import same_release, vllm_version

    layer = {"hidden_size": spec.hidden, "intermediate_size_per_rank": spec.intermediate // tp}
    if spec.family == "nemotron-h":
        layer["gated"] = False  # non-gated experts
    row = releases.row_for(scheme, backend, layer)
    if row is None:
        return "not proven"
    if any(same_release(vllm_version(), r) for r in row.releases):
        return "proven"
    return row.left_out_as


@contextlib.contextmanager
def one_process_group() -> Iterator[None]:
    """vLLM's process groups, of one rank over gloo (its model classes ask for the PP group):
    made here unless they are already, and then destroyed on leaving."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        yield
        return
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        make_process_group()
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def make_process_group() -> None:
    """vLLM's process groups of one rank over gloo, inside a vLLM config's context (left for
    the caller to destroy)."""
    import socket

    from vllm.distributed import parallel_state as ps

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ps.init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        local_rank=0,
        backend="gloo",
    )
    ps.initialize_model_parallel(1, 1)


@contextlib.contextmanager
def model_context(src: Path, tp: int, rank: int, build_here: bool = True) -> Iterator[object]:
    """vLLM's config of the checkpoint `src` as rank `rank` of `tp`, current inside, for its
    model classes to build on this CPU (vLLM's CPU attention backend). `build_here`: the CPU
    torch's default device inside (without it, build under `torch.device("cpu")` and load
    outside, as vLLM's loader does: a device context takes every torch call of the load)."""
    from vllm.config import (
        DeviceConfig,
        KernelConfig,
        LoadConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.attention import attention
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    mc = EngineArgs(model=str(src), dtype="bfloat16").create_model_config()
    cfg = VllmConfig(
        model_config=mc,
        kernel_config=KernelConfig(moe_backend=MOE_BACKEND["trtllm"]),
        device_config=DeviceConfig(device="cpu"),
        load_config=LoadConfig(),
    )
    with (
        vllm_context("trtllm", tp, rank, build_here=build_here),
        mock.patch.object(attention, "get_attn_backend", lambda *a, **k: CPUAttentionBackend),
        set_current_vllm_config(cfg),
        set_default_torch_dtype(mc.dtype),
    ):
        yield cfg
