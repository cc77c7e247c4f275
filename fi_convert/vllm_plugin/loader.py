"""`--load-format fi-convert`: a vLLM 0.33 model loader for fi-convert outputs.

Non-expert tensors go through the model's own `load_weights`, as with vLLM's default loader.
The converted MoE tensors bypass it (its expert weight loader would TP-split them again): each
layer's rank slice is read straight into the layer's parameters, and the layer's processing is
replaced by kernel setup only. Every other module is processed by vLLM's own driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from .. import manifest as mf
from ..errors import FiConvertError
from ..loader import OutputReader
from . import checks, experts
from .checks import PluginError

logger = init_logger("vllm.plugins.fi_convert")


def _capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def moe_layers(model: torch.nn.Module) -> dict[str, tuple[str, RoutedExperts]]:
    """The model's MoE layers, keyed by their checkpoint prefix: (module name, module)."""
    return {
        mod.layer_name: (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, RoutedExperts)
    }


class FiConvertModelLoader(DefaultModelLoader):
    """Loads an fi-convert output folder (or a Hub repo of one) with zero MoE preprocessing."""

    def __init__(self, load_config: LoadConfig) -> None:
        # vLLM's default loader refuses load formats it does not know
        super().__init__(dataclasses.replace(load_config, load_format="auto"))
        self._dir: Path | None = None
        self._manifest: dict | None = None

    def _output(self, model_config: ModelConfig) -> tuple[Path, dict]:
        if self._dir is None or self._manifest is None:
            self._dir = self._local_dir(model_config)
            try:
                self._manifest = mf.read(self._dir)
            except FiConvertError as e:
                raise PluginError(f"{e}") from None
        return self._dir, self._manifest

    def _local_dir(self, model_config: ModelConfig) -> Path:
        local = Path(model_config.model)
        if local.is_dir():
            return local
        from huggingface_hub import snapshot_download

        try:
            return Path(
                snapshot_download(
                    model_config.model,
                    revision=model_config.revision,
                    cache_dir=self.load_config.download_dir,
                    allow_patterns=["*.safetensors", "*.json"],
                )
            )
        except Exception as e:  # huggingface_hub's errors: missing repo, token, offline...
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PluginError(
                f"{model_config.model}: not a local folder, and the Hub download failed "
                f"({first}); check the repo id, HF_TOKEN and the network"
            ) from None

    def download_model(self, model_config: ModelConfig) -> None:
        self._output(model_config)

    def load_model(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = ""
    ) -> torch.nn.Module:
        root, m = self._output(model_config)
        pc = vllm_config.parallel_config
        checks.check_output(
            m,
            str(root),
            tp_size=pc.tensor_parallel_size,
            use_ep=pc.enable_expert_parallel,
            dp_size=pc.data_parallel_size * getattr(pc, "prefill_context_parallel_size", 1),
            eplb=pc.enable_eplb,
            vllm_version=checks.vllm_version(),
            flashinfer_version=checks.installed("flashinfer-python"),
            capability=_capability(),
            test_cpu=experts.test_cpu_mode() is not None,
        )
        return super().load_model(vllm_config, model_config, prefix)

    def load_weights(self, model: Any, model_config: ModelConfig) -> None:
        root, m = self._output(model_config)
        mode = experts.test_cpu_mode()
        layers = moe_layers(model)
        missing = sorted(set(m["layers"]) - set(layers))
        extra = sorted(set(layers) - set(m["layers"]))
        if missing or extra:
            which = f"has no MoE layer {missing[0]}" if missing else f"lacks {extra[0]}"
            raise PluginError(
                f"{root}: the model vLLM built {which} of the output; serve the output with "
                "its own config.json (converted from another model?)"
            )
        for lp, (_, mod) in layers.items():
            if mode is None:
                checks.check_layer(m, str(root), lp, mod.quant_method)
            split = mod.moe_config.moe_parallel_config
            checks.check_split(m, str(root), lp, split, mod.global_num_experts)
        with OutputReader(root, m) as reader:
            loaded = set(model.load_weights(_dense_weights(reader)) or ())
            # this process is one rank of every layer: the last layer's split names it
            logger.info(
                "fi-convert: loading %d MoE layers for %s rank %d/%d from %s",
                len(layers),
                *(
                    ("EP", split.ep_rank, split.ep_size)
                    if split.use_ep
                    else ("TP", split.tp_rank, split.tp_size)
                ),
                root,
            )
            for lp, (name, mod) in layers.items():
                rank = mod.moe_config.moe_parallel_config.tp_rank
                for p in experts.install(mod, reader, lp, rank):
                    loaded.add(f"{name}.{p}")
                meta = m["layers"][lp]
                if mode is None:
                    experts.set_up_kernel_only(mod, meta)
                else:
                    experts.undo_for_cpu(mod, m, mode)
        if model_config.quantization is None:
            self.track_weights_loading(model, loaded)


def _dense_weights(reader: OutputReader) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the output that is not a converted expert tensor, shard by shard."""
    for shard in reader.shards():
        with safe_open(reader.root / shard, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if not reader.is_expert_tensor(name):
                    yield name, f.get_tensor(name)
