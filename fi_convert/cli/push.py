"""`fi-convert push OUT_DIR ORG/NAME`: a finished output published to the Hub."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ._errors import handled
from ._options import DebugOpt, JsonOpt, QuietOpt
from ._output import Output, err
from ._process import _in_background
from ._progress import Stopwatch, figures_text, output_bytes

if TYPE_CHECKING:
    from ..hub import PushResult

NO_BASE_MODEL = "the model card names no base model; pass --base-model org/name to link it"

OutArg = Annotated[
    Path, typer.Argument(help="A finished fi-convert output folder.", readable=False)
]
RepoArg = Annotated[
    str, typer.Argument(metavar="ORG/NAME", help="Hub repo to publish to (created).")
]
PrivateOpt = Annotated[
    bool, typer.Option("--private", help="Create the repo private (when it is new).")
]
BranchOpt = Annotated[
    str,
    typer.Option("--revision", metavar="BRANCH", help="Branch to push to (created when missing)."),
]
BaseModelOpt = Annotated[
    str | None,
    typer.Option(
        "--base-model",
        metavar="ORG/NAME",
        help="Hub repo id of the source model, for the model card.",
    ),
]


def push_cmd(
    out_dir: OutArg,
    repo_id: RepoArg,
    private: PrivateOpt = False,
    revision: BranchOpt = "main",
    base_model: BaseModelOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Publish a finished OUT_DIR to the Hub with a model card (refused unless verify passes).

    Run it again after an interruption: it resumes.
    """
    from ..hub import push

    o = Output(as_json=as_json, quiet=quiet)
    watch = Stopwatch()
    stopped = (
        f"{escape(repo_id)} holds no new manifest yet; run the same command again to "
        "resume (what is uploaded is kept)"
    )
    bars = err.is_terminal and not quiet and not as_json  # huggingface_hub's own
    with handled(debug, stopped=stopped):
        res = _in_background(
            push,
            out_dir,
            repo_id,
            private=private,
            revision=revision,
            base_model=base_model,
            progress=bars,
        )
    figures = watch.figures(output_bytes(out_dir))
    if as_json:
        o.json({**res.summary(), **figures})
        return
    if res.base_model is None:
        o.warning(NO_BASE_MODEL)
    render_push(o, out_dir, res, figures)


def render_push(o: Output, out_dir: Path, res: PushResult, figures: dict) -> None:
    """A push's result line (also after `convert --push-to`)."""
    where = f"{escape(str(out_dir))} -> {escape(res.url)} (revision {escape(res.revision)}"
    if res.up_to_date:  # the target held every file: nothing sent, nothing committed
        o.result(f"[green]up to date[/green]: {where}, {res.files} files there already)")
        return
    held = res.files - res.uploaded
    o.result(
        f"[green]pushed[/green]: {where}, commit {escape(str(res.commit)[:12])}, "
        f"{res.uploaded} of {res.files} files uploaded"
        + (f" ({held} there already)" if held else "")
        + f", {figures_text(figures)})"
    )
