"""The output's config.json names the quantization method `fi-convert`, which stock vLLM
refuses (fi_convert/format/config_marker.py says why; target.py holds its note). With
`--load-format fi-convert`, and only then, the plugin hands vLLM the source's own
quantization config back, through vLLM's `hf_overrides` hook, so that vLLM builds exactly the
model and MoE methods it builds for the source checkpoint. An output of a Mistral-format
source (params.json) is read by the plugin's own config parser instead (mistral.py)."""

from __future__ import annotations

import functools
from typing import Any

from ...format import config_marker

LOAD_FORMAT = "fi-convert"


def restore_source_quantization(hf_config: Any) -> Any:
    """`hf_config` with the source's quantization config in place of fi-convert's marker."""
    qc = getattr(hf_config, "quantization_config", None)
    if isinstance(qc, dict) and config_marker.is_marked(qc):
        source = config_marker.source_quantization_config(qc)
        if source is None:
            del hf_config.quantization_config
        else:
            hf_config.quantization_config = source
    return hf_config


class RestoreSource:
    """vLLM's `hf_overrides` for fi-convert outputs: the user's own (a dict or a function)
    first, then the source's quantization config back. A module-level class, so that vLLM can
    pickle it into its engine process."""

    fi_convert = True

    def __init__(self, user: Any) -> None:
        self.user = user

    def __call__(self, hf_config: Any) -> Any:
        if callable(self.user):
            hf_config = self.user(hf_config)
        elif self.user:
            hf_config.update(self.user)
        return restore_source_quantization(hf_config)


def hook_engine_args() -> None:
    """Make `EngineArgs.create_model_config` restore the source's quantization config when the
    load format is fi-convert (idempotent: the plugin is loaded in every process)."""
    from vllm.engine.arg_utils import EngineArgs

    create = EngineArgs.create_model_config
    if getattr(create, "fi_convert", False):
        return

    def create_model_config(self: Any) -> Any:
        if str(self.load_format).lower() == LOAD_FORMAT:
            manifest = check_early(self)
            # an output of a Mistral-format source: read by the plugin's config parser
            from . import mistral  # (a plugin module: imported by the hook, not with LOAD_FORMAT)

            mistral.adapt_engine_args(self, manifest)
            if not getattr(self.hf_overrides, "fi_convert", False):
                self.hf_overrides = RestoreSource(self.hf_overrides)
        return create(self)

    create_model_config.fi_convert = True  # type: ignore[attr-defined]
    EngineArgs.create_model_config = create_model_config  # type: ignore[method-assign]


def check_early(args: Any) -> dict:
    """The manifest checks that need no GPU, in the process that parses the arguments, before
    vLLM starts an engine (for a Hub repo id, on its manifest, fetched alone: hub/fetch.py). The
    loader runs them again, with the device checks, in every worker. Returns the manifest."""
    from pathlib import Path

    from ...errors import FiConvertError
    from ...format import manifest as mf
    from . import checks

    name = str(args.model)
    try:
        if Path(name).is_dir():
            root = Path(name)
        else:
            from ...hub.fetch import fetch_output

            rev, cache = getattr(args, "revision", None), getattr(args, "download_dir", None)
            root = fetch_output(name, revision=rev, cache=cache, manifest_only=True)
        m = mf.read(root)
    except FiConvertError as e:
        raise checks.PluginError(str(e)) from None
    check = functools.partial(
        checks.check_manifest,
        m,
        name if not Path(name).is_dir() else str(root),
        tp_size=args.tensor_parallel_size,
        use_ep=bool(args.enable_expert_parallel),
        dp_size=(args.data_parallel_size or 1)
        * (getattr(args, "prefill_context_parallel_size", 1) or 1),
        eplb=bool(getattr(args, "enable_eplb", False)),
        vllm_version=checks.vllm_version(),
    )
    try:
        check()
    except checks.UnlistedRelease:
        # a release the output does not list: each worker proves it for its rank at load
        # (loader.py, proof.py); the other checks still refuse here, before an engine starts
        check(release_proven=True)
    return m
