# mypy: disable-error-code="arg-type,assignment,attr-defined,operator,index"
# (it drives vLLM's internals with stand-ins for what a server process holds: a model of one
# layer, namespaces for its configs; vLLM's annotations do not describe them)
"""vLLM's own fused-MoE layers, built, loaded and processed in one process that plays rank r
of N on a GPU of the backend's family: the load-time proof's authority (`proof.py`) and the
tests' (tests/vllm_moe.py, tests/test_vllm*.py).

A layer comes from vLLM's `FusedMoEFactory` with a FlashInfer backend forced. What is patched
is only where vLLM asks what hardware it runs on: the experts' device checks, the platform's
compute capability, the current device index, the tensor-parallel rank and size (every
module-level binding inside vllm.*), so that one process plays rank r of N, and, off CUDA,
whether the platform is CUDA-like where FusedMoEConfig asks it before it takes non-gated
experts (`_CudaAlike`). The weights go
through vLLM's own `load_weights` and its own post-load driver `process_weights_after_loading`.
On a machine without CUDA, FlashInfer's CUDA-only scale swizzles and SM90 weight interleave are
CPU equivalents (`cpu_swizzles`: fi-convert's index math, checked against FlashInfer's CUDA
functions by tests/test_gpu.py); vLLM's one compiled per-tensor FP8 quantization op is its
arithmetic in PyTorch where vLLM's compiled ops are absent.
(shared/reference/vllm-0.33-in-tests.md has the facts this rests on.)
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
import vllm.model_executor.layers.fused_moe  # noqa: F401  (before its submodules)
from safetensors import safe_open
from vllm.config import DeviceConfig, KernelConfig, VllmConfig, set_current_vllm_config
from vllm.config.quantization import QUANT_KEY_NAMES
from vllm.model_executor.layers.fused_moe import config as moe_config_module
from vllm.model_executor.layers.fused_moe.experts import (
    flashinfer_cutlass_moe,
    trtllm_bf16_moe,
    trtllm_fp8_moe,
    trtllm_mxfp4_moe,
    trtllm_nvfp4_moe,
)
from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as mxfp4_oracle
from vllm.model_executor.layers.fused_moe.oracle import unquantized
from vllm.model_executor.layers.quantization import modelopt
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.model_executor.models import gpt_oss
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability

MOE_BACKEND = {"trtllm": "flashinfer_trtllm", "cutlass": "flashinfer_cutlass"}
MIXTRAL_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # models/mixtral.py


def _static_scaled_fp8_quant(result, input, scale, group_shape=None) -> None:
    """vLLM's CUDA op `_C.static_scaled_fp8_quant` (csrc/quantization/w8a8/fp8/common.cu) for a
    per-tensor scale, where vLLM's compiled ops are absent (this CPU build, the carried Python
    code on the GPU machine): float(x) * (1.0f / scale), clamped to +-448, rounded to nearest
    even E4M3. The only piece of vLLM's FP8 per-tensor processing that is not vLLM's own code
    in these tests; it is elementwise and has no layout in it."""
    assert scale.numel() == 1, "per-tensor only"
    inv = torch.ones((), dtype=torch.float32) / scale.float().reshape(()).cpu()
    y = (input.float() * inv.to(input.device)).clamp(-448.0, 448.0)
    result.copy_(y.to(result.dtype))


def _register_fp8_quant_op() -> None:
    if hasattr(torch.ops._C, "static_scaled_fp8_quant"):
        return  # vLLM's compiled ops are loaded: use them
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define(
        "static_scaled_fp8_quant(Tensor(a!) result, Tensor input, Tensor scale, "
        "int[]? group_shape=None) -> ()"
    )
    lib.impl("static_scaled_fp8_quant", _static_scaled_fp8_quant, "CompositeExplicitAutograd")
    _LIBS.append(lib)  # a Library unregisters its ops when collected


_LIBS: list = []
_register_fp8_quant_op()

# fi-convert's TRT-LLM FP8 per-tensor scale products, and where vLLM 0.33's kernel object holds
# them (experts/trtllm_fp8_moe.py: attributes of TrtLlmFp8ExpertsMonolithic, not parameters)
KERNEL_SCALES = {
    "output1_scales_gate_scalar": "_g1_alphas",
    "output1_scales_scalar": "_g1_scale_c",
    "output2_scales_scalar": "_g2_alphas",
}


def _device_checks(stack: contextlib.ExitStack) -> None:
    experts = (trtllm_fp8_moe, trtllm_bf16_moe, trtllm_nvfp4_moe, trtllm_mxfp4_moe)
    for mod in (*experts, flashinfer_cutlass_moe):
        for value in vars(mod).values():
            if isinstance(value, type) and "_supports_current_device" in vars(value):
                stack.enter_context(
                    mock.patch.object(value, "_supports_current_device", staticmethod(lambda: True))
                )


def _tp(stack: contextlib.ExitStack, tp_size: int, tp_rank: int) -> None:
    fakes = {
        "get_tensor_model_parallel_rank": lambda: tp_rank,
        "get_tensor_model_parallel_world_size": lambda: tp_size,
    }
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        for attr, fake in fakes.items():
            if callable(getattr(module, attr, None)):
                stack.enter_context(mock.patch.object(module, attr, fake))


@contextlib.contextmanager
def vllm_context(
    backend: str,
    tp_size: int,
    tp_rank: int,
    sm: int = 100,
    device: str = "cpu",
    moe_activation: str | None = None,
    ep: str | None = None,
    build_here: bool = True,
) -> Iterator[None]:
    """vLLM believes it runs rank `tp_rank` of `tp_size` on an SM`sm` GPU, with --moe-backend
    for fi-convert's `backend`, and the user's MoE activation override `moe_activation`
    (`--quantization-config '{"moe": {"activation": "mxfp8"}}'`; vLLM reads it from the model
    config, which these tests do not build). `ep`: --enable-expert-parallel with this
    --expert-placement-strategy ("linear" or "round_robin"); the MoE's EP size is then
    `tp_size` and its rank `tp_rank`, as vLLM makes them without data parallelism.
    `build_here`: `device` is torch's default device inside (where a layer allocates its
    parameters); without it, the caller builds under `torch.device(device)` and loads outside
    it, as vLLM's loader does (BaseModelLoader.load_model: the model built under the target
    device, its weights loaded and processed outside), so that the load pays no default-device
    dispatch on each torch call that a server would not pay."""
    with contextlib.ExitStack() as stack:
        key = QUANT_KEY_NAMES[moe_activation] if moe_activation else None
        stack.enter_context(
            mock.patch.object(mxfp4_oracle, "_user_moe_activation_override", lambda: key)
        )
        _device_checks(stack)
        cap = DeviceCapability(sm // 10, sm % 10)
        stack.enter_context(
            mock.patch.object(
                type(current_platform),
                "get_device_capability",
                classmethod(lambda c, device_id=0: cap),
            )
        )
        # on the CPU-less platform vLLM's own list raises UnboundLocalError: the CUDA one
        flashinfer = [
            unquantized.UnquantizedMoeBackend.FLASHINFER_TRTLLM,
            unquantized.UnquantizedMoeBackend.FLASHINFER_CUTLASS,
        ]
        stack.enter_context(
            mock.patch.object(unquantized, "_get_priority_backends", lambda cfg: list(flashinfer))
        )
        stack.enter_context(mock.patch.object(torch.accelerator, "current_device_index", lambda: 0))
        if not current_platform.is_cuda_alike():  # non-gated experts are built (_CudaAlike)
            stack.enter_context(
                mock.patch.object(
                    moe_config_module, "current_platform", _CudaAlike(current_platform)
                )
            )
        _tp(stack, tp_size, tp_rank)
        cfg = VllmConfig(
            kernel_config=KernelConfig(moe_backend=MOE_BACKEND[backend]),
            device_config=DeviceConfig(device=device),
        )
        if ep is not None:
            cfg.parallel_config.enable_expert_parallel = True
            cfg.parallel_config.expert_placement_strategy = ep
        stack.enter_context(set_current_vllm_config(cfg))
        if build_here:
            stack.enter_context(torch.device(device))  # where the layer allocates its params
        yield


def quant_config(ckpt: Path):
    """vLLM's quantization config of the checkpoint, from its own files as vLLM reads them
    (config.json's quantization_config; ModelOpt's hf_quant_config.json)."""
    cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config")
    if cfg is None:
        return None
    if cfg["quant_method"] == "fp8":
        return Fp8Config.from_config(cfg)
    if cfg["quant_method"] == "compressed-tensors":
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
            CompressedTensorsConfig,
        )

        return CompressedTensorsConfig.from_config(cfg)
    if cfg["quant_method"] == "mxfp4":  # gpt-oss, as vLLM names it (GptOssMxfp4Config)
        return GptOssMxfp4Config.from_config(cfg)
    if cfg["quant_method"] == "modelopt":
        hq = json.loads((ckpt / "hf_quant_config.json").read_text())
        classes = {
            "FP8": modelopt.ModelOptFp8Config,
            "MXFP8": modelopt.ModelOptMxFp8Config,
            "NVFP4": modelopt.ModelOptNvFp4Config,
        }
        return classes[hq["quantization"]["quant_algo"]].from_config(hq)
    raise ValueError(f"{ckpt}: no vLLM config in these tests for {cfg['quant_method']}")


def make_layer(
    prefix: str, ckpt: Path, tp_size: int, unquantized: bool = False, groups: int | None = None
) -> torch.nn.Module:
    """vLLM's RoutedExperts for `prefix` of the checkpoint at `ckpt` (call inside vllm_context).
    `groups`: grouped top-k routing over that many expert groups (as DeepSeek-V3's n_group;
    vLLM places experts round-robin only for such a model)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg["num_local_experts"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    # gpt-oss builds its experts so (models/gpt_oss.py MLPBlock)
    oss = dict(
        has_bias=True, activation="swigluoai", routed_experts_cls=gpt_oss.GptOssRoutedExperts
    )
    grouped = dict(use_grouped_topk=True, num_expert_group=groups, topk_group=1)
    special = oss if cfg.get("model_type") == "gpt_oss" else {}
    if cfg.get("model_type") == "nemotron_h":
        special = nemotron_h_experts(cfg, experts)
    runner = FusedMoEFactory(
        num_experts=experts,
        top_k=2,
        # a latent MoE's experts run in moe_latent_size (models/nemotron_h.py moe_hidden_size)
        hidden_size=cfg.get("moe_latent_size") or cfg["hidden_size"],
        intermediate_size=inter,
        params_dtype=torch.bfloat16,
        quant_config=None if unquantized else quant_config(ckpt),
        tp_size=tp_size,
        dp_size=1,
        pcp_size=1,
        prefix=prefix,
        **special,
        **({} if groups is None else grouped),
    )
    return runner.routed_experts


def nemotron_h_experts(cfg: dict, experts: int) -> dict:
    """The FusedMoEFactory arguments of Nemotron-H's routed experts as its model builds them
    (models/nemotron_h.py NemotronHMoE): non-gated relu2_no_mul experts, checkpoint names
    ("up_proj", "down_proj", None), sigmoid routing with a correction bias over groups."""
    from vllm.model_executor.layers.fused_moe import activation_without_mul

    return dict(
        renormalize=cfg.get("norm_topk_prob", True),
        ckpt_names=("up_proj", "down_proj", None),
        use_grouped_topk=True,
        num_expert_group=cfg.get("n_group", 1),
        topk_group=cfg.get("topk_group", 1),
        scoring_func="sigmoid",
        e_score_correction_bias=torch.zeros(experts, dtype=torch.float32),
        activation=activation_without_mul(cfg.get("mlp_hidden_act", "relu2")),
        routed_scaling_factor=cfg.get("routed_scaling_factor", 1.0),
        apply_routed_scale_to_output=True,
        router_logits_dtype=torch.float32,
    )


class _CudaAlike:
    """vLLM's platform as fused_moe/config.py sees it, saying it is CUDA-like: its
    FusedMoEConfig refuses non-gated experts (`is_act_and_mul` False) on any other platform
    ("supported only for CUDA, XPU and ROCm"), the one use of that answer in the module;
    everything else is the platform's own."""

    def __init__(self, platform: object) -> None:
        self._platform = platform

    def is_cuda_alike(self) -> bool:
        return True

    def __getattr__(self, name: str) -> object:
        return getattr(self._platform, name)


def source_tensors(ckpt: Path, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The layer's raw checkpoint tensors, named relative to `prefix` as vLLM's model classes
    hand them to the experts (Mixtral's w1/w3/w2 renamed, as vLLM's Mixtral does)."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    for name, shard in sorted(index.items()):
        if not name.startswith(prefix + "."):
            continue
        rel = name[len(prefix) + 1 :]
        e, proj, param = rel.split(".", 2)
        with safe_open(ckpt / shard, framework="pt") as f:
            yield f"{e}.{MIXTRAL_NAMES.get(proj, proj)}.{param}", f.get_tensor(name)


def vllm_load_and_process(layer: torch.nn.Module, ckpt: Path, prefix: str) -> None:
    """vLLM's own path: its expert weight loader (gpt-oss: the model's own), then its
    post-load driver."""
    if json.loads((ckpt / "config.json").read_text()).get("model_type") == "gpt_oss":
        load_gpt_oss(layer, ckpt, prefix)
    else:
        list(layer.load_weights(source_tensors(ckpt, prefix)))
    process(layer)


def load_gpt_oss(layer: torch.nn.Module, ckpt: Path, prefix: str) -> None:
    """vLLM's gpt-oss MXFP4 loader, `GptOssModel._load_weights_mxfp4` (it does the TP split of
    the fused experts), run on a stand-in model that holds only this layer, with the
    checkpoint's names mapped as GptOssForCausalLM.hf_to_vllm_mapper maps them."""
    cfg = json.loads((ckpt / "config.json").read_text())
    model = torch.nn.Module()
    model.add_module("experts", layer)
    model.config = types.SimpleNamespace(
        num_local_experts=cfg["num_local_experts"], intermediate_size=cfg["intermediate_size"]
    )
    model.parallel_config = types.SimpleNamespace(enable_expert_parallel=False)
    model._try_load_streamed_expert = gpt_oss.GptOssModel._try_load_streamed_expert
    mapper = gpt_oss.GptOssForCausalLM.hf_to_vllm_mapper
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for name, shard in sorted(index.items()):
            if name.startswith(prefix + "."):
                with safe_open(ckpt / shard, framework="pt") as f:
                    tensor = f.get_tensor(name)
                yield "experts." + mapper._map_name(name)[len(prefix) + 1 :], tensor

    one = types.SimpleNamespace(world_size=1, rank_in_group=0)  # no DP, no PCP
    with (
        mock.patch.object(gpt_oss, "get_dp_group", lambda: one),
        mock.patch.object(gpt_oss, "get_pcp_group", lambda: one),
    ):
        experts = cfg["num_local_experts"]
        load = gpt_oss.GptOssModel._load_weights_mxfp4
        # vLLM 0.30-0.32 take the rank's attention heads too (for the sinks, which this layer
        # does not hold); 0.33 and 0.34 do not
        heads = {"heads_per_rank": 0, "head_start": 0}
        heads = {k: v for k, v in heads.items() if k in inspect.signature(load).parameters}
        loaded = load(
            model,
            ep_rank_end=experts,
            ep_rank_start=0,
            weights=weights(),
            stacked_params_mapping=[],
            **heads,
        )
    assert len(loaded) == 6, loaded


def process(layer: torch.nn.Module) -> None:
    """vLLM's post-load driver over a model that holds `layer`."""
    model = torch.nn.Module()
    model.add_module("experts", layer)
    config = types.SimpleNamespace(
        word_embeddings_untied_by_checkpoint=False,
        quantization=None,
        dtype=torch.bfloat16,
    )
    device = next(layer.parameters()).device
    process_weights_after_loading(model, config, device)


def params(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.data for n, p in layer.named_parameters(recurse=False)}


def kernel_state(layer: torch.nn.Module) -> dict[str, object]:
    """What the layer's kernel object holds: every tensor and plain value reachable from the
    method's MoE quant config and the kernel's experts object (their scale descriptors and
    MoE config included), tensors as dtype, shape and bytes."""
    method = layer.quant_method
    kernel = getattr(method, "moe_kernel", None)
    state: dict[str, object] = {}
    for where, obj in (
        ("quant_config", getattr(method, "moe_quant_config", None)),
        ("experts", getattr(kernel, "fused_experts", None)),
    ):
        _collect(obj, where, state, depth=3)
    return state


def _collect(v: object, path: str, out: dict[str, object], depth: int) -> None:
    if isinstance(v, torch.Tensor):
        out[path] = (str(v.dtype), tuple(v.shape), _bytes(v))
    elif isinstance(v, (int, float, str, bool, torch.dtype, torch.device, enum.Enum, type(None))):
        out[path] = repr(v)
    elif isinstance(v, (tuple, list)):
        for i, x in enumerate(v):
            _collect(x, f"{path}[{i}]", out, depth)
    elif depth > 0 and hasattr(v, "__dict__") and not isinstance(v, torch.nn.Module):
        out[path] = type(v).__name__
        for k, x in sorted(vars(v).items()):
            _collect(x, f"{path}.{k}", out, depth - 1)
    else:
        out[path] = type(v).__name__


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy())


def as_bytes(t: torch.Tensor) -> bytes:
    return _bytes(t)


def held(layer: torch.nn.Module, name: str) -> torch.Tensor | None:
    """What vLLM holds for the output tensor `name` after its processing: the layer's
    parameter, else the MoE quant config's tensor, else the kernel object's scale
    (KERNEL_SCALES); None when it holds none."""
    ps = params(layer)
    if name in ps:
        return ps[name]
    found = getattr(getattr(layer.quant_method, "moe_quant_config", None), name, None)
    if found is None and name in KERNEL_SCALES:
        kernel = getattr(layer.quant_method, "moe_kernel", None)
        found = getattr(getattr(kernel, "fused_experts", None), KERNEL_SCALES[name], None)
    return found if isinstance(found, torch.Tensor) else None
