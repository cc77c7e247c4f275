"""`fi-convert convert MODEL_DIR OUT_DIR` (the default command): the flags, one call of the
library (`fi_convert.hub.convert_source`, or `stream_source` for a streamed run), the result."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ..names import DEFAULT_MAX_MEMORY, DEFAULT_SHARD_BYTES, Backend, SchemeName
from ..paths import model_exists
from ._errors import handled
from ._options import (
    BackendOpt,
    DebugOpt,
    FamilyOpt,
    JsonOpt,
    QuietOpt,
    SchemeOpt,
    ServerOpt,
    TpOpt,
    UnservableOpt,
    device_option,
    parse_size,
)
from ._output import Output, err
from ._process import _in_background
from ._progress import (
    Display,
    Stopwatch,
    convert_figures,
    convert_text,
    figures_text,
    progress_mode,
    size,
)
from .inspect import render_plan
from .push import NO_BASE_MODEL, render_push

if TYPE_CHECKING:
    from ..hub import Conversion, Streamed
    from ..pipeline import ProgressFn
    from ..plan import Plan

T = TypeVar("T")

ModelArg = Annotated[str, typer.Argument(help="Source model folder, or a Hub repo id (org/name).")]
OutArg = Annotated[Path, typer.Argument(help="Output folder (created).", readable=False)]
RevisionOpt = Annotated[
    str | None,
    typer.Option(
        "--revision",
        metavar="REV",
        help="Branch, tag or commit of a Hub repo-id source (default: main).",
    ),
]
PushToOpt = Annotated[
    str | None,
    typer.Option(
        "--push-to", metavar="ORG/NAME", help="Then publish OUT_DIR to this Hub repo (org/name)."
    ),
]
PrivateOpt = Annotated[bool, typer.Option("--private", help="Create the --push-to repo private.")]
BaseModelOpt = Annotated[
    str | None,
    typer.Option(
        "--base-model",
        metavar="ORG/NAME",
        help="Hub repo id the model card names as base model (default: a repo-id source).",
    ),
]
DeviceOpt = Annotated[
    str, device_option("Where to transform: auto (CUDA when present), cpu, cuda or cuda:N.")
]
OverwriteOpt = Annotated[
    bool,
    typer.Option(
        "--overwrite/--no-overwrite", help="Replace the contents of an out-dir that is not ours."
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan and stop.")]
ShardSizeOpt = Annotated[
    int,
    typer.Option(
        "--max-shard-size",
        parser=parse_size,
        metavar="SIZE",
        help="Largest output shard, e.g. 5GB or 4GiB (0: as large as the source's largest).",
    ),
]
MemoryOpt = Annotated[
    int,
    typer.Option(
        "--max-memory",
        parser=parse_size,
        metavar="SIZE",
        show_default=False,
        help="Working-memory budget for expert chunks, shared by the jobs, e.g. 8GiB "
        f"(default: {DEFAULT_MAX_MEMORY >> 30}GiB).",
    ),
]
JobsOpt = Annotated[
    int,
    typer.Option(
        "--jobs",
        "-j",
        min=0,
        metavar="N",
        help="Output shards converted at once (0: one per CPU, up to 8, as --max-memory "
        "allows). The bytes written do not depend on it.",
    ),
]
FsyncOpt = Annotated[
    bool,
    typer.Option(
        "--fsync/--no-fsync",
        help="Flush every file to disk before writing the manifest, so that the manifest's "
        "claim survives a power loss. --no-fsync is for runs whose output is uploaded "
        "and thrown away (CI), where waiting for the disk buys nothing.",
    ),
]
StreamOpt = Annotated[
    bool | None,
    typer.Option(
        "--stream/--no-stream",
        help="With --push-to: upload each output shard as soon as it is made and delete "
        "it, keeping disk use under --max-disk; a Hub source is read by byte ranges, never "
        "downloaded. OUT_DIR is then only a staging folder. Default: on for a Hub source.",
    ),
]
DiskOpt = Annotated[
    int,
    typer.Option(
        "--max-disk",
        parser=parse_size,
        metavar="SIZE",
        show_default=False,
        help="Disk budget of a streamed run's staged shards (default: 12GiB, which fits a "
        "standard hosted CI runner).",
    ),
]
PartOpt = Annotated[
    str | None,
    typer.Option(
        "--part",
        metavar="K/N",
        help="Streamed runs split across a CI matrix: convert and upload only part K of N "
        "of the output shards. After every part, one run without --part writes the "
        "index, card and manifest (and converts any shard a part left out).",
    ),
]


def convert_cmd(
    model_dir: ModelArg,
    out_dir: OutArg,
    scheme: SchemeOpt = SchemeName.AUTO,
    backend: BackendOpt = Backend.TRTLLM,
    tp_size: TpOpt = 1,
    server: ServerOpt = "vllm",
    revision: RevisionOpt = None,
    push_to: PushToOpt = None,
    private: PrivateOpt = False,
    base_model: BaseModelOpt = None,
    device: DeviceOpt = "auto",
    overwrite: OverwriteOpt = False,
    dry_run: DryRunOpt = False,
    max_shard_size: ShardSizeOpt = DEFAULT_SHARD_BYTES,
    max_memory: MemoryOpt = DEFAULT_MAX_MEMORY,
    jobs: JobsOpt = 0,
    fsync: FsyncOpt = True,
    stream: StreamOpt = None,
    max_disk: DiskOpt = 0,
    part: PartOpt = None,
    allow_unservable: UnservableOpt = False,
    family: FamilyOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Convert MODEL_DIR (a folder, or a Hub repo id) into OUT_DIR (the default command)."""
    from ..hub import convert_source, stream_source
    from ..plan import Options

    opts = Options(
        scheme,
        backend,
        tp_size,
        max_shard_size,
        max_memory,
        allow_unservable,
        server=server,
        family=family,
    )
    parts = _check_flags(push_to, private, base_model, stream, max_disk, part)
    how = progress_mode(err, quiet, as_json)
    stream = _streams(model_dir, push_to, stream, max_disk, parts, debug)
    streamed = stream and not dry_run
    # --quiet with --json: a streamed run still says the plan's warnings (as it always did)
    shown = Shown(Output(as_json=as_json, quiet=quiet and not (as_json and streamed)), how)
    with handled(debug, stopped=lambda: _left(out_dir, push_to if stream else None)):
        if streamed and push_to:
            st = stream_source(
                model_dir,
                out_dir,
                push_to,
                opts,
                revision=revision,
                private=private,
                base_model=base_model,
                max_disk=max_disk,
                device=device,
                jobs=jobs,
                part=parts,
                listener=shown,
            )
            _render_streamed(shown, st, parts)
            return
        done = convert_source(
            model_dir,
            out_dir,
            opts,
            revision=revision,
            push_to=push_to,
            private=private,
            base_model=base_model,
            device=device,
            overwrite=overwrite,
            dry_run=dry_run,
            jobs=jobs,
            fsync=fsync,
            listener=shown,
        )
    _render(shown, done, out_dir)


