"""The `fi-convert` command: a thin layer that parses, calls the library and renders results.

Results (and `--json`) go to stdout; progress, warnings and errors go to stderr. Progress bars
show only when stderr is a terminal. Library errors become one red line and exit code 1
(`--debug` or FI_CONVERT_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__, sizes
from .cli_progress import (
    Display,
    Stopwatch,
    convert_figures,
    convert_text,
    figures_text,
    output_bytes,
    progress_mode,
    size,
)
from .cli_usage import one_line_group
from .errors import FiConvertError, ManifestError, SourceError
from .names import DEFAULT_MAX_MEMORY, DEFAULT_SHARD_BYTES, Backend, SchemeName
from .paths import OUTPUT_FIX, exists, model_exists

if TYPE_CHECKING:  # the library (and torch) is imported by the commands that use it
    from . import hub
    from .plan import Options, Plan

T = TypeVar("T")
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)
app = typer.Typer(
    cls=one_line_group(err),
    help="Convert MoE checkpoints offline into FlashInfer's kernel layouts.\n\n"
    "Usage: fi-convert MODEL_DIR OUT_DIR --scheme SCHEME (the `convert` command is the default).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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
UnservableOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unservable",
        help="Convert even when vLLM 0.33 cannot serve the output (fp8-tensor without static "
        "activation scales, e.g. from BF16); refused otherwise.",
    ),
]
DebugOpt = Annotated[
    bool, typer.Option("--debug", help="Show tracebacks.", envvar="FI_CONVERT_DEBUG")
]


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


def _fail(e: Exception, debug: bool) -> typer.Exit:
    if debug:
        err.print_exception()
    err.print(f"[red]error:[/red] {escape(str(e))}")
    return typer.Exit(1)


def _warn(notes: list[str], quiet: bool) -> None:
    """Warnings on stderr, each once (the library says per-layer ones once, with the number
    of layers); none with --quiet, which leaves only errors and the result."""
    for note in [] if quiet else dict.fromkeys(notes):
        err.print(f"[yellow]warning:[/yellow] {escape(note)}")


def _render_plan(plan: Plan) -> None:
    from .format.manifest import layer_groups

    s = plan.summary()
    how = "detected" if plan.detected else "requested"
    out.print(
        f"[bold]{escape(str(plan.ckpt.root))}[/bold]: family {s['family']} "
        f"(model_type {s['model_type']}), "
        f"scheme [bold]{s['scheme']}[/bold] ({how}), backend {s['backend']}, tp {s['tp_size']}"
    )
    for names, count, lay in layer_groups(s["layers"]):
        out.print(
            f"{count} MoE layer(s) {names}: {lay['num_experts']} experts, "
            f"H {lay['hidden_size']} (padded {lay['padded_hidden_size']}), "
            f"I {lay['intermediate_size']} = {lay['intermediate_size_per_rank']} per rank "
            f"(padded {lay['padded_intermediate_size_per_rank']})"
        )
        t = Table(box=None, pad_edge=False)
        for col in ("tensor", "dtype", "shape per rank", "layout"):
            t.add_column(col)
        for name, ten in lay["tensors"].items():
            extra = f", tile {ten['epilogue_tile_m']}" if ten.get("epilogue_tile_m") else ""
            t.add_row(name, ten["dtype"], str(ten["shape_per_rank"]), ten["layout"] + extra)
        out.print(t)
    out.print(
        f"{s['passthrough_tensors']} other tensors copied unchanged; {len(s['side_files'])} "
        f"other files carried over; {s['output_shards']} output shard(s); read "
        f"{size(s['bytes_to_read'])}, write {size(s['bytes_to_write'])}"
    )


@app.command("convert")
def convert_cmd(
    model_dir: Annotated[
        str, typer.Argument(help="Source model folder, or a Hub repo id (org/name).")
    ],
    out_dir: Annotated[Path, typer.Argument(help="Output folder (created).", readable=False)],
    scheme: SchemeOpt = SchemeName.AUTO,
    backend: BackendOpt = Backend.TRTLLM,
    tp_size: TpOpt = 1,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision",
            metavar="REV",
            help="Branch, tag or commit of a Hub repo-id source (default: main).",
        ),
    ] = None,
    push_to: Annotated[
        str | None,
        typer.Option(
            "--push-to",
            metavar="ORG/NAME",
            help="Then publish OUT_DIR to this Hub repo (org/name).",
        ),
    ] = None,
    private: Annotated[
        bool, typer.Option("--private", help="Create the --push-to repo private.")
    ] = False,
    base_model: Annotated[
        str | None,
        typer.Option(
            "--base-model",
            metavar="ORG/NAME",
            help="Hub repo id the model card names as base model (default: a repo-id source).",
        ),
    ] = None,
    device: Annotated[
        str,
        typer.Option(
            "--device",
            metavar="DEVICE",
            callback=device_name,
            help="Where to transform: auto (CUDA when present), cpu, cuda or cuda:N.",
        ),
    ] = "auto",
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite/--no-overwrite",
            help="Replace the contents of an out-dir that is not ours.",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and stop.")] = False,
    max_shard_size: Annotated[
        int,
        typer.Option(
            "--max-shard-size",
            parser=parse_size,
            metavar="SIZE",
            help="Largest output shard, e.g. 5GB or 4GiB (0: as large as the source's largest).",
        ),
    ] = DEFAULT_SHARD_BYTES,
    max_memory: Annotated[
        int,
        typer.Option(
            "--max-memory",
            parser=parse_size,
            metavar="SIZE",
            show_default=False,
            help="Working-memory budget for expert chunks, shared by the jobs, e.g. 8GiB "
            f"(default: {DEFAULT_MAX_MEMORY >> 30}GiB).",
        ),
    ] = DEFAULT_MAX_MEMORY,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=0,
            metavar="N",
            help="Output shards converted at once (0: one per CPU, up to 8, as --max-memory "
            "allows). The bytes written do not depend on it.",
        ),
    ] = 0,
    fsync: Annotated[
        bool,
        typer.Option(
            "--fsync/--no-fsync",
            help="Flush every file to disk before writing the manifest, so that the manifest's "
            "claim survives a power loss. --no-fsync is for runs whose output is uploaded "
            "and thrown away (CI), where waiting for the disk buys nothing.",
        ),
    ] = True,
    stream: Annotated[
        bool | None,
        typer.Option(
            "--stream/--no-stream",
            help="With --push-to: upload each output shard as soon as it is made and delete "
            "it, keeping disk use under --max-disk; a Hub source is read by byte ranges, never "
            "downloaded. OUT_DIR is then only a staging folder. Default: on for a Hub source.",
        ),
    ] = None,
    max_disk: Annotated[
        int,
        typer.Option(
            "--max-disk",
            parser=parse_size,
            metavar="SIZE",
            show_default=False,
            help="Disk budget of a streamed run's staged shards (default: 12GiB, which fits a "
            "standard hosted CI runner).",
        ),
    ] = 0,
    part: Annotated[
        str | None,
        typer.Option(
            "--part",
            metavar="K/N",
            help="Streamed runs split across a CI matrix: convert and upload only part K of N "
            "of the output shards. After every part, one run without --part writes the "
            "index, card and manifest (and converts any shard a part left out).",
        ),
    ] = None,
    allow_unservable: UnservableOpt = False,
    as_json: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Convert MODEL_DIR (a folder, or a Hub repo id) into OUT_DIR (the default command)."""
    from . import hub
    from .format.names import MANIFEST_NAME
    from .pipeline import preflight, run_plan
    from .plan import Options, make_plan

    opts = Options(scheme, backend, tp_size, max_shard_size, max_memory, allow_unservable)
    if (private or base_model) and not push_to:
        raise typer.BadParameter("--private and --base-model go with --push-to")
    if (stream or max_disk or part) and not push_to:
        raise typer.BadParameter("--stream, --max-disk and --part go with --push-to")
    parts = None
    if part is not None:
        from .hub.stream import parse_part

        try:
            parts = parse_part(part)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    show = err.is_terminal and not quiet and not as_json
    how = progress_mode(err, quiet, as_json)
    pushed = None
    try:
        local = model_exists(Path(model_dir))
    except FiConvertError as e:
        raise _fail(e, debug) from None
    if stream is None:
        stream = bool(push_to) and (not local or bool(max_disk) or parts is not None)
    if parts is not None and not stream:
        raise typer.BadParameter("--part needs a streamed run (drop --no-stream)")
    try:
        if push_to:  # fail in seconds, not after the conversion
            hub.check_target(push_to)
        if stream and not dry_run:
            assert push_to is not None
            _streamed(model_dir, out_dir, push_to, opts, revision, private, base_model,
                      max_disk, device, jobs, how, as_json, parts)  # fmt: skip
            return
        with Display(err, how, "downloading") as dl:
            src = _in_background(
                hub.resolve_source, model_dir, revision=revision, progress=dl.bytes_callback()
            )
        if src.repo_id and how != "off":
            err.print(f"source: {src.repo_id} at {src.commit} ({escape(str(src.path))})")
        plan = make_plan(src.path, opts)
        plan.provenance = provenance(src.repo_id, src.commit, plan)
        if not dry_run:
            preflight(plan, out_dir, device=device, overwrite=overwrite)
        if plan.detected and how != "off":
            err.print(f"scheme: detected [bold]{plan.scheme.value}[/bold]")
        _warn(plan.notes, quiet)
        if dry_run:
            if as_json:
                out.print_json(json.dumps(plan.summary()))
            else:
                _render_plan(plan)
            return
        watch = Stopwatch()
        with Display(err, how) as shown:
            res = run_plan(
                plan,
                out_dir,
                device=device,
                overwrite=overwrite,
                progress=shown.callback(),
                jobs=jobs,
                fsync=fsync,
            )
        figures = convert_figures(res, watch)
        if push_to:
            base = base_model or src.repo_id
            push_watch = Stopwatch()
            pushed = _push_after_convert(
                out_dir, push_to, private, base, src.commit, show, quiet or as_json
            )
            push_figures = push_watch.figures(figures["bytes"])
    except FiConvertError as e:
        raise _fail(e, debug) from None
    except KeyboardInterrupt as e:
        if stream and push_to:  # the target is the journal a rerun resumes from
            where = f"{escape(push_to)} holds no manifest yet"
        elif not out_dir.exists():  # still downloading the source (kept in the Hub cache)
            where = f"nothing was written to {escape(str(out_dir))} yet"
        else:
            kept = (out_dir / MANIFEST_NAME).is_file()  # a finished output not yet replaced
            state = "still holds its finished output" if kept else "is incomplete (no manifest)"
            where = f"{escape(str(out_dir))} {state}"
        raise _stopped(e, f"{where}; run the same command again to resume") from None
    s = {**res.summary(), **figures}
    if src.repo_id:
        s["source_repo"] = src.summary()
    if pushed:
        s["push"] = {**pushed.summary(), **push_figures}
    if as_json:
        out.print_json(json.dumps(s))
        return
    _warn(res.warnings, quiet)
    if res.up_to_date:
        out.print(
            f"[green]up to date[/green]: {escape(str(res.out_dir))} holds this conversion "
            f"({s['scheme']}, {s['backend']}, tp {s['tp_size']}) of the source as it is now; "
            "nothing written (`fi-convert verify` checks its bytes)"
        )
        return
    reused = f" ({len(res.reused_files)} reused from an earlier run)" if res.reused_files else ""
    out.print(
        f"[green]done[/green]: {s['moe_layers']} MoE layers x {s['num_experts']} experts -> "
        f"{escape(str(res.out_dir))} ({s['scheme']}, {s['backend']}, tp {s['tp_size']}, "
        f"on {s['device']}); "
        f"{s['files']} files{reused}, {convert_text(figures)}, manifest {s['manifest']}"
    )
    if pushed:
        _render_push(out_dir, pushed, push_figures)


