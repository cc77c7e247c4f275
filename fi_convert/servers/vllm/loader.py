"""`--load-format fi-convert`: a vLLM 0.33 model loader for fi-convert outputs.

Non-expert tensors are read beside the experts, at the same speed: where the model's own
`load_weights` only copies them (asked of it, `format.dense`) straight into its parameters, else
through that `load_weights`.
The converted MoE tensors bypass it (its expert weight loader would TP-split them again): each
layer's rank slice is read straight into the layer's parameters, and the layer's processing is
replaced by kernel setup only. Every other module is processed by vLLM's own driver.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from ...bulk_read import BulkRead
from ...errors import raised_as
from ...format import manifest as mf
from ...format.load_report import LoadReport
from ...format.names import MANIFEST_NAME
from ...format.plan_cache import Context
from ...format.reader import OutputReader
from ...format.whole_read import Ahead, load_output
from .. import installed_registry
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
    """The model's MoE layers, keyed by their checkpoint prefix: (module name, module). That
    is the layer's name, or where the output names the module's path instead, that path
    (MiniMax-M2: vLLM's `block_sparse_moe` module is named `mlp`, its checkpoint's is not); a
    layer vLLM names otherwise than the checkpoint (its model's `hf_to_vllm_mapper`: Qwen3-VL-
    MoE's model.language_model.layers.L is vLLM's language_model.model.layers.L) is keyed by
    the `output`'s prefix that maps to it, the mapper's name being the layer's or its module
    path's (Step3-VL: the checkpoint's model.layers.L.moe.experts, mapped to the module
    language_model.model.layers.L.moe.experts, a layer vLLM names language_model.layers.L.moe.
    experts)."""
    built = {}
    for name, mod in model.named_modules():
        if isinstance(mod, RoutedExperts):
            path = name.removesuffix(".routed_experts")
            key = path if path in output and mod.layer_name not in output else mod.layer_name
            built[key] = (name, mod)
    mapped = {_vllm_name(model, p): p for p in output if p not in built}

    def output_prefix(n: str, name: str) -> str:
        return mapped.get(n) or mapped.get(name.removesuffix(".routed_experts"), n)

    return {output_prefix(n, v[0]): v for n, v in built.items()}


def _vllm_name(model: torch.nn.Module, prefix: str) -> str:
    """The name vLLM's model gives the checkpoint's MoE layer `prefix`, by its own mapper: the
    model's, else a submodule's (a multimodal wrapper's language model), probed with the
    layer's fused name and, where a mapper maps only per-expert names (Mistral Large 3's:
    `layers.L.experts.E.w1.weight` is `model.layers.L.mlp.experts.E.gate_proj.weight`), with
    one expert's."""
    for where, mod in model.named_modules():
        mapper = getattr(mod, "hf_to_vllm_mapper", None)
        if mapper is None:
            continue
        head = f"{where}." if where else ""
        for tail, parts in ((".w13_weight", 1), (".0.w1.weight", 3), (".0.gate_proj.weight", 3)):
            name = mapper._map_name(prefix + tail)
            if name and name != prefix + tail:
                return head + name.rsplit(".", parts)[0]
    return prefix


