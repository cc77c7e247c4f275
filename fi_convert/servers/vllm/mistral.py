"""Serving an output of a source in Mistral's own format (Mistral Large 3: params.json, no
config.json) with `vllm serve OUT --load-format fi-convert`.

What vLLM 0.30-0.34 do with such an output on their own (tests/test_vllm_plugin.py, run in
each release's venv: test_stock_vllm_refuses_an_output_of_a_mistral_format_source):
- `--config-format auto` (the default) takes Mistral's format only where it finds
  `consolidated*.safetensors` files (`transformers_utils/config.py` `get_config`,
  `repo_utils.is_mistral_model_repo`), which an output has not (its shards are
  `model-*.safetensors`), and finds no config.json either: "Invalid repository ID or local
  directory specified". Its tokenizer mode `auto` likewise takes Mistral's tokenizer
  (tekken.json) only beside consolidated shards.
- `--config-format mistral` parses params.json (`MistralConfigParser`, then
  `configs/mistral.adapt_config_dict`), whose `quantization` fi-convert marks
  (format/config_marker.py): "Found unknown quantization=...".
So stock vLLM refuses an output either way, and the plugin cannot put the source's
quantization back through `hf_overrides` (config.py), which vLLM applies after its parser
has failed. With `--load-format fi-convert`, the plugin's engine-args hook reads the config
with a parser of its own, registered with vLLM (`register_config_parser`, as config format
`fi-convert-mistral`): params.json with the source's `quantization` put back, then every step
of vLLM's own Mistral parser, with vLLM's own functions; and it takes Mistral's tokenizer
where vLLM would for the source (its tokenizer files beside params.json, tokenizer mode left
`auto`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...format import config_marker
from .checks import PluginError

CONFIG_FORMAT = "fi-convert-mistral"
PARAMS = "params.json"
HF_CONFIG = "config.json"
# the config formats that read a Mistral-format output: vLLM's own two are taken as the
# plugin's (vLLM's would refuse it), and the plugin's own
FORMATS = ("auto", "mistral", CONFIG_FORMAT)


def is_mistral_output(manifest: dict) -> bool:
    """An output of a Mistral-format source: it lists params.json and no config.json."""
    files = manifest.get("files") or {}
    return PARAMS in files and HF_CONFIG not in files


def _mistral_tokenizer(files: dict) -> bool:
    """Mistral's own tokenizer files, as vLLM's tokenizer mode `auto` looks for them."""
    return any(n == "tekken.json" or n.startswith("tokenizer.model.v") for n in files)


def adapt_engine_args(args: Any, manifest: dict) -> None:
    """For a Mistral-format output: the plugin's config parser, and Mistral's tokenizer where
    vLLM would take it for the source. Other outputs are left as they are."""
    if not is_mistral_output(manifest):
        return
    fmt = str(args.config_format)
    if fmt not in FORMATS:
        raise PluginError(
            f"{args.model}: an output of a Mistral-format source (params.json, no config.json) "
            f"is read by fi-convert's own config parser, not --config-format {fmt}; drop "
            "--config-format"
        )
    # the parser's refusals, here: inside vLLM's config they would be retried and wrapped
    source_params(_params(str(args.model), args.revision), str(args.model))
    args.config_format = CONFIG_FORMAT
    own = args.tokenizer in (None, args.model)
    if own and str(args.tokenizer_mode) == "auto" and _mistral_tokenizer(manifest["files"]):
        args.tokenizer_mode = "mistral"


def source_params(params: dict, model: str) -> dict:
    """The output's params.json (`params`) with the source's `quantization` back in place of
    fi-convert's mark (none where the source had none)."""
    quant = params.get(config_marker.PARAMS_QUANT_KEY)
    if not isinstance(quant, dict) or not config_marker.is_marked(quant):
        raise PluginError(
            f"{model}: its params.json's quantization is not fi-convert's mark, so it is no "
            "fi-convert output (or its params.json was replaced); serve a source without "
            "--load-format fi-convert, or convert it again"
        )
    cfg = dict(params)
    source = config_marker.source_quantization_config(quant)
    if source is None:
        del cfg[config_marker.PARAMS_QUANT_KEY]
    else:
        cfg[config_marker.PARAMS_QUANT_KEY] = source
    return cfg