def provenance(repo_id: str | None, commit: str | None, plan: Plan) -> dict:
    """The manifest's record of where a conversion's source came from: for a Hub repo, its id
    and the exact commit, and the command that converts it (local paths never appear)."""
    if repo_id is None:
        return {}
    o = plan.options
    cmd = f"fi-convert {repo_id} OUT_DIR --revision {commit} --scheme {plan.scheme.value} "
    cmd += f"--backend {o.backend.value} --tp-size {o.tp_size}"
    if o.max_shard_bytes:
        cmd += f" --max-shard-size {o.max_shard_bytes}"
    return {"repo_id": repo_id, "revision": commit, "command": cmd}


def _streamed(
    model_dir: str,
    out_dir: Path,
    push_to: str,
    opts: Options,
    revision: str | None,
    private: bool,
    base_model: str | None,
    max_disk: int,
    device: str,
    jobs: int,
    how: str,
    as_json: bool,
    part: tuple[int, int] | None = None,
) -> None:
    """Convert shard by shard straight to the Hub (hub.stream): a Hub source read by byte
    ranges, each output shard uploaded as soon as it is made."""
    from . import hub
    from .hub import remote, stream
    from .plan import make_plan
    from .st_io import SourceFiles

    local = model_exists(Path(model_dir))
    if local and revision is not None:
        raise SourceError(
            f"{model_dir}: a local folder, and --revision applies only to a Hub repo id; "
            "drop --revision, or pass the repo id (org/name)"
        )
    repo_id = commit = staging = None
    try:
        if local:
            root, files = Path(model_dir), SourceFiles()
        else:
            if not hub.is_repo_id(model_dir):
                raise SourceError(
                    f"{model_dir}: no such folder, and not a Hub repo id (org/name); pass a local "
                    "model folder or a repo id"
                )
            repo = remote.RemoteRepo.open(model_dir, revision)
            repo_id, commit = repo.repo_id, repo.commit
            if how != "off":
                err.print(
                    f"source: {repo_id} at {commit}, read by byte ranges (nothing downloaded)"
                )
            staging = stream.Staging.claim(out_dir, SourceFiles())
            # small files and shard headers only: huggingface_hub's bars stay off (one display)
            root = remote.mirror(repo, staging.root / ".source", progress=False)
            files = remote.RemoteSourceFiles(repo, root)
        plan = make_plan(root, opts)
        plan.provenance = provenance(repo_id, commit, plan)
        if plan.detected and how != "off":
            err.print(f"scheme: detected [bold]{plan.scheme.value}[/bold]")
        _warn(plan.notes, how == "off" and not as_json)
        base = base_model or repo_id
        summary = plan.summary()  # before the staging folder, the mirror in it included, goes
        watch = Stopwatch()
        with Display(err, how) as shown:
            res = stream.stream_to_hub(
                plan,
                files,
                out_dir,
                push_to,
                private=private,
                max_disk=max_disk or stream.DEFAULT_MAX_DISK,
                device=device,
                jobs=jobs,
                base_model=base,
                base_revision=commit,
                progress=shown.callback(),
                part=part,
                staging=staging,
            )
    finally:
        if staging is not None:  # let go of it, whatever happened (a failed run's stays)
            staging.release()
    made = {s.name: s.nbytes for s in plan.shards}
    figures = watch.figures(sum(made.get(n, 0) for n in res.uploaded))
    if as_json:
        out.print_json(json.dumps({**summary, **figures, "push": res.summary()}))
        return
    _warn(res.warnings, how == "off")
    again = f", {len(res.skipped)} already there" if res.skipped else ""
    if part is not None:
        out.print(
            f"[green]part {part[0]}/{part[1]} done[/green]: {len(res.uploaded)} shards "
            f"uploaded to {escape(res.url)}{again} ({figures_text(figures)}); after every "
            "part, run the same command without --part to finish"
        )
        return
    out.print(
        f"[green]pushed[/green]: {len(plan.layers)} MoE layers -> {escape(res.url)} "
        f"({plan.scheme.value}, {plan.options.backend.value}, tp {plan.options.tp_size}; "
        f"{len(res.uploaded)} shards uploaded{again}, {figures_text(figures)}, peak staged "
        f"{size(res.peak_disk)}; commit {(res.commit or '')[:12]})"
    )


