"""fi_convert/servers/vllm/: weight updates into a model vLLM 0.33 loaded with `--load-format
fi-convert`, through vLLM's own `reload_weights` (what `collective_rpc("reload_weights", ...)`
runs on each worker, as RL frameworks call it; `update_weights` of the weight-transfer engine
loads through the same layerwise reload). A checkpoint-format update goes through vLLM's own
processing and ends equal to vLLM's own load of that checkpoint; a reload from disk of an
fi-convert output, whose experts are kernel layouts, is refused in one line."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.reload.inplace import reload_weights

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.servers.vllm.checks import PluginError
from fi_convert.servers.vllm.loader import FiConvertModelLoader
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import vllm_moe as vm

# (scheme, spec, layer prefix): a method with a pre-processed mode (fp8-block), and one the
# plugin sets up with the end of vLLM's processing (fp8-tensor, ModelOpt: KERNEL_ONLY)
CASES = {
    "deepseek-fp8-block": (
        "fp8-block",
        Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=256, shards=2),
        "model.layers.1.mlp.experts",
    ),
    "qwen3-fp8-tensor": (
        "fp8-tensor",
        Spec("qwen3-moe", layers=1, experts=6, hidden=128, intermediate=200, quant="fp8-tensor"),
        "model.layers.0.mlp.experts",
    ),
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Per case: the checkpoint the output is made of, a later one of the same shapes (the
    trainer's next weights: another seed), and the output (TRT-LLM, TP 2)."""
    root = tmp_path_factory.mktemp("updates")
    done: dict = {}

    def get(case: str) -> tuple[Path, Path, Path]:
        if case not in done:
            scheme, spec, _ = CASES[case]
            src = write_checkpoint(root / case / "src", spec)
            new = write_checkpoint(root / case / "new", Spec(**{**vars(spec), "seed": 7}))
            out = root / case / "out"
            convert(src, out, Options(SchemeName(scheme), Backend.TRTLLM, 2), device="cpu")
            done[case] = src, new, out
        return done[case]

    return get


