# mypy: disable-error-code="arg-type,assignment,attr-defined,operator,index"
# (it drives SGLang's internals with stand-ins for what a server process holds: a model of one
# layer, namespaces for its configs; SGLang's annotations do not describe them)
"""SGLang 0.5.23's own fused-MoE layers, built and processed on a CPU: the load-time proof's
authority (`proof.py`, in a process of its own: SGLang's runtime context is the process's) and
the tests' (tests/sglang_moe.py, tests/test_sglang*.py).

As SGLang's own layer tests set up (`sglang/test/layer_ut_utils.init_single_process_dist`,
`test_utils.publish_build_topology`): a one-process gloo group, `ServerArgs` published with the
`--moe-runner-backend` of the case, model parallel and the MoE config initialized. Then SGLang's
`FusedMoE` with the checkpoint's quantization config as SGLang reads it, the raw checkpoint
tensors through the layer's own `weight_loader` (named as SGLang's model classes name them), and
the quant method's own `process_weights_after_loading`.

What is not SGLang's own: the stand-ins for triton, IPython and torchvision
(`stand_ins.py`, live only while SGLang runs), and one process playing TP rank r of N:
SGLang's parallel context is overridden with that rank and size (its own scoped `override`),
with the check that the built groups have that size switched off (the one group here has one
process). On this machine SGLang's `is_cuda()` and `is_cpu()` are both False, so it takes its
generic (GPU) code paths. For NVFP4, MXFP8 and gpt-oss MXFP4 (`blackwell()`): SGLang's own
`override_platform` hook says SM100, FlashInfer's CUDA-only scale swizzle is a CPU version,
and for gpt-oss `Tensor.cuda` stays on CPU and two FlashInfer names SGLang binds only when
FlashInfer finds CUDA are bound. For ModelOpt FP8: SGLang's CUDA-only per-tensor FP8
quantization kernel is a CPU version of its arithmetic, its `per_tensor_dequantize` is
evaluated as CUDA evaluates it (`fp8_quant`), and the layer gets the routing method its model
class declares (`_routing`). gpt-oss experts load through SGLang's own
`GptOssForCausalLM._load_mxfp4_experts_weights` (it splits the fused experts by TP rank).
For a whole gpt-oss model (`mxfp4_registered`), SGLang's `mxfp4` quantization method is
registered as SGLang registers it where it finds CUDA.
(shared/reference/sglang-0.5.23-in-tests.md has the facts.)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
from safetensors import safe_open

from .. import flashinfer_cpu
from . import stand_ins

BACKEND = {
    "trtllm": "flashinfer_trtllm",
    "cutlass": "flashinfer_cutlass",
    # gpt-oss MXFP4 on FlashInfer's TRT-LLM kernels (SM100) and on its CUTLASS mixed-input
    # kernels (SM90) is SGLang's own backend name
    "mxfp4-trtllm": "flashinfer_mxfp4",
    "mxfp4-cutlass": "flashinfer_mxfp4",
}
MIXTRAL_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
SHARD_IDS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}

_STATE: dict = {}


def _init(backend: str) -> None:
    """The one-process gloo world and model-parallel groups (once), and ServerArgs published
    with `--moe-runner-backend` (again whenever the backend changes)."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.runtime_context import get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if _STATE.get("backend") == backend:
        return
    if not torch.distributed.is_initialized():
        # a free port of this machine's loopback (a fixed one collides with another test run)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        )
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo"
        )
    stamp = dict(_built_widths(get_parallel()))  # the groups built so far
    reset_context()
    args = ServerArgs(
        model_path="dummy", tp_size=1, ep_size=1, pp_size=1, moe_runner_backend=BACKEND[backend]
    )
    if hasattr(rc, "SpawnRanks"):  # 0.5.21 on: the process's ranks are published with it
        publish(args, role="test", ranks=rc.SpawnRanks(world_rank=0))
    else:  # 0.5.20: its ranks are the live groups'
        publish(args, role="test")
    if stamp:
        get_parallel().override_permanently(**stamp)
    elif parallel_state._WORLD is not None:
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(backend="gloo")
    initialize_moe_config()
    _STATE["backend"] = backend


