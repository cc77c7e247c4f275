"""The hooks the SGLang plugin puts into SGLang 0.5.20-0.5.23 (through its own
`HookRegistry`), each a no-op unless the load format is fi-convert:

- `LoadConfig._verify_load_format` turns the string `fi-convert` into the plugin's loader class
  (SGLang's `get_model_loader` instantiates a class it finds there; its own check would refuse
  a name that is not in its `LoadFormat` enum).
- `ModelConfig.from_server_args` and `get_config`: the output's config.json names the
  quantization method `fi-convert`, which stock SGLang refuses (format/config_marker.py says
  why); with `--load-format fi-convert`, and only then, SGLang is handed the source's own
  quantization config, so that it builds exactly the model and MoE methods it builds for the
  source.
- `ServerArgs.check_server_args`: the manifest checks that need no model and no GPU, in the
  process that parses the arguments, before SGLang starts its scheduler processes.
- `WeightUpdater.update_weights_from_tensor`: on a model the plugin loaded, an update that
  names a converted layer's experts is refused (SGLang loads such tensors through the experts'
  weight loader and runs no processing after, so checkpoint-format tensors would land in
  kernel layouts); `load_format="direct"` (tensors in the served layout, copied by name) and
  updates of other tensors go on.
"""

from __future__ import annotations

import contextvars
import copy
import functools
from typing import Any

from ...format import config_marker
from .target import LOAD_FORMAT

# set while ModelConfig.from_server_args builds the config of an fi-convert load
_LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar("fi_convert_sglang", default=False)

HOOKS = (
    # (SGLang's target, the hook in this module, SGLang's HookType name)
    (
        "sglang.srt.configs.load_config.LoadConfig._verify_load_format",
        "verify_load_format",
        "AROUND",
    ),
    ("sglang.srt.configs.model_config.ModelConfig.from_server_args", "model_config", "AROUND"),
    ("sglang.srt.utils.hf_transformers.config.get_config", "get_config", "AROUND"),
    ("sglang.srt.server_args.ServerArgs.check_server_args", "check_server_args", "AFTER"),
    (
        "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater."
        "update_weights_from_tensor",
        "update_weights_from_tensor",
        "AROUND",
    ),
)
# set by the loader on a model it loaded: the prefixes of the MoE layers that hold kernel layouts
CONVERTED_ATTR = "_fi_convert_converted_experts"


def is_fi_convert(load_format: Any) -> bool:
    return isinstance(load_format, str) and load_format.lower() == LOAD_FORMAT


def verify_load_format(original: Any, self: Any) -> None:
    """AROUND LoadConfig._verify_load_format: `fi-convert` becomes the plugin's loader class."""
    if is_fi_convert(self.load_format):
        from .loader import FiConvertModelLoader

        self.load_format = FiConvertModelLoader
        return None
    return original(self)


def model_config(original: Any, server_args: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ModelConfig.from_server_args: the config of an fi-convert load is built with the
    source's quantization config (get_config below)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    token = _LOADING.set(is_fi_convert(getattr(resolving_view(server_args), "load_format", "")))
    try:
        return original(server_args, *args, **kwargs)
    finally:
        _LOADING.reset(token)


def get_config(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND get_config (cached: the cached object is never changed): inside an fi-convert
    load, the config with the source's quantization config in place of fi-convert's marker."""
    config = original(*args, **kwargs)
    qc = getattr(config, "quantization_config", None)
    if not _LOADING.get() or not isinstance(qc, dict) or not config_marker.is_marked(qc):
        return config
    config = copy.deepcopy(config)
    source = config_marker.source_quantization_config(qc)
    if source is None:
        del config.quantization_config
    else:
        config.quantization_config = source
    return config


def check_server_args(result: Any, self: Any) -> None:
    """AFTER ServerArgs.check_server_args: refuse an output this SGLang cannot serve as
    converted, before any process starts (the loader checks again, with the device and the
    layers SGLang built, in every scheduler process). For a Hub repo id, only its manifest is
    fetched here (the scheduler processes fetch the rest)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    from . import checks

    view = resolving_view(self)
    if not is_fi_convert(getattr(view, "load_format", "")):
        return None
    path = str(view.model_path)
    root = checks.local_output(
        path,
        revision=getattr(view, "revision", None),
        cache=getattr(view, "download_dir", None),
        manifest_only=True,
    )
    ep = int(getattr(view, "ep_size", 1) or 1)
    dp = int(getattr(view, "moe_dp_size", 1) or 1)
    check = functools.partial(
        checks.check_manifest,
        checks.read_output(root),
        checks.output_name(path, root),
        tp_size=int(view.tp_size) // ep // dp,  # SGLang's MoE TP size (its checks: it divides)
        ep_size=ep,
        eplb=bool(getattr(view, "enable_eplb", False)),
        redundant=int(getattr(view, "ep_num_redundant_experts", 0) or 0),
        placement=str(getattr(view, "init_expert_location", "trivial") or "trivial"),
        moe_dp_size=dp,
        a2a=str(getattr(view, "moe_a2a_backend", "none") or "none"),
        moe_runner_backend=str(view.moe_runner_backend),
        sglang_version=checks.sglang_version(),
    )
    try:
        check()
    except checks.UnlistedRelease:
        # a release the output does not list: each scheduler process proves it for its rank
        # at load (loader.py, proof.py); the other checks still refuse here, before any starts
        check(release_proven=True)
    return None


def update_weights_from_tensor(
    original: Any, self: Any, named_tensors: Any, load_format: Any = None, *args: Any, **kw: Any
) -> Any:
    """AROUND WeightUpdater.update_weights_from_tensor: SGLang's (ok, message) answer, refused
    in one line for a converted layer's experts (see the module's docstring)."""
    converted = getattr(self.get_model(), CONVERTED_ATTR, None)
    if converted and load_format != "direct":
        names = named_tensors if isinstance(named_tensors, list | tuple) else ()
        hit = next((n for n, _ in names if _layer_of(str(n), converted)), None)
        if hit is not None:
            return False, (
                f"fi-convert: {hit}: an expert of a layer loaded from an fi-convert output, "
                "which holds kernel layouts that SGLang's update_weights_from_tensor writes "
                "into without its processing; update from a checkpoint with "
                "update_weights_from_disk (load_format 'auto'), or send the served layout "
                "with load_format 'direct'"
            )
    return original(self, named_tensors, load_format, *args, **kw)


def _layer_of(name: str, prefixes: frozenset[str]) -> bool:
    return any(name.startswith(p + ".") for p in prefixes)