class Model(torch.nn.Module):
    """A model holding one vLLM MoE layer, loading the layer's checkpoint tensors as vLLM's
    model classes do (the layer's own expert weight loader); others are taken by name."""

    def __init__(self, experts: torch.nn.Module, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.add_module("moe", experts)

    def load_weights(self, weights):
        def mine():
            for name, t in weights:
                if name.startswith(self.prefix + "."):
                    yield name[len(self.prefix) + 1 :], t

        return {f"moe.{n}" for n in self.moe.load_weights(mine())}


def _config(path: Path):
    """What `reload_weights` reads of vLLM's config for a model served from `path`."""
    model = types.SimpleNamespace(
        model=str(path), revision=None, quantization="fp8", dtype=torch.bfloat16,
        model_weights="", hf_config=None,
    )  # fmt: skip
    return types.SimpleNamespace(
        model_config=model, load_config=LoadConfig(load_format="fi-convert"), lora_config=None
    )


def _served(src: Path, out: Path, prefix: str) -> Model:
    """The plugin's load of `out` (call inside vllm_context), with the metadata vLLM records
    for reloading when it builds the model (`initialize_model`)."""
    model = Model(vm.make_layer(prefix, src, 2), prefix)
    record_metadata_for_reloading(model)
    FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_weights(
        model, _config(out).model_config
    )
    vm.process(model)
    return model


def _checkpoint_tensors(ckpt: Path, prefix: str):
    """The layer's checkpoint tensors, as the model hands them on (Mixtral's renamed)."""
    for name, t in vm.source_tensors(ckpt, prefix):
        yield f"{prefix}.{name}", t


def _theirs(ckpt: Path, prefix: str, rank: int) -> torch.nn.Module:
    """vLLM's own load of `ckpt`: its expert weight loader, its processing."""
    with vm.vllm_context("trtllm", 2, rank):
        layer = vm.make_layer(prefix, ckpt, 2)
        vm.vllm_load_and_process(layer, ckpt, prefix)
    return layer


def _params(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.data.clone() for n, p in layer.named_parameters(recurse=False)}


UPDATES = [
    ("deepseek-fp8-block", how, rank)
    for how in ("iterator", "weights_path", "transfer")
    for rank in (0, 1)
]


@pytest.mark.parametrize(("case", "how", "rank"), UPDATES)
def test_a_checkpoint_format_update_ends_as_vllms_own_load_of_it(ckpts, case, how, rank):
    """`reload_weights` with the weights (`weights_iterator`), from a checkpoint on disk
    (`weights_path`), and the weight-transfer engines' `start_weight_update` /
    `update_weights` (in chunks) / `finish_weight_update`, which are vLLM's layerwise reload
    around the model's `load_weights` (distributed/weight_transfer/ipc_engine.py)."""
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    from fi_convert.servers.vllm import register

    register()
    (src, new, out), prefix = ckpts(case), CASES[case][2]
    theirs = _theirs(new, prefix, rank)
    with vm.vllm_context("trtllm", 2, rank):
        model = _served(src, out, prefix)
        before = _params(model.moe)
        if how == "iterator":
            reload_weights(_config(out), model, _checkpoint_tensors(new, prefix), None, True)
        elif how == "weights_path":
            reload_weights(_config(out), model, None, str(new), True)
        else:
            tensors = list(_checkpoint_tensors(new, prefix))
            initialize_layerwise_reload(model)
            model.load_weights(tensors[: len(tensors) // 2])
            model.load_weights(tensors[len(tensors) // 2 :])
            finalize_layerwise_reload(model, _config(out).model_config)
    assert any(not torch.equal(before[n], p) for n, p in _params(theirs).items())
    vm.assert_same_layer(theirs, model.moe)  # parameters, sizes, kernel and its state


@pytest.mark.parametrize("case", ["deepseek-fp8-block"])
def test_a_kernel_format_update_copies_into_the_served_layout(ckpts, case):
    """`is_checkpoint_format=False`: tensors in the served layout, copied by name into the
    parameters, which have vLLM's own shapes and layouts."""
    (src, new, out), prefix = ckpts(case), CASES[case][2]
    theirs = _theirs(new, prefix, 0)
    with vm.vllm_context("trtllm", 2, 0):
        model = _served(src, out, prefix)
        kernel = [(f"moe.{n}", p) for n, p in _params(theirs).items()]
        reload_weights(_config(out), model, kernel, None, False)
    vm.assert_same_layer(theirs, model.moe)


def test_a_reload_from_disk_of_an_output_is_refused_before_vllm_touches_the_model(ckpts):
    from fi_convert.servers.vllm import register

    register()
    (src, _, out), prefix = ckpts("deepseek-fp8-block"), CASES["deepseek-fp8-block"][2]
    for where in (None, str(out)):  # the output it serves, or another one
        with vm.vllm_context("trtllm", 2, 0):
            model = _served(src, out, prefix)
            before = _params(model.moe)
            with pytest.raises(PluginError) as e:
                reload_weights(_config(out), model, None, where, True)
        assert str(e.value) == (
            f"fi-convert: {out}: reload_weights from disk reads an fi-convert output's experts, "
            "which are kernel layouts vLLM would process again; reload from the source "
            "checkpoint (weights_path=CHECKPOINT_DIR, or weights in checkpoint format), or "
            "start vLLM on the new output"
        )
        after = _params(model.moe)
        assert all(torch.equal(before[n], after[n]) for n in before)


def test_where_vllms_own_reload_fails_it_fails_alike_never_silently(ckpts):
    """vLLM 0.33's layerwise reload of a ModelOpt FP8 MoE layer fails on its own load (its
    processing made the per-expert scales of other shapes than the layer was built with): on
    a model served from an output it fails alike, with vLLM's own error, rather than load."""
    (src, new, out), prefix = ckpts("qwen3-fp8-tensor"), CASES["qwen3-fp8-tensor"][2]
    errors = []
    for served in (False, True):
        with vm.vllm_context("trtllm", 2, 1):
            if served:
                model = _served(src, out, prefix)
            else:
                model = Model(vm.make_layer(prefix, src, 2), prefix)
                record_metadata_for_reloading(model)
                list(model.moe.load_weights(vm.source_tensors(src, prefix)))
                vm.process(model)
            with pytest.raises(IndexError) as e:
                reload_weights(_config(out), model, _checkpoint_tensors(new, prefix), None, True)
            errors.append(str(e.value))
    assert errors[0] == errors[1]
