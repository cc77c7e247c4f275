"""fi-convert: Mixture-of-Experts checkpoints into FlashInfer's kernel layouts, offline."""

__version__ = "0.1.0"

from .convert import Progress, Result, convert, run_plan  # noqa: E402
from .errors import (  # noqa: E402
    FiConvertError,
    HubError,
    LayoutError,
    ManifestError,
    OutputError,
    SchemeMismatchError,
    SourceError,
)
from .loader import load_moe_layer  # noqa: E402
from .manifest import check_files  # noqa: E402
from .manifest import read as read_manifest
from .plan import Options, Plan, make_plan  # noqa: E402
from .schemes import Backend, SchemeName  # noqa: E402

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
    "load_moe_layer",
    "make_plan",
    "read_manifest",
    "run_plan",
]