def _check_flags(
    push_to: str | None,
    private: bool,
    base_model: str | None,
    stream: bool | None,
    max_disk: int,
    part: str | None,
) -> tuple[int, int] | None:
    """The flags that go with --push-to; the --part given, as (K, N)."""
    if (private or base_model) and not push_to:
        raise typer.BadParameter("--private and --base-model go with --push-to")
    if (stream or max_disk or part) and not push_to:
        raise typer.BadParameter("--stream, --max-disk and --part go with --push-to")
    if part is None:
        return None
    from ..hub.stream import parse_part

    try:
        return parse_part(part)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def _streams(
    model_dir: str,
    push_to: str | None,
    stream: bool | None,
    max_disk: int,
    parts: tuple[int, int] | None,
    debug: bool,
) -> bool:
    """Whether the run streams to --push-to: --stream, or by default for a Hub source, a
    --max-disk or a --part."""
    with handled(debug):
        local = model_exists(Path(model_dir))
    if stream is None:
        stream = bool(push_to) and (not local or bool(max_disk) or parts is not None)
    if parts is not None and not stream:
        raise typer.BadParameter("--part needs a streamed run (drop --no-stream)")
    return stream


def _left(out_dir: Path, streamed_to: str | None) -> str:
    """What a stopped conversion leaves, for the line that says it stopped."""
    from ..format.names import MANIFEST_NAME

    if streamed_to:  # the target is the journal a rerun resumes from
        where = f"{escape(streamed_to)} holds no manifest yet"
    elif not out_dir.exists():  # still downloading the source (kept in the Hub cache)
        where = f"nothing was written to {escape(str(out_dir))} yet"
    else:
        kept = (out_dir / MANIFEST_NAME).is_file()  # a finished output not yet replaced
        state = "still holds its finished output" if kept else "is incomplete (no manifest)"
        where = f"{escape(str(out_dir))} {state}"
    return f"{where}; run the same command again to resume"


