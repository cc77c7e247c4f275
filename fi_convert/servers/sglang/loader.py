"""`--load-format fi-convert`: an SGLang 0.5.23 model loader for fi-convert outputs.

It builds the model as SGLang's `DefaultModelLoader.load_model` does (SGLang's own quantization
config and model initialization). Non-expert tensors go through SGLang's own
`load_weights_only` (the model's `load_weights`, `format.dense`).
The converted MoE tensors bypass it (its expert weight loader would TP-split and pad them
again): each layer's rank slice is read with fi-convert's fast read path straight into the
layer's parameters, and the layer gets kernel setup only (experts.finish). Every other module
is processed by SGLang's own `process_weights_after_loading`, as its `postprocess_weights` does.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch
from sglang.srt.configs.load_config import LoadConfig, LoadFormat
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
from sglang.srt.model_loader.loader import (
    DefaultModelLoader,
    _get_quantization_config,
    _initialize_model,
    _modules_with_quant_method,
    device_loading_context,
)
from sglang.srt.model_loader.utils import set_default_torch_dtype

from ...bulk_read import HostBuffers, host_buffers
from ...errors import FiConvertError
from ...format.dense import OtherTensors
from ...format.reader import OutputReader
from . import checks, experts
from .checks import PluginError

logger = logging.getLogger("sglang.plugins.fi_convert")
TEST_CPU_ENV = "FI_CONVERT_SGLANG_TEST_CPU"  # test-only: "1" skips the GPU and FlashInfer checks


def _capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def moe_layers(model: torch.nn.Module, output: Collection[str] = ()) -> dict[str, Any]:
    """The model's FusedMoE layers, keyed by the checkpoint prefix: their module name, or
    where the `output` names a layer by the prefix SGLang built it with (its `layer_name`)
    and not by its module name, that prefix (Qwen3-VL-MoE: the checkpoint's and the layer's
    model.language_model.layers.L.mlp.experts, a module model.layers.L.mlp.experts, which its
    load_weights renames to)."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FusedMoE):
            built = getattr(mod, "layer_name", name)
            out[built if name not in output and built in output else name] = mod
    return out


def check_output(manifest: dict, root: str) -> None:
    """The manifest against the running SGLang's arguments and machine (before any load)."""
    import os

    from sglang.srt.runtime_context import get_exec, get_parallel

    checks.check_manifest(
        manifest,
        root,
        tp_size=get_parallel().moe_tp_size,
        ep_size=get_parallel().moe_ep_size,
        eplb=bool(get_exec().moe.enable_eplb),
        redundant=int(get_exec().moe.ep_num_redundant_experts or 0),
        placement=str(get_exec().moe.init_expert_location or "trivial"),
        moe_dp_size=int(get_parallel().moe_dp_size or 1),
        a2a=_a2a_backend(),
        moe_runner_backend=str(get_model_runner_backend()),
        sglang_version=checks.installed("sglang") or "0",
    )
    if os.environ.get(TEST_CPU_ENV) != "1":
        checks.check_device(
            manifest,
            root,
            flashinfer_version=checks.installed("flashinfer-python"),
            capability=_capability(),
        )


def _a2a_backend() -> str:
    """--moe-a2a-backend as SGLang resolved it ('none' without one)."""
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    backend = get_moe_a2a_backend()
    return str(getattr(backend, "value", backend))


def get_model_runner_backend() -> str:
    """--moe-runner-backend as SGLang resolved it (e.g. 'flashinfer_trtllm')."""
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    backend = get_moe_runner_backend()
    return str(getattr(backend, "value", backend))