def _push_after_convert(
    out_dir: Path,
    repo_id: str,
    private: bool,
    base_model: str | None,
    base_revision: str | None,
    show: bool,
    quiet: bool = False,
) -> hub.PushResult:
    from . import hub

    if base_model is None and not quiet:
        err.print(
            "[yellow]warning:[/yellow] the model card names no base model; "
            "pass --base-model org/name to link it"
        )
    try:
        return _in_background(
            hub.push,
            out_dir,
            repo_id,
            private=private,
            base_model=base_model,
            base_revision=base_revision,
            progress=show,
        )
    except FiConvertError as e:
        raise type(e)(
            f"{e} (the conversion in {out_dir} is complete: `fi-convert push {out_dir} "
            f"{repo_id}` publishes it)"
        ) from None


def _render_push(out_dir: Path, res: hub.PushResult, figures: dict) -> None:
    where = f"{escape(str(out_dir))} -> {escape(res.url)} (revision {escape(res.revision)}"
    if res.up_to_date:  # the target held every file: nothing sent, nothing committed
        out.print(f"[green]up to date[/green]: {where}, {res.files} files there already)")
        return
    held = res.files - res.uploaded
    out.print(
        f"[green]pushed[/green]: {where}, commit {escape(str(res.commit)[:12])}, "
        f"{res.uploaded} of {res.files} files uploaded"
        + (f" ({held} there already)" if held else "")
        + f", {figures_text(figures)})"
    )