class Shown:
    """How `convert` follows the library's run (a `fi_convert.hub.Listener`): what it says on
    stderr, the progress displays, the timings for the summary, and network calls on a thread
    of their own."""

    def __init__(self, o: Output, how: str) -> None:
        self.o, self.how = o, how
        self.watch = self.push_watch = Stopwatch()

    def source(self, repo_id: str, commit: str | None, path: Path | None) -> None:
        if self.how == "off":
            return
        where = f" ({escape(str(path))})" if path else ", read by byte ranges (nothing downloaded)"
        self.o.hint(f"source: {repo_id} at {commit}{where}")

    def planned(self, plan: Plan) -> None:
        if plan.detected and self.how != "off":
            self.o.hint(f"scheme: detected [bold]{plan.scheme.value}[/bold]")
        self.o.warnings(plan.notes)

    @contextlib.contextmanager
    def downloading(self) -> Iterator[Callable[[int, int], None] | None]:
        with Display(err, self.how, "downloading") as shown:
            yield shown.bytes_callback()

    @contextlib.contextmanager
    def converting(self) -> Iterator[ProgressFn | None]:
        self.watch = Stopwatch()
        with Display(err, self.how) as shown:
            yield shown.callback()
        self.watch.stop()

    @contextlib.contextmanager
    def pushing(self, base_model: str | None) -> Iterator[bool]:
        self.push_watch = Stopwatch()
        if base_model is None and not self.o.as_json:
            self.o.warning(NO_BASE_MODEL)
        yield err.is_terminal and not self.o.quiet and not self.o.as_json
        self.push_watch.stop()

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return _in_background(fn, *args, **kwargs)


def _render(shown: Shown, done: Conversion, out_dir: Path) -> None:
    o, res, pushed = shown.o, done.result, done.pushed
    if res is None:  # a dry run
        if o.as_json:
            o.json(done.plan.summary())
        else:
            render_plan(o, done.plan)
        return
    figures = convert_figures(res, shown.watch)
    s = {**res.summary(), **figures}
    if done.source.repo_id:
        s["source_repo"] = done.source.summary()
    if pushed:
        push_figures = shown.push_watch.figures(figures["bytes"])
        s["push"] = {**pushed.summary(), **push_figures}
    if o.as_json:
        o.json(s)
        return
    o.warnings(res.warnings)
    if res.up_to_date:
        o.result(
            f"[green]up to date[/green]: {escape(str(res.out_dir))} holds this conversion "
            f"({s['scheme']}, {s['backend']}, tp {s['tp_size']}) of the source as it is now; "
            "nothing written (`fi-convert verify` checks its bytes)"
        )
        return
    reused = f" ({len(res.reused_files)} reused from an earlier run)" if res.reused_files else ""
    o.result(
        f"[green]done[/green]: {s['moe_layers']} MoE layers x {s['num_experts']} experts -> "
        f"{escape(str(res.out_dir))} ({s['scheme']}, {s['backend']}, tp {s['tp_size']}, "
        f"for {s['server']}, on {s['device']}); "
        f"{s['files']} files{reused}, {convert_text(figures)}, manifest {s['manifest']}"
    )
    if pushed:
        render_push(o, out_dir, pushed, push_figures)


def _render_streamed(shown: Shown, st: Streamed, part: tuple[int, int] | None) -> None:
    o, res, plan = shown.o, st.result, st.plan
    made = {s.name: s.nbytes for s in plan.shards}
    figures = shown.watch.figures(sum(made.get(n, 0) for n in res.uploaded))
    if o.as_json:
        o.json({**st.summary, **figures, "push": res.summary()})
        return
    o.warnings(res.warnings)
    again = f", {len(res.skipped)} already there" if res.skipped else ""
    if part is not None:
        o.result(
            f"[green]part {part[0]}/{part[1]} done[/green]: {len(res.uploaded)} shards "
            f"uploaded to {escape(res.url)}{again} ({figures_text(figures)}); after every "
            "part, run the same command without --part to finish"
        )
        return
    o.result(
        f"[green]pushed[/green]: {len(plan.layers)} MoE layers -> {escape(res.url)} "
        f"({plan.scheme.value}, {plan.options.backend.value}, tp {plan.options.tp_size}; "
        f"{len(res.uploaded)} shards uploaded{again}, {figures_text(figures)}, peak staged "
        f"{size(res.peak_disk)}; commit {(res.commit or '')[:12]})"
    )