class FiConvertModelLoader(DefaultModelLoader):
    """Loads an fi-convert output folder with zero MoE preprocessing."""

    def __init__(self, load_config: LoadConfig) -> None:
        # SGLang's default loader takes the output's shards as safetensors
        super().__init__(dataclasses.replace(load_config, load_format=LoadFormat.SAFETENSORS))
        self._buffers: HostBuffers | None = None

    def download_model(self, model_config: Any) -> None:
        self._root(model_config)

    def _root(self, model_config: Any) -> Path:
        """The output folder: --model-path, or the snapshot of the Hub repo it names."""
        return checks.local_output(
            str(model_config.model_path),
            revision=getattr(model_config, "revision", None),
            cache=self.load_config.download_dir,
        )

    def load_model(self, *, model_config: Any, device_config: Any) -> torch.nn.Module:
        root = self._root(model_config)
        manifest = checks.read_output(root)
        check_output(manifest, checks.output_name(str(model_config.model_path), root))
        target_device = torch.device(device_config.device)
        if target_device.type == "cuda":  # pinned while SGLang builds the model
            self._buffers = host_buffers().allocate(background=True)
        try:
            quant_config = _get_quantization_config(model_config, self.load_config)
            with set_default_torch_dtype(model_config.dtype):
                with target_device:
                    model = _initialize_model(model_config, self.load_config, quant_config)
                self.load_output(model, root, manifest, target_device)
        finally:
            if self._buffers is not None:
                self._buffers.free()
                self._buffers = None
        self.counter_after_loading_weights = time.perf_counter()
        return model.eval()

    def _get_weights_iterator(self, source: Any, **kwargs: Any) -> Iterator:
        """SGLang's weight update from disk (`update_weights_from_disk`) reads through this,
        then `load_weights_and_postprocess`, which would take the output's converted tensors
        for checkpoint tensors: refused, before the model is touched."""
        raise PluginError(
            f"{source.model_or_path}: updating weights from an fi-convert output is not "
            "supported; update from a source checkpoint with load_format 'auto'"
        )

    def load_output(
        self, model: torch.nn.Module, root: Path, manifest: dict, target_device: torch.device
    ) -> None:
        """The output's tensors into `model` (built by SGLang), then its post-load step."""
        layers = moe_layers(model, manifest["layers"])
        nextn = checks.nextn_layers(manifest, getattr(model, "config", None))
        checks.check_layers(manifest, str(root), layers, skipped=nextn)
        t0 = time.perf_counter()
        with OutputReader(root, manifest) as reader:
            bulk = reader.bulk(_device(layers), buffers=self._buffers)
            try:
                for prefix, layer in layers.items():
                    experts.install(layer, reader, prefix, layer.moe_tp_rank, bulk)
                bulk.start()  # the experts' bytes are read beside the dense tensors
                others = OtherTensors(reader)
                DefaultModelLoader.load_weights_only(model, iter(others), target_device)
                stats = bulk.wait()
            except FiConvertError as e:
                bulk.abort()
                raise PluginError(f"{e}") from None
            except BaseException:
                bulk.abort()
                raise
        postprocess(model, set(layers.values()), target_device)
        first = next(iter(layers.values()), None)
        logger.info(
            "fi-convert: MoE TP rank %s, EP rank %s/%s loaded %d MoE layers, %.2f GB in %.2f s, "
            "from %s",
            getattr(first, "moe_tp_rank", 0),
            getattr(first, "moe_ep_rank", 0),
            getattr(first, "moe_ep_size", 1),
            len(layers),
            stats.bytes / 1e9,
            time.perf_counter() - t0,
            root,
        )


def postprocess(model: torch.nn.Module, converted: set, target_device: torch.device) -> None:
    """SGLang's `DefaultModelLoader.postprocess_weights`, with kernel setup only for the
    converted MoE layers."""
    for module, quant_method in _modules_with_quant_method(model):
        with device_loading_context(module, target_device):
            if module in converted:
                experts.finish(module)
            else:
                quant_method.process_weights_after_loading(module)


def _device(layers: dict[str, Any]) -> torch.device:
    """Where the MoE parameters live (the reads go there)."""
    for layer in layers.values():
        for p in layer.parameters(recurse=False):
            return p.device
    return torch.device("cpu")
