"""The `fi-convert` command: a thin layer that parses, calls the library and renders results.

One module per command (`convert`, `inspect`, `verify`, `push`), each: the flags, one call of
the library, the result through `_output.Output`. Shared pieces: `_options` (option aliases,
value parsers), `_output` (results and `--json` on stdout; warnings, hints and errors on
stderr), `_errors` (a library error is one red line and exit code 1; `--debug` or
FI_CONVERT_DEBUG=1 shows the traceback), `_usage` (usage errors, exit code 2, and help),
`_progress` (progress on stderr, only when it is a terminal or a CI log), `_process` (signals,
background threads, a quick exit). Nothing here imports the library's heavy modules (torch)
until a command runs.
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import Annotated

import typer
from rich.markup import escape

from ..version import __version__
from . import _process
from ._output import Output, err, out
from ._usage import one_line_group
from .convert import convert_cmd
from .inspect import inspect_cmd
from .push import push_cmd
from .verify import verify_cmd

app = typer.Typer(
    cls=one_line_group(err),
    help="Convert MoE checkpoints offline into FlashInfer's kernel layouts.\n\n"
    "Usage: fi-convert MODEL_DIR OUT_DIR --scheme SCHEME (the `convert` command is the default).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("convert")(convert_cmd)
app.command("inspect")(inspect_cmd)
app.command("verify")(verify_cmd)
app.command("push")(push_cmd)


@app.command("version")
def version_cmd() -> None:
    """Print the fi-convert version."""
    out.print(__version__)


def _print_version(value: bool) -> None:
    if value:
        out.print(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version."
        ),
    ] = False,
) -> None:
    pass


COMMANDS = {"convert", "inspect", "verify", "version", "push"}


def main(argv: list[str] | None = None) -> None:
    """Entry point: `fi-convert MODEL OUT ...` is `fi-convert convert MODEL OUT ...`."""
    _process.take_signals()
    args = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args if not a.startswith("-")), None)
    if first is not None and first not in COMMANDS:
        near = difflib.get_close_matches(first, sorted(COMMANDS), n=1)
        if near and "/" not in first and not os.path.exists(first):  # a mistyped command
            line = f"no such command or folder {escape(repr(first))}; did you mean {near[0]}?"
            Output().problem("error", line)
            raise SystemExit(2)
        args.insert(0, "convert")
    try:
        app(args=args, prog_name="fi-convert")
    except SystemExit as e:
        _process.exit_now_if_done(e.code, own_process=argv is None)
        raise


__all__ = ["app", "main"]
