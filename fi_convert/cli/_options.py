"""The options more than one command takes, as `Annotated` aliases, and the parsers of values
that are usage errors when wrong (exit code 2): sizes and device names."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Optional

import typer

from .. import sizes
from ..names import Backend, SchemeName


def parse_size(text: str | int) -> int:
    """Bytes from `text` (see sizes.parse_size); anything else is a usage error."""
    try:
        return sizes.parse_size(text)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_name(value: str) -> str:
    """`--device`: auto, cpu, cuda or cuda:N (whether that device exists is the library's
    check, when the command runs); anything else is a usage error."""
    if _DEVICE_RE.fullmatch(value):
        return value
    low = value.lower()
    if low.startswith(("gpu", "nvidia", "cuda")):
        near = ["cuda"]
    else:
        near = difflib.get_close_matches(low.partition(":")[0], ["auto", "cpu", "cuda"], n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    raise typer.BadParameter(f"unknown device{hint} (use auto, cpu, cuda or cuda:N)")


def device_option(help: str) -> Any:
    """A `--device` option (`device_name` checks its value)."""
    return typer.Option("--device", metavar="DEVICE", callback=device_name, help=help)


SchemeOpt = Annotated[
    SchemeName,
    typer.Option(
        "--scheme",
        "-s",
        metavar="SCHEME",
        help="Preparation pipeline: " + ", ".join(s.value for s in SchemeName) + " (auto "
        "detects it from the checkpoint).",
    ),
]
BackendOpt = Annotated[
    Backend,
    typer.Option(
        "--backend",
        "-b",
        metavar="BACKEND",
        help="FlashInfer MoE backend: " + " or ".join(b.value for b in Backend) + ".",
    ),
]
TpOpt = Annotated[
    int, typer.Option("--tp-size", "-tp", min=1, metavar="N", help="Tensor-parallel size.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")]
UnservableOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unservable",
        help="Convert even when the server cannot serve the output (vLLM 0.33: fp8-tensor "
        "without static activation scales, e.g. from BF16); refused otherwise.",
    ),
]
ServerOpt = Annotated[
    str,
    typer.Option(
        "--server",
        metavar="SERVER",
        help="The server the output is for: vllm (vLLM 0.33) or sglang (SGLang 0.5.23). Their "
        "layouts differ for several schemes, so an output is loaded only by its server's "
        "fi-convert plugin.",
    ),
]
FamilyOpt = Annotated[
    Optional[str],  # noqa: UP045 (typer reads the annotation)
    typer.Option(
        "--family",
        metavar="FILE.json",
        help="A model family file of your own (the schema of fi-convert's families/*.json, "
        "docs/architecture.md#adding-a-family), for a model fi-convert does not know; the "
        "output records it.",
    ),
]
DebugOpt = Annotated[
    bool, typer.Option("--debug", help="Show tracebacks.", envvar="FI_CONVERT_DEBUG")
]
