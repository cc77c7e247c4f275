"""`--load-format fi-convert`: an SGLang model loader for fi-convert outputs (0.5.20-0.5.23).

It builds the model as SGLang's `DefaultModelLoader.load_model` does (SGLang's own quantization
config and model initialization). Non-expert tensors are read beside the experts, at the same
speed: where SGLang's own `load_weights_only` (the model's `load_weights`) only copies them
(asked of it, `format.dense`), straight into the parameters, else through it.
The converted MoE tensors bypass it (its expert weight loader would TP-split and pad them
again): each layer's rank slice is read with fi-convert's fast read path straight into the
layer's parameters, and the layer gets kernel setup only (experts.finish). Every other module
is processed by SGLang's own `process_weights_after_loading`, as its `postprocess_weights` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
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
    device_loading_context,
)
from sglang.srt.model_loader.utils import set_default_torch_dtype

from ...bulk_read import BulkRead
from ...errors import raised_as
from ...format.load_report import LoadReport
from ...format.plan_cache import Context
from ...format.reader import OutputReader
from ...format.whole_read import Ahead, load_output
from .. import architectures as arch_facts
from . import checks, experts, older_releases
from .checks import PluginError
from .config import CONVERTED_ATTR

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
    load_weights renames to), or the one output layer that ends with that prefix
    (GLM-4.5V: the checkpoint's model.language_model.layers.L.mlp.experts, a layer built as
    language_model.layers.L.mlp.experts in a module model.layers.L.mlp.experts), or else the
    one output layer named as that prefix less one of its parts, or ending so (Gemma 4: the
    checkpoint's model.layers.L.experts, which its load_weights renames to the module
    model.layers.L.moe.experts), or with one part more (Intern-S1: the checkpoint's
    model.language_model.layers.L.mlp.experts, a layer built as model.layers.L.mlp.experts in
    a module language_model.model.layers.L.mlp.experts); then the one output layer one part
    apart from the module's name (Ling 3 VL: the checkpoint's model.layers.L.mlp.experts, a
    layer built as model.model.layers.L.experts in a module model.model.layers.L.mlp.experts),
    or that ends with the prefix (or the module's name) less its first part (MiniCPM-V 4.6: the
    checkpoint's model.language_model.layers.L.mlp.experts, a layer built as
    llm.layers.L.mlp.experts), or that less one part is the prefix less one, neither a layer's
    index (DiffusionGemma: the checkpoint's model.decoder.layers.L.experts, a layer built as
    model.layers.L.moe.experts). First of all, the output layer the model's own
    `hf_to_sglang_mapper` maps to the module's name (Kimi K3: the checkpoint's
    language_model.layers.L.block_sparse_moe.experts, the module language_model.model.layers.
    L.mlp.experts, a layer built as model.layers.L.mlp.experts)."""
    mapped = _mapped(model, output)
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FusedMoE):
            built = getattr(mod, "layer_name", name)
            out[mapped.get(name) or _output_layer(name, built, output)] = mod
    return out


def _mapped(model: torch.nn.Module, output: Collection[str]) -> dict[str, str]:
    """The output layers the model's `hf_to_sglang_mapper` renames, by the name it gives them
    (probed with one expert's tensor name, as its load_weights reads the checkpoint's)."""
    mapper = getattr(model, "hf_to_sglang_mapper", None)
    if mapper is None:
        return {}
    found = {}
    for layer in output:
        name = mapper._map_name(f"{layer}.0.w1.weight")
        if name and name != f"{layer}.0.w1.weight" and name.endswith(".0.w1.weight"):
            found[name.removesuffix(".0.w1.weight")] = layer
    return found


def _output_layer(name: str, built: str, output: Collection[str]) -> str:
    """The output layer of a FusedMoE module `name` built as `built` (moe_layers' rules), or
    `name` where none is."""
    if name in output:
        return name
    if built in output:
        return built
    under = [o for o in output if o.endswith("." + built)]
    if under:
        return under[0] if len(under) == 1 else name
    less = [o for o in output if _one_part_apart(o, built)]
    if less:
        return less[0] if len(less) == 1 else name
    for rule in (_one_part_apart, _ends_with_tail, _one_part_other):
        for prefix in dict.fromkeys((built, name)):
            found = [o for o in output if rule(o, prefix)]
            if len(found) == 1:
                return found[0]
    return name


def _one_part_other(layer: str, prefix: str) -> bool:
    """Whether output layer `layer` less one part is `prefix` less one part, neither a layer
    index (DiffusionGemma: the checkpoint's model.decoder.layers.L.experts, a layer built as
    model.layers.L.moe.experts)."""
    return bool(set(_less_one_word(layer)) & set(_less_one_word(prefix)))


def _less_one_word(prefix: str) -> list[str]:
    """`prefix` with one of its dotted parts that is not a number left out, each way (the
    first and last kept)."""
    parts = prefix.split(".")
    keep = range(1, len(parts) - 1)
    return [".".join(parts[:k] + parts[k + 1 :]) for k in keep if not parts[k].isdigit()]


