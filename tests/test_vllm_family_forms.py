"""Llama-4 and Qwen3-VL-MoE as published (fused experts stored transposed), Granite-MoE's fused
input_linear/output_linear and Mixtral's gate/up/down_proj names, through vLLM 0.33's
own model code on CPU (tests/family_forms_models.py): the MoE layer built with the model's MoE
block's arguments and loaded by the text model class's own `load_weights` (Llama4Model's fused
and transposed expert loading, Qwen3MoeModel's through MoERunner with
`is_fused_checkpoint_transposed`), then vLLM's post-load processing; against the plugin's load
of fi-convert's output (its tensors into a fresh layer, kernel setup only). Every parameter,
the MoE sizes and the kernel's state are equal, and every parameter vLLM holds is the output's
tensor byte for byte; bf16 on TRT-LLM and CUTLASS, TP 1 and 2, every rank; and vLLM's online
MXFP8 of them on a CUDA GPU (marker `gpu`: its quantization is FlashInfer's CUDA kernel)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from tests import family_forms_models as ffm
from tests import vllm_moe as vm

CASES = [
    (kind, backend, tp, rank)
    for kind in ("llama4", "qwen3_vl_moe", "granitemoe", "step3")
    for backend in ("trtllm", "cutlass")
    for tp in (1, 2)
    for rank in range(tp)
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm-family-forms")
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            if kind.startswith("mixtral"):  # "mixtral-bf16", "mixtral-fp8-tensor"
                made[kind] = ffm.save_mixtral_named(base / kind, kind.split("-", 1)[1])
            elif kind == "step3":
                made[kind] = ffm.save_step3(base / kind)
            else:
                made[kind] = ffm.save(kind, base / kind)
        return made[kind]

    return get


@pytest.fixture(scope="module")
def output(tmp_path_factory, ckpt):
    base = tmp_path_factory.mktemp("vllm-family-forms-out")
    made: dict[tuple, Path] = {}

    def get(kind: str, backend: str, tp: int, scheme: str = "bf16") -> Path:
        key = (kind, backend, tp, scheme)
        if key not in made:
            out = base / "-".join(map(str, key))
            opts = Options(SchemeName(scheme), Backend(backend), tp)
            convert(ckpt(kind), out, opts, device="cpu")
            made[key] = out
        return made[key]

    return get


def _online(scheme: str):
    """vLLM's quantization config for a BF16 source converted to `scheme` (None for bf16):
    `--quantization mxfp8`, its online MXFP8."""
    if scheme == "bf16":
        return None
    from vllm.config.quantization import _ONLINE_SHORTHANDS
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    return OnlineQuantizationConfig(_ONLINE_SHORTHANDS[scheme])


def _quant(kind, ckpt, scheme):
    """vLLM's quantization config: the checkpoint's own (ModelOpt FP8 Mixtral), or online."""
    return vm.quant_config(ckpt) if kind == "mixtral" else _online(scheme)


def _vllm(kind, ckpt, backend, tp, rank, scheme="bf16", device="cpu"):
    """vLLM's own path: the model's load_weights, then its post-load driver."""
    with vm.vllm_context(backend, tp, rank, device=device):
        runner = ffm.make_runner(kind, ckpt, tp, _quant(kind, ckpt, scheme))
        loaded = ffm.vllm_load(kind, runner, ckpt)
        vm.process(runner.routed_experts)
    assert {"w13_weight", "w2_weight"} <= {n.rsplit(".", 1)[-1] for n in loaded}, loaded
    return runner.routed_experts


def _plugin(kind, ckpt, out, backend, tp, rank, scheme="bf16", device="cpu"):
    from fi_convert.format.reader import OutputReader
    from fi_convert.servers.vllm import experts as plugin

    prefix = ffm.spec(kind)["moe"]
    with vm.vllm_context(backend, tp, rank, device=device):
        layer = ffm.make_runner(kind, ckpt, tp, _quant(kind, ckpt, scheme)).routed_experts
        with OutputReader(out) as reader:
            plugin.install(layer, reader, prefix, layer.moe_config.moe_parallel_config.tp_rank)
            plugin.finish(layer, reader.layer(prefix))
    return layer


@pytest.mark.parametrize(("kind", "backend", "tp", "rank"), CASES)
def test_the_models_own_load_equals_the_plugins(ckpt, output, kind, backend, tp, rank):
    src, out = ckpt(kind), output(kind, backend, tp)
    theirs = _vllm(kind, src, backend, tp, rank)
    assert theirs.moe_config.moe_parallel_config.tp_rank == rank
    vm.assert_holds_output_bytes(theirs, out, ffm.spec(kind)["moe"], rank)
    vm.assert_same_layer(theirs, _plugin(kind, src, out, backend, tp, rank))


MIXTRAL = [
    (scheme, backend, tp, rank)
    for scheme in ("bf16", "fp8-tensor")
    for backend in ("trtllm", "cutlass")
    for tp in (1, 2)
    for rank in range(tp)
]


@pytest.mark.parametrize(("scheme", "backend", "tp", "rank"), MIXTRAL)
def test_mixtral_named_gate_up_down_loads_as_vllms_mixtral(ckpt, output, scheme, backend, tp, rank):
    """Mixtral with gate_proj/up_proj/down_proj experts (W8A8 exports), BF16 and ModelOpt
    FP8: vLLM's MixtralModel.load_weights (its mapper renames them w1/w3/w2) equals the
    plugin's load."""
    src, out = ckpt(f"mixtral-{scheme}"), output(f"mixtral-{scheme}", backend, tp, scheme)
    theirs = _vllm("mixtral", src, backend, tp, rank, scheme)
    vm.assert_holds_output_bytes(theirs, out, ffm.MIXTRAL["moe"], rank)
    vm.assert_same_layer(theirs, _plugin("mixtral", src, out, backend, tp, rank, scheme))


