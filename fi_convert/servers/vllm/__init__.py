"""fi-convert's vLLM plugin: `vllm serve OUT_DIR --load-format fi-convert`.

Installed with fi-convert's `vllm` extra (fi-convert is not on PyPI: `pip install ".[vllm]"`
in a clone, or `pip install "dist/fi_convert-<version>-py3-none-any.whl[vllm]"` with the wheel
`make wheel` builds); vLLM calls `register` from its
`vllm.general_plugins` entry point in the engine and in every worker. Nothing else in
fi-convert imports vLLM.
"""

from __future__ import annotations

from .config import LOAD_FORMAT


def register() -> None:
    """Register the `fi-convert` load format with vLLM's model-loader registry."""
    from vllm.model_executor.model_loader import register_model_loader

    from .config import hook_engine_args
    from .loader import FiConvertModelLoader, logger
    from .mistral import register_parser

    register_model_loader(LOAD_FORMAT)(FiConvertModelLoader)
    register_parser()
    hook_engine_args()
    logger.info("fi-convert: registered load format %r", LOAD_FORMAT)
