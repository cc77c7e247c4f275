"""`--load-format fi-convert`: a vLLM 0.33 model loader for fi-convert outputs.

Non-expert tensors go through the model's own `load_weights`, as with vLLM's default loader
(`format.dense`).
The converted MoE tensors bypass it (its expert weight loader would TP-split them again): each
layer's rank slice is read straight into the layer's parameters, and the layer's processing is
replaced by kernel setup only. Every other module is processed by vLLM's own driver.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from ...bulk_read import HostBuffers, ReadStats, host_buffers
from ...errors import FiConvertError
from ...format import manifest as mf
from ...format.dense import OtherTensors
from ...format.reader import OutputReader
from . import checks, experts
from .checks import PluginError

logger = init_logger("vllm.plugins.fi_convert")


def _capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def moe_layers(
    model: torch.nn.Module, output: Collection[str] = ()
) -> dict[str, tuple[str, RoutedExperts]]:
    """The model's MoE layers, keyed by their checkpoint prefix: (module name, module). A
    layer vLLM names otherwise than the checkpoint (its model's `hf_to_vllm_mapper`: Qwen3-VL-
    MoE's model.language_model.layers.L is vLLM's language_model.model.layers.L) is keyed by
    the `output`'s prefix that maps to it."""
    built = {
        mod.layer_name: (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, RoutedExperts)
    }
    mapped = {_vllm_name(model, p): p for p in output if p not in built}
    return {mapped.get(n, n): v for n, v in built.items()}


def _vllm_name(model: torch.nn.Module, prefix: str) -> str:
    """The name vLLM's model gives the checkpoint's MoE layer `prefix`, by its own mapper."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None:
        return prefix
    probe = f"{prefix}.w13_weight"
    name = mapper._map_name(probe)
    return name.removesuffix(".w13_weight") if name else prefix


class FiConvertModelLoader(DefaultModelLoader):
    """Loads an fi-convert output folder (or a Hub repo of one) with zero MoE preprocessing."""

    def __init__(self, load_config: LoadConfig) -> None:
        # vLLM's default loader refuses load formats it does not know
        super().__init__(dataclasses.replace(load_config, load_format="auto"))
        self._dir: Path | None = None
        self._manifest: dict | None = None
        self._buffers: HostBuffers | None = None

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
        from ...hub.fetch import fetch_output  # a Hub repo id: its snapshot, fetched once

        try:
            return fetch_output(
                model_config.model,
                revision=model_config.revision,
                cache=self.load_config.download_dir,
            )
        except FiConvertError as e:
            raise PluginError(f"{e}") from None

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
        if torch.cuda.is_available():  # pinned while vLLM builds the model
            self._buffers = host_buffers().allocate(background=True)
        try:
            return super().load_model(vllm_config, model_config, prefix)
        finally:
            if self._buffers is not None:
                self._buffers.free()
                self._buffers = None

    def load_weights(self, model: Any, model_config: ModelConfig) -> None:
        root, m = self._output(model_config)
        mode = experts.test_cpu_mode()
        layers = moe_layers(model, m["layers"])
        # the multi-token-prediction layers vLLM's model skips (a draft model's), by its rule
        spec = mtp_layers(m, getattr(model_config, "hf_config", None))
        missing = sorted(set(m["layers"]) - set(layers) - spec)
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
            checks.check_split(
                m, str(root), lp, mod.moe_config.moe_parallel_config, mod.global_num_experts
            )
        moe, dense = _Clock(), _Clock()
        with OutputReader(root, m) as reader:
            bulk = reader.bulk(_device(layers), buffers=self._buffers)
            loaded: set[str] = set()
            try:
                for lp, (name, mod) in layers.items():
                    rank = mod.moe_config.moe_parallel_config.tp_rank
                    for p in experts.install(mod, reader, lp, rank, bulk):
                        loaded.add(f"{name}.{p}")
                moe(bulk.start)  # the experts' bytes are read beside the dense tensors
                others = OtherTensors(reader)
                loaded |= set(dense(lambda: model.load_weights(iter(others))))
                dense.nbytes = others.nbytes
                stats = bulk.wait()
            except FiConvertError as e:
                bulk.abort()
                raise PluginError(f"{e}") from None
            except (KeyboardInterrupt, SystemExit):
                bulk.abort()
                logger.error(
                    "fi-convert: loading %s interrupted; its reader threads are stopped and "
                    "their pinned memory freed: start the server again",
                    root,
                )
                raise
            except BaseException:
                bulk.abort()
                raise
        for lp, (_, mod) in layers.items():
            if mode is None:
                experts.set_up_kernel_only(mod, m["layers"][lp])
            else:
                experts.undo_for_cpu(mod, m, mode)
        # this process is one rank of every layer: any layer's split names it
        split = next(iter(layers.values()))[1].moe_config.moe_parallel_config if layers else None
        logger.info("%s", _load_line(root, len(layers), split, moe, stats, dense))
        if model_config.quantization is None:
            self.track_weights_loading(model, loaded)


def mtp_layers(manifest: dict, config: Any) -> set[str]:
    """The output's MoE layers that vLLM's model does not build: the multi-token-prediction
    layers a DeepSeek-V3/R1 checkpoint ships after its decoder layers (`model.layers.61` of 61),
    whose weights vLLM's model skips (`get_spec_layer_idx_from_weight_name`, vLLM's own rule: a
    draft model reads them)."""
    from vllm.model_executor.models.utils import get_spec_layer_idx_from_weight_name

    if config is None:
        return set()
    return {
        lp
        for lp in manifest["layers"]
        if get_spec_layer_idx_from_weight_name(config, lp + ".") is not None
    }


class _Clock:
    """The wall time of the calls it makes, and a byte count."""

    def __init__(self) -> None:
        self.nbytes, self.seconds = 0, 0.0

    def __call__(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn() or ()
        finally:
            self.seconds += time.perf_counter() - t0


def _device(layers: dict[str, tuple[str, RoutedExperts]]) -> torch.device:
    """Where the MoE parameters live (the reads go there)."""
    for _, mod in layers.values():
        for p in mod.parameters(recurse=False):
            return p.device
    return torch.device("cpu")


def _load_line(root: Path, n: int, split: Any, moe: _Clock, stats: ReadStats, dense: _Clock) -> str:
    """The one line a rank logs at the end of its load."""
    who = "rank"
    if split is not None:
        who = (
            f"EP rank {split.ep_rank}/{split.ep_size}"
            if split.use_ep
            else f"TP rank {split.tp_rank}/{split.tp_size}"
        )
    moe_s = moe.seconds + stats.seconds
    return (
        f"fi-convert: {who} loaded {n} MoE layers, {_gb(stats.bytes)} in {moe_s:.2f} s "
        f"({stats.bytes / moe_s / 1e9 if moe_s else 0:.1f} GB/s, {stats.threads} thread"
        f"{'s' if stats.threads != 1 else ''}, "
        f"{stats.pinned_peak / 2**20:.0f} MiB pinned); non-expert {_gb(dense.nbytes)} "
        f"in {dense.seconds:.2f} s, read beside them; from {root}"
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