@contextlib.contextmanager
def sglang_context(backend: str, tp_size: int, tp_rank: int, ep_size: int = 1) -> Iterator[None]:
    """SGLang runs with --moe-runner-backend for fi-convert's `backend`, as rank `tp_rank` of
    `--tp tp_size` (no DP attention); with `ep_size`, `--ep-size ep_size` (expert parallelism:
    the MoE ranks and sizes as SGLang derives them, `ep_ranks`)."""
    environ = dict(os.environ)  # SGLang's import sets cache-folder defaults; _init, gloo's
    with stand_ins.installed(), contextlib.ExitStack() as stack:
        stack.callback(_restore_environ, environ)
        from sglang.srt import runtime_context

        _init(backend)
        ranks = (
            ep_ranks(backend, tp_size, tp_rank, ep_size)
            if ep_size != 1
            else dict(tp_size=tp_size, tp_rank=tp_rank, moe_tp_size=tp_size, moe_tp_rank=tp_rank)
        )
        if hasattr(runtime_context, "_validate_parallel"):  # 0.5.21 on (0.5.20 checks none)
            stack.enter_context(mock.patch.object(runtime_context, "_validate_parallel", _no_check))
        stack.enter_context(runtime_context.get_parallel().override(**ranks))
        stack.enter_context(torch.device("cpu"))
        yield


def _built_widths(parallel) -> dict:
    """The widths SGLang set permanently as it built the groups: its `_stamp` (0.5.21 on), its
    `_derived` (0.5.20)."""
    return getattr(parallel, "_stamp", None) or getattr(parallel, "_derived", None) or {}


def ep_ranks(backend: str, tp_size: int, tp_rank: int, ep_size: int) -> dict[str, int]:
    """The parallel context of rank `tp_rank` of `--tp tp_size --ep-size ep_size`, as SGLang
    derives it at publish (`runtime_context.parallel_widths_of` of the ServerArgs,
    `_spawn_ranks`), checked by its own `_validate_parallel` where it has one (0.5.21 on: its
    rank bounds and its `tp_size == moe_ep_size * moe_dp_size * moe_tp_size`; not the group
    widths: the groups built here hold one process)."""
    import types

    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path="dummy",
        tp_size=tp_size,
        ep_size=ep_size,
        pp_size=1,
        moe_runner_backend=BACKEND[backend],
    )
    widths = rc.parallel_widths_of(args)
    spawn = _spawn_ranks(rc, args, widths, tp_rank)
    ranks = dict(
        tp_size=tp_size,
        tp_rank=spawn["tp_rank"],
        moe_ep_size=widths["moe_ep_size"],
        moe_ep_rank=spawn["moe_ep_rank"],
        moe_tp_size=widths["moe_tp_size"],
        moe_tp_rank=spawn["moe_tp_rank"],
    )
    if hasattr(rc, "_validate_parallel"):  # 0.5.21 on (0.5.20 checks none)
        rc._validate_parallel(types.SimpleNamespace(**ranks, moe_dp_size=args.moe_dp_size), "test")
    return ranks


