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

PREFIX = "model.layers.1.mlp.experts"
SPEC = Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=256, shards=2)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """The checkpoint the output is made of, and a later one of the same shapes (the trainer's
    next weights), and the output."""
    root = tmp_path_factory.mktemp("updates")
    src = write_checkpoint(root / "src", SPEC)
    new = write_checkpoint(root / "new", Spec(**{**vars(SPEC), "seed": 7}))
    out = root / "out"
    convert(src, out, Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 2), device="cpu")
    return src, new, out


class Model(torch.nn.Module):
    """A model holding one vLLM MoE layer, loading the layer's checkpoint tensors as vLLM's
    model classes do (the layer's own expert weight loader); others are taken by name."""

    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.add_module("moe", experts)

    def load_weights(self, weights):
        def mine():
            for name, t in weights:
                if name.startswith(PREFIX + "."):
                    yield name[len(PREFIX) + 1 :], t

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


def _served(src: Path, out: Path) -> Model:
    """The plugin's load of `out` (call inside vllm_context), with the metadata vLLM records
    for reloading when it builds the model (`initialize_model`)."""
    model = Model(vm.make_layer(PREFIX, src, 2))
    record_metadata_for_reloading(model)
    FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_weights(
        model, _config(out).model_config
    )
    vm.process(model)
    return model


def _checkpoint_tensors(ckpt: Path):
    for name, t in vm.source_tensors(ckpt, PREFIX):
        yield f"{PREFIX}.{name}", t


def _theirs(ckpt: Path, rank: int) -> torch.nn.Module:
    """vLLM's own load of `ckpt`: its expert weight loader, its processing."""
    with vm.vllm_context("trtllm", 2, rank):
        layer = vm.make_layer(PREFIX, ckpt, 2)
        vm.vllm_load_and_process(layer, ckpt, PREFIX)
    return layer


def _params(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.data.clone() for n, p in layer.named_parameters(recurse=False)}


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("how", ["iterator", "weights_path", "transfer"])
def test_a_checkpoint_format_update_ends_as_vllms_own_load_of_it(ckpts, rank, how):
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
    src, new, out = ckpts
    theirs = _theirs(new, rank)
    with vm.vllm_context("trtllm", 2, rank):
        model = _served(src, out)
        before = _params(model.moe)
        if how == "iterator":
            reload_weights(_config(out), model, _checkpoint_tensors(new), None, True)
        elif how == "weights_path":
            reload_weights(_config(out), model, None, str(new), True)
        else:
            tensors = list(_checkpoint_tensors(new))
            initialize_layerwise_reload(model)
            model.load_weights(tensors[: len(tensors) // 2])
            model.load_weights(tensors[len(tensors) // 2 :])
            finalize_layerwise_reload(model, _config(out).model_config)
    assert any(not torch.equal(before[n], p) for n, p in _params(theirs).items())
    vm.assert_same_layer(theirs, model.moe)  # parameters, sizes, kernel and its state


def test_a_reload_from_disk_of_an_output_is_refused_before_vllm_touches_the_model(ckpts):
    from fi_convert.servers.vllm import register

    register()
    src, _, out = ckpts
    for where in (None, str(out)):  # the output it serves, or another one
        with vm.vllm_context("trtllm", 2, 0):
            model = _served(src, out)
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