class FiConvertModelLoader(DefaultModelLoader):
    """Loads an fi-convert output folder (or a Hub repo of one) with zero MoE preprocessing."""

    def __init__(self, load_config: LoadConfig) -> None:
        # vLLM's default loader refuses load formats it does not know
        super().__init__(dataclasses.replace(load_config, load_format="auto"))
        self._dir: Path | None = None
        self._manifest: dict | None = None
        self._ahead: Ahead | None = None  # set up while the server builds the model

    def _output(self, model_config: ModelConfig) -> tuple[Path, dict]:
        if self._dir is None or self._manifest is None:
            self._dir = self._local_dir(model_config)
            with raised_as(PluginError):
                self._manifest = mf.read(self._dir)
        return self._dir, self._manifest

    def _local_dir(self, model_config: ModelConfig) -> Path:
        local = Path(model_config.model)
        if local.is_dir():
            return local
        from ...hub.fetch import fetch_output  # a Hub repo id: its snapshot, fetched once

        with raised_as(PluginError):
            return fetch_output(
                model_config.model,
                revision=model_config.revision,
                cache=self.load_config.download_dir,
            )

    def download_model(self, model_config: ModelConfig) -> None:
        self._output(model_config)

    def get_all_weights(self, model_config: ModelConfig, model: torch.nn.Module) -> Any:
        """What vLLM's `reload_weights` from disk loads (`collective_rpc("reload_weights")`,
        model_config.model the folder, or `weights_path`): a checkpoint's tensors go through
        vLLM's own processing, as on its own load; an fi-convert output's experts are kernel
        layouts, which that processing would transform again, so it is refused here, before
        vLLM has touched the model."""
        refuse_reload(model_config.model)
        return super().get_all_weights(model_config, model)

    def load_model(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = ""
    ) -> torch.nn.Module:
        root, m = self._output(model_config)
        checks.check_architecture(
            m,
            str(root),
            list(getattr(getattr(model_config, "hf_config", None), "architectures", None) or ()),
            checks.vllm_version(),
            installed_registry.architectures("vllm"),
        )
        pc = vllm_config.parallel_config
        check = functools.partial(
            checks.check_output,
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
        try:
            check()
        except checks.UnlistedRelease as unlisted:
            check(release_proven=True)  # the other refusals first: they cost nothing
            from .proof import check_release  # the converter's code, for this case only

            logger.info("%s", check_release(m, str(root), unlisted, _moe_rank(pc)))
        # pinned, the readers started, the output opened, while vLLM builds the model
        with raised_as(PluginError):
            self._ahead = Ahead(_load_device(vllm_config), (root, m))
        try:
            return super().load_model(vllm_config, model_config, prefix)
        finally:
            if self._ahead is not None:
                self._ahead.close()
                self._ahead = None

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
            checks.check_sizes(m, str(root), lp, mod.moe_config)
        loaded, report = self._read_all(model, root, m, layers, model_config)
        for lp, (_, mod) in layers.items():
            if mode is None:
                experts.set_up_kernel_only(mod, m["layers"][lp])
            else:
                experts.undo_for_cpu(mod, m, mode)
        logger.info("%s", report.line(time.perf_counter()))
        if model_config.quantization is None:
            # (None where the model's load_weights says nothing of what it loaded: vLLM's own
            # load checks nothing then, as its DefaultModelLoader.track_weights_loading)
            self.track_weights_loading(model, loaded)

    def _read_all(
        self,
        model: Any,
        root: Path,
        m: dict,
        layers: dict[str, tuple[str, RoutedExperts]],
        model_config: ModelConfig,
    ) -> tuple[set[str] | None, LoadReport]:
        """Every tensor of the output into the model: the experts' and the non-expert tensors'
        byte ranges in one bulk read (where the model's loading only copies them,
        `format.dense`), then the model's `load_weights` over every non-expert tensor, with the
        data of those it does more with (read ahead in batches)."""
        t0 = time.perf_counter()
        loaded: set[str] = set()

        def add_experts(reader: OutputReader, bulk: BulkRead) -> None:
            for lp, (name, mod) in layers.items():
                rank = mod.moe_config.moe_parallel_config.tp_rank
                for p in experts.install(mod, reader, lp, rank, bulk):
                    loaded.add(f"{name}.{p}")

        try:
            with raised_as(PluginError):
                read = load_output(
                    self._ahead,
                    root,
                    m,
                    _model_device(model),
                    add_experts,
                    model,
                    model.load_weights,
                    lambda: _context(model_config),
                )
        except (KeyboardInterrupt, SystemExit):
            logger.error(
                "fi-convert: loading %s interrupted; its reader threads are stopped and "
                "their pinned memory freed: start the server again",
                root,
            )
            raise
        # this process is one rank of every layer: any layer's split names it
        split = next(iter(layers.values()))[1].moe_config.moe_parallel_config if layers else None
        report = LoadReport(_who(split), root, len(layers), read, t0)
        if read.dense.untracked:
            return None, report
        return loaded | read.dense.loaded, report


def refuse_reload(model: str) -> None:
    """Refuse a reload from disk of an fi-convert output (a local folder, or a Hub repo id
    whose snapshot is one), in one line."""
    path = Path(model)
    if path.is_dir() and not (path / MANIFEST_NAME).is_file():
        return  # a checkpoint: vLLM processes it as on its own load
    raise PluginError(
        f"{model}: reload_weights from disk reads an fi-convert output's experts, which are "
        "kernel layouts vLLM would process again; reload from the source checkpoint "
        "(weights_path=CHECKPOINT_DIR, or weights in checkpoint format), or start vLLM on "
        "the new output"
    )


def _context(model_config: Any) -> Context:
    """What vLLM says of this load beside the model (`format.plan_cache`): its release, the
    model's config and quantization, and this worker's ranks."""
    import torch.distributed as dist
    from vllm.config import get_current_vllm_config
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )
    from vllm.distributed import parallel_state as ps

    pc = get_current_vllm_config().parallel_config
    ranks = [
        ("tp", get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()),
        ("dp", getattr(pc, "data_parallel_rank", 0) or 0, pc.data_parallel_size),
    ]
    if ps.model_parallel_is_initialized():
        ranks.append(("pp", ps.get_pp_group().rank_in_group, ps.get_pp_group().world_size))
    if dist.is_initialized():
        ranks.append(("world", dist.get_rank(), dist.get_world_size()))
    hf: Any = getattr(model_config, "hf_config", None)
    fields = sorted(hf.to_dict().items()) if hasattr(hf, "to_dict") else None
    config = repr((fields, getattr(model_config, "quantization", None)))
    return Context(f"vllm {checks.vllm_version()}", config, tuple(ranks))


def _moe_rank(pc: Any) -> int:
    """This worker's rank of the MoE layers' TP split: vLLM's TP rank, flattened over its
    data-parallel ranks without EP (under EP an output has TP size 1)."""
    if pc.enable_expert_parallel:
        return 0
    from vllm.distributed import get_tensor_model_parallel_rank

    dp_rank = getattr(pc, "data_parallel_rank", 0) or 0
    return dp_rank * pc.tensor_parallel_size + get_tensor_model_parallel_rank()


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


def _load_device(vllm_config: VllmConfig) -> Any:
    """Where vLLM builds and loads the model (its `DefaultModelLoader.load_model`'s rule)."""
    device = getattr(vllm_config.load_config, "device", None)
    return vllm_config.device_config.device if device is None else device


def _model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters live (the reads go there)."""
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def _who(split: Any) -> str:
    if split is None:
        return "rank"
    if split.use_ep:
        return f"EP rank {split.ep_rank}/{split.ep_size}"
    return f"TP rank {split.tp_rank}/{split.tp_size}"