def _ends_with_tail(layer: str, prefix: str) -> bool:
    """Whether output layer `layer` ends with `prefix` less its first part."""
    return "." in prefix and layer.endswith("." + prefix.split(".", 1)[1])


def _one_part_apart(layer: str, built: str) -> bool:
    """Whether output layer `layer` is named as `built` less one of its parts (or ends so),
    or is `built` with one part more (Intern-S1: the checkpoint's model.language_model.layers.L
    .mlp.experts, a layer SGLang builds as model.layers.L.mlp.experts)."""
    return any(_named(layer, b) for b in _less_one_part(built)) or built in _less_one_part(layer)


def _less_one_part(prefix: str) -> list[str]:
    """`prefix` with one of its dotted parts left out, each way (the first and last kept)."""
    parts = prefix.split(".")
    return [".".join(parts[:k] + parts[k + 1 :]) for k in range(1, len(parts) - 1)]


def _named(layer: str, prefix: str) -> bool:
    return layer == prefix or layer.endswith("." + prefix)


def check_output(manifest: dict, root: str, model_config: Any = None) -> None:
    """The manifest against the running SGLang's arguments and machine (before any load), then
    SGLang's model class for it (`model_config`'s: `check_model_class`); an SGLang release the
    output does not list is proven last, for this rank (proof.py), once nothing else refuses."""
    from sglang.srt.runtime_context import get_parallel

    try:
        _check_output(manifest, root)
    except checks.UnlistedRelease as unlisted:
        _check_output(manifest, root, release_proven=True)  # the other refusals first
        if model_config is not None:
            check_model_class(model_config, manifest, root)
        from .proof import check_release  # the converter's code, for this case only

        rank = int(get_parallel().moe_tp_rank or 0)
        logger.info("%s", check_release(manifest, root, unlisted, rank))
    else:
        if model_config is not None:
            check_model_class(model_config, manifest, root)


def _check_output(manifest: dict, root: str, release_proven: bool = False) -> None:
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
        sglang_version=checks.sglang_version(),
        release_proven=release_proven,
    )
    if os.environ.get(TEST_CPU_ENV) != "1":
        checks.check_device(
            manifest,
            root,
            flashinfer_version=checks.installed("flashinfer-python"),
            capability=_capability(),
        )