def _spawn_ranks(rc, args, widths: dict, tp_rank: int) -> dict[str, int]:
    """The TP and MoE ranks of TP rank `tp_rank`: SGLang's `derive_spawn_ranks` (0.5.21 on),
    else the ranks 0.5.20's `initialize_model_parallel` gives it in the groups it builds (no
    MoE DP: MoE EP groups strided by the MoE TP size, each MoE TP group contiguous)."""
    if hasattr(rc, "derive_spawn_ranks"):
        return rc.derive_spawn_ranks(
            world_rank=tp_rank,
            tp_size=args.tp_size,
            ep_join_rank_offset=0,
            attn_cp_size=args.attn_cp_size,
            attn_tp_size=widths["attn_tp_size"],
            moe_dp_size=args.moe_dp_size,
            moe_ep_size=widths["moe_ep_size"],
        )
    assert args.moe_dp_size == 1, "0.5.20's MoE ranks are read here without MoE DP"
    moe_tp = widths["moe_tp_size"]
    return dict(tp_rank=tp_rank, moe_ep_rank=tp_rank // moe_tp, moe_tp_rank=tp_rank % moe_tp)


# FlashInfer's CUDA-only functions as SGLang calls them on CPU (module attributes: the tests set
# versions that refuse a shape the GPU has not checked, tests/sglang_moe.py)
scale_swizzle = flashinfer_cpu.block_scale_interleave
sm90_interleave = flashinfer_cpu.interleave_moe_weights_for_sm90_mixed_gemm


@contextlib.contextmanager
def blackwell(cuda_noop: bool = False) -> Iterator[None]:
    """What SGLang's NVFP4 TRT-LLM path needs on CPU (call inside sglang_context): SGLang's own
    test hook `override_platform` says SM100 (Blackwell), and FlashInfer's CUDA-only
    `block_scale_interleave` is the CPU version above wherever SGLang or FlashInfer bound it."""
    import sys

    from sglang.srt.runtime_context import override_platform

    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if module is None or not name.startswith(("sglang", "flashinfer")):
                continue
            for attr in ("block_scale_interleave", "nvfp4_block_scale_interleave"):
                if attr in vars(module) and callable(vars(module)[attr]):
                    stack.enter_context(mock.patch.object(module, attr, scale_swizzle))
        stack.enter_context(override_platform(is_blackwell=True, is_sm100=True))
        if cuda_noop:
            # gpt-oss MXFP4 moves its alphas and limits to the GPU with .cuda(), and binds two
            # FlashInfer names into its module only where FlashInfer finds CUDA: the real
            # (pure-Python) permute-index helper, and the CPU scale swizzle above
            from flashinfer.fused_moe.core import get_w2_permute_indices_with_cache
            from sglang.srt.layers.quantization import mxfp4

            stack.enter_context(mock.patch.object(torch.Tensor, "cuda", _stay))
            for attr, value in (
                ("get_w2_permute_indices_with_cache", get_w2_permute_indices_with_cache),
                ("nvfp4_block_scale_interleave", scale_swizzle),
            ):
                stack.enter_context(mock.patch.object(mxfp4, attr, value, create=True))
        yield


@contextlib.contextmanager
def hopper() -> Iterator[None]:
    """What SGLang's gpt-oss MXFP4 path on SM90 (FlashInfer's CUTLASS mixed-input MoE) needs on
    CPU (call inside sglang_context): SGLang's own test hook `override_platform` says SM90 (not
    SM100 nor SM120); its module's flag that FlashInfer has the SM90 helpers set (it binds them
    only where FlashInfer finds CUDA), with FlashInfer's own (pure-PyTorch) scale fold and the
    CPU version above of its CUDA-only weight interleave."""
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm
    from sglang.srt.layers.quantization import mxfp4
    from sglang.srt.runtime_context import override_platform

    bound = {
        "_FI_HAS_SM90_CUTLASS_MXFP4": True,
        "interleave_moe_scales_for_sm90_mixed_gemm": interleave_moe_scales_for_sm90_mixed_gemm,
        "interleave_moe_weights_for_sm90_mixed_gemm": sm90_interleave,
    }
    with contextlib.ExitStack() as stack:
        for attr, value in bound.items():
            stack.enter_context(mock.patch.object(mxfp4, attr, value, create=True))
        facts = dict(is_sm90=True, is_sm100=False, is_sm120=False, is_blackwell=False)
        stack.enter_context(override_platform(**facts))
        yield


@contextlib.contextmanager
def cuda_gate() -> Iterator[None]:
    """SGLang's MXFP8 MoE processing runs only where its `fp8._is_cuda` flag (set at import)
    says CUDA: set here (call inside sglang_context), as SGLang sets it on a CUDA machine."""
    from sglang.srt.layers.quantization import fp8

    with mock.patch.object(fp8, "_is_cuda", True):
        yield


@contextlib.contextmanager
def mxfp4_registered() -> Iterator[None]:
    """SGLang registers its `mxfp4` quantization method (gpt-oss) at import only where it finds
    CUDA or a CPU it supports (`layers/quantization/__init__.py`); here neither: registered as
    it registers it there (call inside sglang_context; a whole model's config reads it)."""
    from sglang.srt.layers import quantization
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    with mock.patch.dict(quantization.QUANTIZATION_METHODS, {"mxfp4": Mxfp4Config}):
        yield


def _stay(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return self


def _restore_environ(environ: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environ)


def _no_check(parallel, source: str) -> None:
    """The built groups hold one process; the rank played is another (see the module doc)."""


def quant_config(ckpt: Path):
    """SGLang's quantization config of the checkpoint, from its own files as SGLang reads them."""
    cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config")
    if cfg is None:
        return None
    if cfg["quant_method"] == "fp8":
        from sglang.srt.layers.quantization.fp8 import Fp8Config

        return Fp8Config.from_config(cfg)
    if cfg["quant_method"] == "modelopt" and cfg.get("quant_algo") == "MXFP8":
        # SGLang's ModelConfig turns it into its native mxfp8 config, by this function
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.layers.quantization.fp8 import Fp8Config

        return Fp8Config.from_config(ModelConfig._parse_modelopt_quant_config(None, cfg))
    if cfg["quant_method"] == "modelopt" and cfg.get("quant_algo") == "FP8":
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp8Config

        return ModelOptFp8Config.from_config(cfg)
    if cfg["quant_method"] == "modelopt" and cfg.get("quant_algo") == "NVFP4":
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

        return ModelOptFp4Config.from_config(cfg)
    if cfg["quant_method"] == "mxfp4":
        from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

        return Mxfp4Config.from_config(cfg)
    raise ValueError(f"{ckpt}: no SGLang config in these tests for {cfg['quant_method']}")


def make_layer(prefix: str, ckpt: Path):
    """SGLang's FusedMoE for `prefix` of the checkpoint (call inside sglang_context)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    cfg = json.loads((ckpt / "config.json").read_text())
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg["num_local_experts"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    # gpt-oss builds its experts so (models/gpt_oss.py GptOssSparseMoeBlock; transformers'
    # GptOssConfig: hidden_act "silu", SGLang's default alpha 1.702)
    oss = dict(
        activation=cfg.get("hidden_act", "silu"),
        gemm1_alpha=cfg.get("hidden_act_alpha", 1.702),
        gemm1_clamp_limit=cfg.get("swiglu_limit"),
        with_bias=True,
    )
    # DeepSeek's MoE passes the config's SwiGLU clamp (models/deepseek_v2.py DeepseekV2MoE:
    # swiglu_limit=getattr(config, "swiglu_limit", None))
    deepseek = {"swiglu_limit": cfg.get("swiglu_limit")}
    kind = {"gpt_oss": oss, "deepseek_v3": deepseek, "deepseek_v2": deepseek, "kimi_k2": deepseek}
    kind["nemotron_h"] = _nemotron_h(cfg)
    return FusedMoE(
        **kind.get(cfg.get("model_type"), {}),
        **_routing(ckpt),
        num_experts=experts,
        hidden_size=cfg["hidden_size"],
        intermediate_size=inter,
        layer_id=int(prefix.split(".")[2]),
        top_k=2,
        params_dtype=torch.bfloat16,
        quant_config=quant_config(ckpt),
        prefix=prefix,
    )


def _nemotron_h(cfg: dict) -> dict:
    """Nemotron-H's routed experts as its model builds them (models/nemotron_h.py
    NemotronHMoE): non-gated experts of the config's activation, DeepSeekV3 routing."""
    from sglang.srt.layers.moe.utils import RoutingMethodType

    return dict(
        activation=cfg.get("mlp_hidden_act", "relu2"),
        is_gated=False,
        routing_method_type=RoutingMethodType.DeepSeekV3,
        routed_scaling_factor=cfg.get("routed_scaling_factor"),
    )


def _routing(ckpt: Path) -> dict:
    """The routing method SGLang's model class declares to its FusedMoE (qwen3_moe.py:
    Renormalize; deepseek_v2.py: DeepSeekV3 unless its config names another; mixtral.py:
    none), for ModelOpt FP8, whose method runs FlashInfer TRT-LLM only where one is declared
    (else Triton). The other schemes' layers are built without it, as before (their methods
    do not read it for their layout)."""
    from sglang.srt.layers.moe.utils import RoutingMethodType

    if _algo(ckpt) != "FP8" or _model_type(ckpt) == "nemotron_h":  # (its own: _nemotron_h)
        return {}
    declared = {
        "qwen3_moe": RoutingMethodType.Renormalize,
        "deepseek_v3": RoutingMethodType.DeepSeekV3,
    }
    return {"routing_method_type": declared.get(_model_type(ckpt) or "")}


def _per_tensor_quant_fp8(input, output_q, output_s, is_static: bool = False) -> None:
    """SGLang's CUDA-only per-tensor FP8 quantization (`sgl_per_tensor_quant_fp8`, a JIT kernel,
    kernels/jit/csrc/gemm/per_tensor_quant_fp8.cuh), on CPU: a dynamic scale is
    float32(max |x|) / 448 (an IEEE float32 division) written to `output_s`; each value
    float32(x) * (1.0f / scale) (an IEEE float32 division), clipped to +-448, cast to E4M3
    (round to nearest even). Elementwise, no layout in it."""
    if not is_static:
        amax = input.float().abs().amax()
        output_s.copy_((amax / torch.tensor(448.0)).reshape(output_s.shape))
    inv = torch.ones((), dtype=torch.float32) / output_s.float().reshape(())
    y = (input.float() * inv).clamp(-448.0, 448.0)
    output_q.copy_(y.to(output_q.dtype))


def _per_tensor_dequantize_as_on_cuda(tensor: torch.Tensor, inv_scale) -> torch.Tensor:
    """SGLang's `per_tensor_dequantize` (`tensor.to(float16) * inv_scale`, a 0-dim float32
    scale) as CUDA evaluates it: the scale is cast to the float16 of the product first. The
    CPU keeps a 0-dim operand unrounded, which gives other float16 values, and after the
    requantization other E4M3 bytes (5 of 98304 in test_sglang's
    test_fp8_tensor_w13_input_scale_is_the_one_loaded_last). tests/test_gpu.py's
    test_cpu_dequantize_gives_the_gpu_bytes shows this on CUDA for the same expression (vLLM's
    `per_tensor_dequantize` is the same line)."""
    return tensor.to(torch.float16) * torch.as_tensor(inv_scale).to(torch.float16)


@contextlib.contextmanager
def fp8_quant() -> Iterator[None]:
    """SGLang's ModelOpt FP8 requantization on CPU as on CUDA (call inside sglang_context): its
    `sgl_per_tensor_quant_fp8`, which its fp8_kernel module binds only on CUDA, is the CPU
    version above; its `per_tensor_dequantize` evaluated as CUDA evaluates it."""
    from sglang.kernels.ops.quantization import fp8_kernel
    from sglang.srt.layers.quantization import modelopt_quant

    with (
        mock.patch.object(
            fp8_kernel, "sgl_per_tensor_quant_fp8", _per_tensor_quant_fp8, create=True
        ),
        mock.patch.object(
            modelopt_quant, "per_tensor_dequantize", _per_tensor_dequantize_as_on_cuda
        ),
    ):
        yield


def source_tensors(ckpt: Path, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The layer's raw checkpoint tensors, named `e.{gate,up,down}_proj.param` (Mixtral's
    w1/w3/w2 renamed, as SGLang's Mixtral maps them), in the order SGLang's default loader
    reads them: the shards in sorted order, each shard's tensors by sorted name (it matters
    where SGLang keeps the last of two values: NVFP4's w13 input scale)."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    for name, shard in sorted(index.items(), key=lambda kv: (kv[1], kv[0])):
        if not name.startswith(prefix + "."):
            continue
        e, proj, param = name[len(prefix) + 1 :].split(".", 2)
        with safe_open(ckpt / shard, framework="pt") as f:
            yield f"{e}.{MIXTRAL_NAMES.get(proj, proj)}.{param}", f.get_tensor(name)


def load_gpt_oss(layer, ckpt: Path, prefix: str) -> None:
    """SGLang's gpt-oss MXFP4 expert loader, `GptOssForCausalLM._load_mxfp4_experts_weights`
    (it does the TP split of the fused experts), run on a stand-in model that holds only this
    layer at its prefix and the config fields it reads."""
    import types

    from sglang.srt.models.gpt_oss import GptOssForCausalLM

    cfg = json.loads((ckpt / "config.json").read_text())
    model = torch.nn.Module()
    parent = model
    *path, last = prefix.split(".")
    for part in path:
        child = torch.nn.Module()
        parent.add_module(part, child)
        parent = child
    parent.add_module(last, layer)
    model.config = types.SimpleNamespace(
        intermediate_size=cfg["intermediate_size"], num_local_experts=cfg["num_local_experts"]
    )
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for name, shard in sorted(index.items()):
            if name.startswith(prefix + "."):
                with safe_open(ckpt / shard, framework="pt") as f:
                    yield name, f.get_tensor(name)

    loaded = GptOssForCausalLM._load_mxfp4_experts_weights(model, weights())
    assert len(loaded) == 6, loaded


def load(layer, ckpt: Path, prefix: str) -> None:
    """The layer's own weight loader, called as SGLang's model classes call it: the checkpoint
    name mapped through `FusedMoE.make_expert_params_mapping` to the parameter, with the
    expert id and shard id it gives."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    cfg = json.loads((ckpt / "config.json").read_text())
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg["num_local_experts"]
    # Nemotron-H's non-gated experts: its up_proj is FusedMoE's w1 (models/nemotron_h.py)
    names = ("up_proj", "") if _model_type(ckpt) == "nemotron_h" else ("gate_proj", "up_proj")
    mapping = FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name=names[0],
        ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name=names[1],
        num_experts=experts,
    )
    params = dict(layer.named_parameters())
    # DefaultModelLoader.load_weights_and_postprocess renames MXFP8 scales so
    mxfp8 = _algo(ckpt) == "MXFP8"
    for name, tensor in source_tensors(ckpt, prefix):
        if mxfp8 and name.endswith(".weight_scale"):
            name += "_inv"
        full = "experts." + name
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name not in full:
                continue
            mapped = full.replace(weight_name, param_name)
            param = params[mapped[len("experts.") :]]
            param.weight_loader(param, tensor, mapped, shard_id=shard_id, expert_id=expert_id)
            break
        else:
            raise AssertionError(f"{name}: no SGLang parameter takes it")


def _model_type(ckpt: Path) -> str | None:
    return json.loads((ckpt / "config.json").read_text()).get("model_type")


def _algo(ckpt: Path) -> str | None:
    cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config") or {}
    return cfg.get("quant_algo")


def process(layer) -> None:
    layer.quant_method.process_weights_after_loading(layer)


def build(backend: str, tp: int, rank: int, ckpt: Path, prefix: str, ep: int = 1):
    """SGLang's layer for rank `rank` of `tp` (with `ep`: of `--tp tp --ep-size ep`), loaded
    and processed by its own code (backend "mxfp4-cutlass": gpt-oss on SM90)."""
    oss = _model_type(ckpt) == "gpt_oss"
    fp4 = _algo(ckpt) in ("NVFP4", "MXFP8") or oss
    sm90 = backend == "mxfp4-cutlass"
    with (
        sglang_context(backend, tp, rank, ep),
        hopper() if sm90 else blackwell(oss) if fp4 else contextlib.nullcontext(),
        cuda_gate() if _algo(ckpt) == "MXFP8" else contextlib.nullcontext(),
        fp8_quant() if _algo(ckpt) == "FP8" else contextlib.nullcontext(),
    ):
        layer = make_layer(prefix, ckpt)
        if ep == 1:
            assert (layer.moe_tp_size, layer.moe_tp_rank) == (tp, rank)
        if _model_type(ckpt) == "gpt_oss":
            load_gpt_oss(layer, ckpt, prefix)
        else:
            load(layer, ckpt, prefix)
        process(layer)
    return layer


def params(layer) -> dict[str, torch.Tensor]:
    return {n: p.data for n, p in layer.named_parameters(recurse=False)}


def layer_state(layer) -> dict[str, object]:
    """What SGLang's processing leaves on the layer and its runner, besides the parameters:
    plain values as repr (enums, classes by name) and tensors as (dtype, shape, bytes), keyed
    `layer.<attr>`, `layer.moe_runner_config.<field>`, `layer.runner.<attr>` ..."""
    import enum

    state: dict[str, object] = {}
    skip = {"quant_config", "dispatcher", "layer"}

    def collect(v: object, path: str, depth: int) -> None:
        if isinstance(v, torch.nn.Parameter):
            return  # params() has them
        if isinstance(v, torch.Tensor):
            state[path] = (str(v.dtype), tuple(v.shape), _bytes(v))
        elif isinstance(v, enum.Enum):
            state[path] = str(v)
        elif isinstance(v, (int, float, str, bool, torch.dtype, type(None))):
            state[path] = v
        elif isinstance(v, (tuple, list)):
            for i, x in enumerate(v):
                collect(x, f"{path}[{i}]", depth)
        elif isinstance(v, dict):
            for k, x in v.items():
                collect(x, f"{path}[{k!r}]", depth)
        elif depth > 0 and hasattr(v, "__dict__") and not isinstance(v, torch.nn.Module):
            state[path] = type(v).__name__
            for k, x in sorted(vars(v).items()):
                if k not in skip:
                    collect(x, f"{path}.{k}", depth - 1)
        else:
            state[path] = type(v).__name__

    attrs = {**vars(layer), **layer._modules, **layer._buffers}
    internals = set(vars(torch.nn.Module()))  # nn.Module's own bookkeeping
    for k, v in sorted(attrs.items()):
        if k in internals or k.startswith("__"):
            continue  # (single-underscore ones stay: processing leaves some, e.g. NVFP4's)
        if k in ("quant_method", "quant_config", "dispatcher"):
            state[f"layer.{k}"] = type(v).__name__
            continue
        collect(v, f"layer.{k}", 2)
    for k, v in sorted(vars(layer.quant_method).items()):
        if k not in skip and k != "runner":
            collect(v, f"layer.quant_method.{k}", 2)
    return state


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy())