def test_control_the_model_reading_the_experts_unturned_differs(ckpt, output):
    """vLLM's Qwen3-VL-MoE turns the published tensors (`is_fused_checkpoint_transposed`):
    the same layer built without it cannot load them (the shapes do not fit), so the
    equality above rests on the turn."""
    src = ckpt("qwen3_vl_moe")
    with vm.vllm_context("trtllm", 1, 0):
        runner = ffm.make_runner("qwen3_vl_moe", src, 1)
        runner.routed_experts.is_fused_checkpoint_transposed = False
        with pytest.raises((AssertionError, RuntimeError, ValueError)):
            ffm.vllm_load("qwen3_vl_moe", runner, src)


GPU_CASES = [
    (kind, tp, rank) for kind in ("llama4", "qwen3_vl_moe") for tp in (1, 2) for rank in range(tp)
]


@pytest.mark.gpu
@pytest.mark.parametrize(("kind", "tp", "rank"), GPU_CASES)
def test_online_mxfp8_equals_the_plugins_on_cuda(ckpt, output, kind, tp, rank):
    """The quantized scheme of these BF16 families: vLLM's online MXFP8 (`--quantization
    mxfp8`) quantizes with FlashInfer's CUDA-only mxfp8_quantize, so this runs on a GPU
    (here fi-convert's MXFP8 of them is checked against FlashInfer's reference pipeline,
    tests/test_family_forms.py). vLLM registers that op with a CUDA kernel from its compiled
    ops (vllm._C): where they are absent, as in the vLLM package the GPU machine is given
    (scripts/device_run.sh: its Python code alone; run there on 2026-12-03, 6 of 6 failed for
    this reason), it cannot run, and says so."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key("vllm::mxfp8_quantize", "CUDA"):
        pytest.skip("vLLM's mxfp8_quantize has no CUDA kernel here (vLLM's compiled ops absent)")
    src, out = ckpt(kind), output(kind, "trtllm", tp, "mxfp8")
    theirs = _vllm(kind, src, "trtllm", tp, rank, "mxfp8", "cuda")
    vm.assert_holds_output_bytes(theirs, out, ffm.spec(kind)["moe"], rank)
    vm.assert_same_layer(theirs, _plugin(kind, src, out, "trtllm", tp, rank, "mxfp8", "cuda"))


class VlmModel(torch.nn.Module):
    """Qwen3-VL-MoE's MoE layers where vLLM's Qwen3VLMoeForConditionalGeneration holds them
    (language_model.model.layers.L.mlp.experts) with its `hf_to_vllm_mapper` (models/
    qwen3_vl.py, Qwen3VLForConditionalGeneration; the class itself imports torchvision, which
    this CPU install lacks); the other tensors are taken by name."""

    def __init__(self, ckpt: Path, tp: int) -> None:
        from vllm.model_executor.models.utils import WeightsMapper

        super().__init__()
        self.hf_to_vllm_mapper = WeightsMapper(
            orig_to_new_prefix={
                "model.visual.": "visual.",
                "lm_head.": "language_model.lm_head.",
                "model.language_model.": "language_model.model.",
            }
        )
        self.seen: dict[str, torch.Tensor] = {}
        self.language_model = torch.nn.Module()
        self.language_model.model = torch.nn.Module()
        self.language_model.model.layers = torch.nn.ModuleList()
        for i in range(2):
            layer = torch.nn.Module()
            layer.mlp = torch.nn.Module()
            name = f"language_model.model.layers.{i}.mlp.experts"
            layer.mlp.experts = ffm.make_runner("qwen3_vl_moe", ckpt, tp, prefix=name)
            self.language_model.model.layers.append(layer)

    def load_weights(self, weights):
        for name, t in weights:
            self.seen[name] = t
        return set()


@pytest.mark.parametrize(("backend", "tp", "rank"), [("trtllm", 1, 0), ("cutlass", 2, 1)])
def test_the_plugins_loader_finds_layers_vllm_renames(ckpt, output, backend, tp, rank):
    """vLLM names Qwen3-VL-MoE's MoE layers by its mapper, not as the checkpoint (and the
    output) does: the plugin's loader maps the output's prefixes with the model's own mapper
    and loads each layer as vLLM's own path does."""
    import types

    from vllm.config.load import LoadConfig

    from fi_convert.servers.vllm.loader import FiConvertModelLoader

    src, out = ckpt("qwen3_vl_moe"), output("qwen3_vl_moe", backend, tp)
    mc = types.SimpleNamespace(model=str(out), revision=None, quantization=None, hf_config=None)
    with vm.vllm_context(backend, tp, rank):
        model = VlmModel(src, tp)
        FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_weights(model, mc)
        vm.process(model)
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" not in model.seen
    assert "model.language_model.embed_tokens.weight" in model.seen  # the rest: the model's
    theirs = _vllm("qwen3_vl_moe", src, backend, tp, rank)  # layer 1, vLLM's own load
    ours = model.language_model.model.layers[1].mlp.experts.routed_experts
    vm.assert_same_layer(theirs, ours)


def test_the_plugin_reads_bf16_backends_by_name():
    """vLLM 0.33's UnquantizedMoeBackend values are "FlashInfer TRTLLM" / "FlashInfer
    CUTLASS" (the other methods' values are their names): a BF16 layer's backend is read by
    the member's name, or every BF16 output would be refused on a real load."""
    import types

    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    from fi_convert.servers.vllm.checks import backend_of

    for member, want in (("FLASHINFER_TRTLLM", "trtllm"), ("FLASHINFER_CUTLASS", "cutlass")):
        method = types.SimpleNamespace(unquantized_backend=UnquantizedMoeBackend[member])
        assert backend_of(method) == want
    assert (
        backend_of(types.SimpleNamespace(unquantized_backend=UnquantizedMoeBackend.TRITON)) is None
    )