@app.command("inspect")
def inspect_cmd(
    model_dir: Annotated[str, typer.Argument(help="Source model folder.")],
    scheme: SchemeOpt = SchemeName.AUTO,
    backend: BackendOpt = Backend.TRTLLM,
    tp_size: TpOpt = 1,
    allow_unservable: UnservableOpt = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Print MODEL_DIR's conversion plan (writes nothing) and the other schemes it takes.

    Of the other schemes and backends, it lists those that plan, says why the rest do not,
    and which of them quantize.
    """
    from .plan import Options, choices, make_plan

    try:
        opts = Options(scheme, backend, tp_size, allow_unservable=allow_unservable)
        plan = make_plan(model_dir, opts)
        cs = choices(plan)
    except FiConvertError as e:
        raise _fail(e, debug) from None
    for note in plan.notes:
        err.print(f"[yellow]warning:[/yellow] {escape(note)}")
    here = next(c.precision or "" for c in cs if c.scheme is plan.scheme)
    if as_json:
        s = plan.summary() | {"precision": here, "choices": [c.summary() for c in cs]}
        out.print_json(json.dumps(s))
        return
    _render_plan(plan)
    out.print(f"precision: {escape(here)}")
    _render_choices(plan, cs)


def _render_choices(plan: Plan, cs: list) -> None:
    """The schemes (with their backends) that plan and serve, then one line per scheme (and
    its backends) that cannot, saying why."""
    takes: dict[str, list[str]] = {}
    cannot: dict[tuple[str, str], list[str]] = {}
    for c in cs:
        b = c.backend.value
        if c.why_not is None:
            takes.setdefault(c.scheme.value, []).append(b)
        else:
            why = c.why_not + ("; --allow-unservable converts it anyway" if c.unservable else "")
            cannot.setdefault((c.scheme.value, why), []).append(b)
    precision = {c.scheme.value: c.precision or "" for c in cs if c.why_not is None}
    out.print(f"this checkpoint takes (--scheme, --backend; tp {plan.options.tp_size}):")
    for name, backends in takes.items():
        out.print(f"  {name} ({', '.join(backends)}): {escape(precision[name])}")
    if cannot:
        out.print("and cannot take:")
    for (name, why), backends in cannot.items():
        out.print(f"  {name} ({', '.join(backends)}): {escape(why)}")


@app.command("verify")
def verify_cmd(
    out_dir: Annotated[
        Path,
        typer.Argument(
            help="A finished fi-convert output folder, or a Hub repo id (org/name) of a "
            "published one (checked on the Hub, nothing downloaded).",
            readable=False,
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            metavar="MODEL_DIR",
            help="The source model folder or Hub repo id: re-derive a sample of experts and "
            "compare (a Hub source is read by byte ranges).",
        ),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision", metavar="REV", help="Revision of a Hub repo-id OUT_DIR (default: main)."
        ),
    ] = None,
    full: Annotated[bool, typer.Option("--full", help="With --source: every expert.")] = False,
    against_flashinfer: Annotated[
        bool,
        typer.Option(
            "--against-flashinfer", help="With --source: re-derive with FlashInfer's functions."
        ),
    ] = False,
    device: Annotated[
        str,
        typer.Option(
            "--device",
            metavar="DEVICE",
            callback=device_name,
            help="Where to re-derive: auto, cpu, cuda or cuda:N.",
        ),
    ] = "auto",
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Check OUT_DIR against its manifest; with --source, its bytes against the source.

    Files against their SHA-256s, the index against the shards, the manifest's shapes and
    dtypes; --source re-derives a sample of experts (--full: all), with fi-convert's code or
    (--against-flashinfer) FlashInfer's.
    """
    from .verify import verify

    if (full or against_flashinfer) and source is None:
        flag = "--full" if full else "--against-flashinfer"
        raise typer.BadParameter(
            f"{flag} needs --source MODEL_DIR (the source to re-derive the experts from)"
        )
    from .hub import is_repo_id

    try:
        remote = not exists(out_dir, ManifestError, OUTPUT_FIX) and is_repo_id(str(out_dir))
    except FiConvertError as e:
        raise _fail(e, debug) from None
    read: dict = {}
    watch = Stopwatch()
    try:
        if remote:
            from .hub.remote_verify import verify_remote

            rep, read = verify_remote(  # in this thread: its temporary folder is removed
                str(out_dir),
                revision=revision,
                source=source,
                full=full,
                against_flashinfer=against_flashinfer,
                device=device,
            )
        elif revision is not None:
            raise typer.BadParameter("--revision goes with a Hub repo-id OUT_DIR")
        else:
            rep = verify(
                out_dir,
                source=source,
                full=full,
                against_flashinfer=against_flashinfer,
                device=device,
            )
    except FiConvertError as e:
        raise _fail(e, debug) from None
    except KeyboardInterrupt as e:
        where = escape(str(out_dir))
        raise _stopped(e, f"verify of {where} stopped; nothing was changed") from None
    # the bytes checked: every file's (hashed), or for a repo id what was read from the Hub
    checked = sum(r.get("bytes", 0) for r in read.values()) if remote else output_bytes(out_dir)
    figures = watch.figures(checked)
    if as_json:
        extra = {"hub_reads": read} if remote else {}
        out.print_json(json.dumps({**rep.as_dict(), **figures, **extra}))
    else:
        for p in rep.problems + rep.unlisted:
            err.print(f"[red]mismatch:[/red] {escape(p)}")
        if rep.ok:
            what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in rep.checked.items())
            how = "read from the Hub" if remote else "checked"
            out.print(f"[green]ok[/green]: {escape(what)}; {figures_text(figures, how)}")
    if not rep.ok:
        raise typer.Exit(1)