def _params(model: str, revision: str | None) -> dict:
    """The output's params.json (a folder's, or a Hub repo's: vLLM's own reader of it)."""
    from vllm.transformers_utils.repo_utils import get_hf_file_to_dict

    try:
        params = get_hf_file_to_dict(PARAMS, model, revision)
        why = "missing" if params is None else "not a JSON object"
    except (OSError, ValueError) as e:
        params, why = None, f"unreadable: {e}"
    if not isinstance(params, dict):
        raise PluginError(
            f"{model}: its {PARAMS} ({why}), which an output of a Mistral-format source holds, "
            "is not fi-convert's; convert it again"
        )
    return params


def _manifest(model: str, revision: str | None) -> dict:
    from ...errors import FiConvertError
    from ...format import manifest as mf

    try:
        if Path(model).is_dir():
            return mf.read(Path(model))
        from ...hub.fetch import fetch_output

        return mf.read(fetch_output(model, revision=revision, manifest_only=True))
    except FiConvertError as e:
        raise PluginError(str(e)) from None


def source_dtype(model: str, revision: str | None) -> Any:
    """The dtype vLLM's Mistral parser infers for a params.json without one, from the
    source's tensors the output holds as they are (every tensor outside its converted MoE
    layers): vLLM's broadcastable dtype of theirs (the source's own, for Mistral's published
    checkpoints, whose experts' dtypes are among the rest's). None where there are none."""
    from vllm.transformers_utils.config import get_safetensors_params_metadata
    from vllm.utils.torch_utils import common_broadcastable_dtype

    from ...dtypes import to_torch  # (torch: not at the top, which the servers' facts import)

    layers = tuple(f"{p}." for p in _manifest(model, revision)["layers"])
    meta = get_safetensors_params_metadata(model, revision=revision)
    found = set()
    for name, info in meta.items():
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if dtype and not name.startswith(layers):
            try:
                found.add(to_torch(dtype))
            except KeyError:
                continue
    return common_broadcastable_dtype(found) if found else None


def register_parser() -> None:
    """Register the plugin's config parser with vLLM (idempotent: in every process)."""
    from vllm.transformers_utils import config as vc
    from vllm.transformers_utils.config_parser_base import ConfigParserBase

    if CONFIG_FORMAT in vc._CONFIG_FORMAT_TO_CONFIG_PARSER:
        return

    @vc.register_config_parser(CONFIG_FORMAT)
    class OutputMistralConfigParser(ConfigParserBase):
        """vLLM's Mistral parser's steps, on an output's params.json with the source's
        quantization back: the config vLLM reads from the source's params.json."""

        def parse(
            self,
            model: str | Path,
            trust_remote_code: bool,
            revision: str | None = None,
            code_revision: str | None = None,
            **kwargs: Any,
        ) -> tuple[dict, Any]:
            from transformers import PretrainedConfig
            from vllm.transformers_utils.configs.mistral import adapt_config_dict
            from vllm.transformers_utils.utils import without_trust_remote_code

            name = model if isinstance(model, str) else model.as_posix()
            cfg = source_params(_params(name, revision), name)
            if cfg.get("max_position_embeddings") is None:
                retrieve = vc._maybe_retrieve_max_pos_from_hf
                cfg["max_position_embeddings"] = retrieve(name, revision, **kwargs)
            try:
                defaults, _ = PretrainedConfig.get_config_dict(
                    name,
                    revision=revision,
                    code_revision=code_revision,
                    **without_trust_remote_code(kwargs),
                )
            except OSError:  # no config.json: an output of a Mistral-format source has none
                defaults = {}
            if cfg.get("dtype") is None:
                dtype = source_dtype(name, revision)
                if dtype is not None:
                    cfg["dtype"] = dtype
            return cfg, adapt_config_dict(cfg, defaults=defaults)
