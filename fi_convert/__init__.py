"""fi-convert: Mixture-of-Experts checkpoints into FlashInfer's kernel layouts, offline.

The names below are imported on first use (PEP 562), so that importing the package, or the
command line, does not import torch until a command needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (  # noqa: E402
    FiConvertError,
    HubError,
    LayoutError,
    ManifestError,
    OutputError,
    SchemeMismatchError,
    SourceError,
)
from .names import Backend, SchemeName  # noqa: E402
from .version import __version__

if TYPE_CHECKING:
    from .format.manifest import check_files
    from .format.manifest import read as read_manifest
    from .format.reader import load_moe_layer
    from .hub.convert import convert_source, stream_source
    from .pipeline import Progress, Result, convert, run_plan
    from .plan import Options, Plan, make_plan

_LAZY = {
    "Progress": ("pipeline", "Progress"),
    "Result": ("pipeline", "Result"),
    "convert": ("pipeline", "convert"),
    "convert_source": ("hub.convert", "convert_source"),
    "stream_source": ("hub.convert", "stream_source"),
    "run_plan": ("pipeline", "run_plan"),
    "load_moe_layer": ("format.reader", "load_moe_layer"),
    "check_files": ("format.manifest", "check_files"),
    "read_manifest": ("format.manifest", "read"),
    "Options": ("plan", "Options"),
    "Plan": ("plan", "Plan"),
    "make_plan": ("plan", "make_plan"),
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Backend",
    "FiConvertError",
    "HubError",
    "LayoutError",
    "ManifestError",
    "Options",
    "OutputError",
    "Plan",
    "Progress",
    "Result",
    "SchemeMismatchError",
    "SchemeName",
    "SourceError",
    "__version__",
    "check_files",
    "convert",
    "convert_source",
    "load_moe_layer",
    "make_plan",
    "read_manifest",
    "run_plan",
    "stream_source",
]
