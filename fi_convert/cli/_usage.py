"""The CLI's usage conventions, for `fi_convert.cli`: every usage error is one line on stderr
(`error: ...`, with a did-you-mean where a name is close) and exit code 2, and each command's
help has readable metavars (MODEL_DIR, SIZE; none for a flag) and examples. A PermissionError
that no command says better (a path this user may not read or write) is one line too, exit 1."""

from __future__ import annotations

import difflib
import os
import re
import shlex
import sys
from functools import partial
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer._click import exceptions as click_errors
from typer._click.core import Context
from typer.core import TyperArgument, TyperGroup

from ..paths import denied

PERMISSION_FIX = "run as a user who may use these paths, or change their permissions"

# Shown at the end of each command's --help.
EXAMPLES = {
    "convert": (
        "fi-convert ./DeepSeek-V3 out --tp-size 8",
        "fi-convert Qwen/Qwen3-30B-A3B out --scheme mxfp8 --device cpu",
        "fi-convert ./model out --dry-run",
        "fi-convert org/model staging --push-to me/model-fi --max-disk 20GiB",
    ),
    "inspect": (
        "fi-convert inspect ./model",
        "fi-convert inspect ./model --scheme nvfp4 --backend cutlass --tp-size 4 --json",
    ),
    "verify": (
        "fi-convert verify out",
        "fi-convert verify out --source ./model --full",
        "fi-convert verify me/model-fi --source org/model --against-flashinfer",
    ),
    "push": ("fi-convert push out me/model-fi --base-model org/model --private",),
    "version": ("fi-convert version", "fi-convert --version"),
}


def one_line_group(err: Console) -> type[TyperGroup]:
    """The command group class with these conventions, printing its errors to `err`."""

    class Group(_Group):
        console = err

    return Group


class _Group(TyperGroup):
    """The command group with fi-convert's conventions (see the module's docstring)."""

    console: Console

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, cmd in self.commands.items():
            _polish(name, cmd)
        _polish("", self)

    def main(  # type: ignore[override]
        self,
        args: list[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError:
            rv = 2  # the help has been printed
        except click_errors.UsageError as e:
            self.console.print(f"[red]error:[/red] {escape(_usage_line(e, argv, self))}")
            rv = 2
        except click_errors.ClickException as e:
            self.console.print(f"[red]error:[/red] {escape(e.format_message())}")
            rv = e.exit_code
        except typer.Abort:
            self.console.print("[red]aborted[/red]")
            rv = 1
        except PermissionError as e:
            if "--debug" in argv or os.environ.get("FI_CONVERT_DEBUG", "0") not in ("", "0"):
                raise
            line = denied(Path(e.filename), e, PERMISSION_FIX) if e.filename else str(e)
            self.console.print(f"[red]error:[/red] {escape(line)}")
            rv = 1
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _polish(name: str, cmd: Any) -> None:
    """Examples as the epilog; metavars for the help: an argument's name in capitals (no
    braces around it in the usage line, no type beside it), nothing for a flag, the name for
    other options that set none."""
    if name in EXAMPLES:
        cmd.epilog = "Examples:\n\n" + "\n".join(f"  {x}" for x in EXAMPLES[name])
    for p in [*cmd.params, cmd.get_help_option(Context(cmd))]:
        if p is None:
            continue
        if isinstance(p, TyperArgument):
            p.metavar = p.metavar or (p.name or "").upper()
            p.get_usage_pieces = partial(_metavar_only, p)  # type: ignore[method-assign]
            p.display_type_rich = partial(_no_type, p)  # type: ignore[method-assign]
        elif p.metavar is None:
            p.metavar = "" if p.is_flag else (p.name or "").upper()


def _metavar_only(p: TyperArgument, ctx: Context) -> list[str]:
    return [p.metavar or ""]


def _no_type(p: TyperArgument, ctx: Context) -> None:
    return None


def _label(p: Any) -> str:
    """How the user names parameter `p`: its long option, or an argument's metavar."""
    if isinstance(p, TyperArgument):
        return p.metavar or (p.name or "").upper()
    return next((o for o in p.opts if o.startswith("--")), p.opts[0])


def _given(argv: list[str], opts: list[str]) -> str | None:
    """The last value `argv` gives an option named by one of `opts`."""
    value = None
    for i, a in enumerate(argv):
        if a in opts and i + 1 < len(argv):
            value = argv[i + 1]
        for o in opts:
            if o.startswith("--") and a.startswith(o + "="):
                value = a[len(o) + 1 :]
    return value


def _plain(message: str) -> str:
    """Click's or typer's sentence as the tail of an `error:` line."""
    m = message.removeprefix("Value error, ").rstrip(".")
    m = re.sub(r"^Input should be ", "must be ", m)
    m = re.sub(r", unable to parse .*$", "", m)
    return m[:1].lower() + m[1:]


def _usage_line(e: click_errors.UsageError, argv: list[str], group: TyperGroup) -> str:
    """One line for a usage error: what is wrong, with the option's name and the value given,
    a did-you-mean where a name is close, and the choices or the usage where they help."""
    ctx = e.ctx
    see = f" ({ctx.command_path} --help lists them)" if ctx is not None else ""
    if isinstance(e, click_errors.MissingParameter) and e.param is not None:
        assert ctx is not None
        usage = " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)])
        return f"missing {_label(e.param)} (usage: {usage})"
    if isinstance(e, click_errors.BadParameter) and e.param is not None:
        p = e.param
        given = _given(argv, p.opts)
        head = _label(p) if given is None else f"{_label(p)} {shlex.quote(given)}"
        desc = getattr(p, "type_descriptor", None)
        if desc is not None and desc.is_choice and desc.choices:
            choices = [str(getattr(c, "value", c)) for c in desc.choices]
            near = difflib.get_close_matches(given or "", choices, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            what = (p.name or "value").replace("_", " ")
            return f"{head}: unknown {what}{hint} (choices: {', '.join(choices)})"
        return f"{head}: {_plain(e.message)}"
    if isinstance(e, click_errors.BadParameter):  # raised by a command: already a sentence
        return e.message
    if isinstance(e, click_errors.NoSuchOption):
        if e.possibilities:
            return f"no such option {e.option_name}; did you mean {e.possibilities[0]}?"
        return f"no such option {e.option_name}{see}"
    if isinstance(e, click_errors.BadOptionUsage):
        if e.message.endswith("requires an argument."):
            return f"{e.option_name} needs a value"
        if e.message.endswith("does not take a value."):
            return f"{e.option_name} takes no value"
    m = re.match(r"No such command '(.*?)'", e.message)
    if m:
        near = difflib.get_close_matches(m[1], list(group.commands), n=1)
        hint = f"; did you mean {near[0]}?" if near else f" (commands: {', '.join(group.commands)})"
        return f"no such command {m[1]!r}{hint}"
    m = re.match(r"Got unexpected extra argument(?:s|\(s\))? \((.*)\)", e.message)
    if m and ctx is not None:
        usage = " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)])
        return f"unexpected extra argument {m[1]} (usage: {usage})"
    return _plain(e.message)