@app.command("push")
def push_cmd(
    out_dir: Annotated[
        Path, typer.Argument(help="A finished fi-convert output folder.", readable=False)
    ],
    repo_id: Annotated[
        str, typer.Argument(metavar="ORG/NAME", help="Hub repo to publish to (created).")
    ],
    private: Annotated[
        bool, typer.Option("--private", help="Create the repo private (when it is new).")
    ] = False,
    revision: Annotated[
        str,
        typer.Option(
            "--revision", metavar="BRANCH", help="Branch to push to (created when missing)."
        ),
    ] = "main",
    base_model: Annotated[
        str | None,
        typer.Option(
            "--base-model",
            metavar="ORG/NAME",
            help="Hub repo id of the source model, for the model card.",
        ),
    ] = None,
    as_json: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Publish a finished OUT_DIR to the Hub with a model card (refused unless verify passes).

    Run it again after an interruption: it resumes.
    """
    from . import hub

    show = err.is_terminal and not quiet and not as_json
    watch = Stopwatch()
    try:
        res = _in_background(
            hub.push,
            out_dir,
            repo_id,
            private=private,
            revision=revision,
            base_model=base_model,
            progress=show,
        )
    except FiConvertError as e:
        raise _fail(e, debug) from None
    except KeyboardInterrupt as e:
        raise _stopped(
            e,
            f"{escape(repo_id)} holds no new manifest yet; run the same command again to "
            "resume (what is uploaded is kept)",
        ) from None
    figures = watch.figures(output_bytes(out_dir))
    if as_json:
        out.print_json(json.dumps({**res.summary(), **figures}))
        return
    if res.base_model is None and not quiet:
        err.print(
            "[yellow]warning:[/yellow] the model card names no base model; "
            "pass --base-model org/name to link it"
        )
    _render_push(out_dir, res, figures)


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


class Terminated(KeyboardInterrupt):
    """SIGTERM (docker stop, a cancelled CI job): stopped and cleaned up as Ctrl-C is."""


def _in_background(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, run on a daemon thread while this one waits, so that Ctrl-C
    stops at once: huggingface_hub's transfer threads would otherwise hold the interrupted
    main thread, and the exit, until their transfers end (minutes, or never on a stuck link).
    What such work leaves behind is whole or nothing on the Hub and resumable locally."""
    got: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            got["result"] = fn(*args, **kwargs)
        except BaseException as e:
            got["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="fi-convert-hub", daemon=True).start()
    while not done.wait(0.25):
        pass
    if "error" in got:
        raise got["error"]
    return got["result"]


def _stopped(e: KeyboardInterrupt, state: str) -> typer.Exit:
    """One line for a run stopped by Ctrl-C (exit 130) or SIGTERM (143)."""
    term = isinstance(e, Terminated)
    err.print(f"[red]{'terminated' if term else 'interrupted'}[/red]: {state}")
    return typer.Exit(143 if term else 130)


_stopping = False


def _on_signal(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM stops the run; later ones are ignored, so that the cleanup
    they would cut short (temporary files, the lock) finishes and no traceback is shown."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def main(argv: list[str] | None = None) -> None:
    """Entry point: `fi-convert MODEL OUT ...` is `fi-convert convert MODEL OUT ...`."""
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when ignored
        signal.signal(signal.SIGINT, _on_signal)
    args = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args if not a.startswith("-")), None)
    if first is not None and first not in COMMANDS:
        near = difflib.get_close_matches(first, sorted(COMMANDS), n=1)
        if near and "/" not in first and not os.path.exists(first):  # a mistyped command
            err.print(
                f"[red]error:[/red] no such command or folder {escape(repr(first))}; "
                f"did you mean {near[0]}?"
            )
            raise SystemExit(2)
        args.insert(0, "convert")
    try:
        app(args=args, prog_name="fi-convert")
    except SystemExit as e:
        if e.code in (130, 143) and threading.active_count() > 1:
            # stopped, cleaned up and said so: threads still sending (huggingface_hub's, an
            # upload under way) would hold the exit until their transfer ends, minutes later
            # (the interpreter joins every thread pool's threads at exit, daemon or not)
            _leave_now(e.code, finish=False)
        if argv is None and "torch" in sys.modules:
            # the process's own run (the console script, `python -m fi_convert`): all is
            # written, synced and said; the interpreter's teardown with torch loaded would
            # take another 0.9 s of a 2-core machine
            _leave_now(e.code)
        raise


def _leave_now(code: object, finish: bool = True) -> NoReturn:
    """Exit at once with `code` (as `SystemExit` would), with stdout and stderr flushed and
    (`finish`) the atexit handlers run, but without the interpreter's teardown."""
    if isinstance(code, str):  # SystemExit("message"): printed, exit status 1
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    if finish:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (`| head`)
            stream.flush()
    os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    main()