def check_model_class(model_config: Any, manifest: dict, root: str) -> None:
    """SGLang's own model class for the output's architecture, before the model is built: where
    the release has none (K-EXAONE's ExaoneMoeForCausalLM before 0.5.22, whose
    ExaoneMoEForCausalLM serves it), SGLang serves it through its generic Transformers backend,
    whose MoE layers the plugin does not load into: refused, naming the releases to use."""
    from sglang.srt.model_loader.utils import get_model_architecture

    _, arch = get_model_architecture(model_config)
    if not str(arch).startswith("Transformers"):  # (SGLang's own test of its backend's names)
        return
    archs = list(getattr(model_config.hf_config, "architectures", None) or ())
    names = ", ".join(archs) or "?"
    ok = arch_facts.facts("sglang").serving(archs, checks.serving_releases(manifest))
    raise PluginError(
        f"{root}: SGLang {checks.sglang_version()} has no model class of its own for {names} "
        f"(config.json's architectures) and would serve it through its generic Transformers "
        f"backend ({arch}), which fi-convert's plugin does not load into; install an SGLang "
        f"that has one: {', '.join(ok) if ok else 'a release the output lists'}"
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
        self._ahead: Ahead | None = None  # set up while the server builds the model

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
        name = checks.output_name(str(model_config.model_path), root)
        check_output(manifest, name, model_config)
        target_device = torch.device(device_config.device)
        # pinned, the readers started, the output opened, while SGLang builds the model
        with raised_as(PluginError):
            self._ahead = Ahead(target_device, (root, manifest))
        try:
            quant_config = _get_quantization_config(model_config, self.load_config)
            with set_default_torch_dtype(model_config.dtype):
                with target_device:
                    model = _initialize_model(model_config, self.load_config, quant_config)
                self.load_output(model, root, manifest, target_device)
        finally:
            if self._ahead is not None:
                self._ahead.close()
                self._ahead = None
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
        report = self._read_all(model, root, manifest, layers, target_device)
        postprocess(model, set(layers.values()), target_device)
        setattr(model, CONVERTED_ATTR, frozenset(layers))  # updates of these are refused
        logger.info("%s", report.line(time.perf_counter(), "post-load processing"))

    def _read_all(
        self,
        model: torch.nn.Module,
        root: Path,
        manifest: dict,
        layers: dict[str, Any],
        target_device: torch.device,
    ) -> LoadReport:
        """Every tensor of the output into the model: the experts' and the non-expert
        tensors' byte ranges in one bulk read (where SGLang's loading only copies them,
        `format.dense`), then SGLang's `load_weights_only` over every non-expert tensor, with
        the data of those it does more with (read ahead in batches)."""
        t0 = time.perf_counter()

        def add_experts(reader: OutputReader, bulk: BulkRead) -> None:
            for prefix, layer in layers.items():
                experts.install(layer, reader, prefix, layer.moe_tp_rank, bulk)

        with raised_as(PluginError):
            read = load_output(
                self._ahead,
                root,
                manifest,
                _model_device(model),
                add_experts,
                model,
                lambda w: _load_weights_only(model, w, target_device, layers.values()),
                lambda: _context(model),
            )
        return LoadReport(_who(layers), root, len(layers), read, t0)


# SGLang's parallel groups whose rank a model's loading may cut a tensor by
_GROUPS = ("tp", "attn_tp", "attn_dp", "attn_cp", "pp", "moe_tp", "moe_ep", "moe_dp")


def _context(model: torch.nn.Module) -> Context:
    """What SGLang says of this load beside the model (`format.plan_cache`): its release, the
    model's config, and this process's rank in each parallel group (-1 where this release or
    process has none of that name) and in the world."""
    from sglang.srt.runtime_context import get_parallel

    par, ranks = get_parallel(), []
    for group in _GROUPS:
        try:
            rank, size = getattr(par, f"{group}_rank"), getattr(par, f"{group}_size")
            ranks.append((group, int(rank or 0), int(size or 1)))
        except Exception:  # (0.5.20 asserts where a group is not set up: "dp attention not
            ranks.append((group, -1, -1))  # initialized!")
    if torch.distributed.is_initialized():
        ranks.append(("world", torch.distributed.get_rank(), torch.distributed.get_world_size()))
    hf: Any = getattr(model, "config", None)
    config = repr(sorted(hf.to_dict().items())) if hasattr(hf, "to_dict") else ""
    return Context(f"sglang {checks.sglang_version()}", config, tuple(ranks))


def _load_weights_only(
    model: torch.nn.Module, weights: Any, target_device: torch.device, layers: Collection[Any]
) -> None:
    """SGLang's `load_weights_only` (the model's `load_weights`) over the output's non-expert
    tensors, the converted MoE layers' parameters marked meanwhile as SGLang marks parameters
    no checkpoint tensor fills (`_skip_weight_check`): a model whose load checks that it was
    handed a tensor for every parameter (IQuest Q1's check_all_params_loaded) takes them as
    filled, as the plugin fills them itself. The marks go after the call."""
    params = [p for layer in layers for p in layer.parameters()]
    marked = [p for p in params if not getattr(p, "_skip_weight_check", False)]
    for p in marked:
        p._skip_weight_check = True  # type: ignore[attr-defined]
    try:
        with _own_check_counting(model, {id(p) for p in params}):
            DefaultModelLoader.load_weights_only(model, weights, target_device)
    finally:
        for p in marked:
            del p._skip_weight_check  # type: ignore[attr-defined]


@contextlib.contextmanager
def _own_check_counting(model: torch.nn.Module, filled: set[int]) -> Iterator[None]:
    """A model whose load_weights checks itself that it filled every parameter, without
    SGLang's `_skip_weight_check` mark (Grok-1's, models/grok.py: `check_hit_names`, every
    parameter but scales once a call hits more than 5, none hit refused too): its load_weights
    meanwhile runs with that check off, and the same check is made after each call with the
    parameters of `filled` (the converted layers', which the plugin fills) counted as hit."""
    load: Any = model.load_weights
    if "check_hit_names" not in inspect.signature(load).parameters:
        yield
        return
    others = {n for n, p in model.named_parameters() if id(p) not in filled and "scale" not in n}

    def loading(weights: Any, *args: Any, **kwargs: Any) -> Any:
        hit = load(weights, *args, **{**kwargs, "check_hit_names": False})
        if len(hit) > 5 and others - hit:
            missing = ", ".join(sorted(others - hit)[:5])
            raise PluginError(
                f"the model's load_weights filled no {missing} (it checks that every parameter "
                "was filled): the output lacks those tensors; convert again from the whole "
                "checkpoint"
            )
        if not hit:
            raise PluginError(
                "the model's load_weights filled no parameter: the output's other tensors are "
                "not this model's; serve the output with its own config.json, or convert again"
            )
        return hit

    model.__dict__["load_weights"] = loading  # (the instance's, before its class's)
    try:
        yield
    finally:
        del model.__dict__["load_weights"]


def _who(layers: dict[str, Any]) -> str:
    first = next(iter(layers.values()), None)
    return (
        f"MoE TP rank {getattr(first, 'moe_tp_rank', 0)}, EP rank "
        f"{getattr(first, 'moe_ep_rank', 0)}/{getattr(first, 'moe_ep_size', 1)}"
    )


def postprocess(model: torch.nn.Module, converted: set, target_device: torch.device) -> None:
    """SGLang's `DefaultModelLoader.postprocess_weights`, with kernel setup only for the
    converted MoE layers."""
    for module, quant_method in older_releases.modules_with_quant_method(model):
        with device_loading_context(module, target_device):
            if module in converted:
                experts.finish(module)
            else:
                quant_method.process_weights_after_loading(module)


def _model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters live (the reads go there)."""
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")
