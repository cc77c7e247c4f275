"""`fi-convert verify OUT_DIR`: an output (a folder, or a published Hub repo) against its
manifest, and with --source against the source."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ..errors import ManifestError
from ..paths import OUTPUT_FIX, exists
from ._errors import handled
from ._options import DebugOpt, JsonOpt, device_option
from ._output import Output
from ._progress import Stopwatch, figures_text, output_bytes

if TYPE_CHECKING:
    from ..verify import Report

OutArg = Annotated[
    Path,
    typer.Argument(
        help="A finished fi-convert output folder, or a Hub repo id (org/name) of a "
        "published one (checked on the Hub, nothing downloaded).",
        readable=False,
    ),
]
SourceOpt = Annotated[
    str | None,
    typer.Option(
        "--source",
        metavar="MODEL_DIR",
        help="The source model folder or Hub repo id: re-derive a sample of experts and "
        "compare (a Hub source is read by byte ranges).",
    ),
]
RevisionOpt = Annotated[
    str | None,
    typer.Option(
        "--revision", metavar="REV", help="Revision of a Hub repo-id OUT_DIR (default: main)."
    ),
]
FullOpt = Annotated[bool, typer.Option("--full", help="With --source: every expert.")]
FlashInferOpt = Annotated[
    bool,
    typer.Option(
        "--against-flashinfer", help="With --source: re-derive with FlashInfer's functions."
    ),
]
DeviceOpt = Annotated[str, device_option("Where to re-derive: auto, cpu, cuda or cuda:N.")]
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="SERVER",
        help="Prove the installed release of this server (vllm or sglang) on the output's "
        "layer shapes, with the server's own MoE processing, as its plugin does for a release "
        "the output does not list; prints a table.",
    ),
]
RankOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--rank",
        metavar="N",
        help="With --server: prove this TP rank (repeatable; default: every rank).",
    ),
]
NoCacheOpt = Annotated[
    bool,
    typer.Option(
        "--no-cache", help="With --server: prove again, whatever the cache of passed proofs holds."
    ),
]


def verify_cmd(
    out_dir: OutArg,
    source: SourceOpt = None,
    revision: RevisionOpt = None,
    full: FullOpt = False,
    against_flashinfer: FlashInferOpt = False,
    device: DeviceOpt = "auto",
    server: ServerOpt = None,
    rank: RankOpt = None,
    no_cache: NoCacheOpt = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Check OUT_DIR against its manifest; with --source, its bytes against the source.

    Files against their SHA-256s, the index against the shards, the manifest's shapes and
    dtypes; --source re-derives a sample of experts (--full: all), with fi-convert's code or
    (--against-flashinfer) FlashInfer's. --server proves the installed server release instead.
    """
    if server is not None:
        if server not in ("vllm", "sglang"):
            raise typer.BadParameter(f"--server {server!r}: vllm or sglang")
        if source is not None:
            raise typer.BadParameter("--server proves a release; --source goes without it")
        _prove(out_dir, server, rank or None, not no_cache, Output(as_json=as_json), debug)
        return
    if rank or no_cache:
        raise typer.BadParameter(f"{'--rank' if rank else '--no-cache'} goes with --server")
    from ..hub import is_repo_id
    from ..hub.remote_verify import verify_remote
    from ..verify import verify

    if (full or against_flashinfer) and source is None:
        flag = "--full" if full else "--against-flashinfer"
        raise typer.BadParameter(
            f"{flag} needs --source MODEL_DIR (the source to re-derive the experts from)"
        )
    with handled(debug):
        remote = not exists(out_dir, ManifestError, OUTPUT_FIX) and is_repo_id(str(out_dir))
    if revision is not None and not remote:
        raise typer.BadParameter("--revision goes with a Hub repo-id OUT_DIR")
    read: dict = {}
    watch = Stopwatch()
    with handled(debug, stopped=f"verify of {escape(str(out_dir))} stopped; nothing was changed"):
        if remote:  # in this thread: its temporary folder is removed
            rep, read = verify_remote(
                str(out_dir),
                revision=revision,
                source=source,
                full=full,
                against_flashinfer=against_flashinfer,
                device=device,
            )
        else:
            rep = verify(
                out_dir,
                source=source,
                full=full,
                against_flashinfer=against_flashinfer,
                device=device,
            )
    # the bytes checked: every file's (hashed), or for a repo id what was read from the Hub
    checked = sum(r.get("bytes", 0) for r in read.values()) if remote else output_bytes(out_dir)
    _render(Output(as_json=as_json), rep, watch.figures(checked), read if remote else None)
    if not rep.ok:
        raise typer.Exit(1)


def _render(o: Output, rep: Report, figures: dict, hub_reads: dict | None) -> None:
    """The report: with --json all of it; else each problem on stderr and `ok` on stdout."""
    if o.as_json:
        extra = {} if hub_reads is None else {"hub_reads": hub_reads}
        o.json({**rep.as_dict(), **figures, **extra})
        return
    for p in rep.problems + rep.unlisted:
        o.problem("mismatch", escape(p))
    if rep.ok:
        what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in rep.checked.items())
        how = "checked" if hub_reads is None else "read from the Hub"
        o.result(f"[green]ok[/green]: {escape(what)}; {figures_text(figures, how)}")


def _prove(
    out_dir: Path, server: str, ranks: list[int] | None, cache: bool, o: Output, debug: bool
) -> None:
    """`verify --server`: the load-time proof of the installed release, as a table."""
    from ..servers.proving import SERVERS, prove_output

    with handled(debug, stopped=f"proof on {escape(str(out_dir))} stopped; nothing was changed"):
        proof = prove_output(out_dir, server, ranks=ranks, cache=cache)
    if o.as_json:
        o.json(proof.as_dict())
    else:
        rows = [
            (r.shape, str(r.layers), str(r.rank), str(r.tensors), r.result, f"{r.seconds:.2f}")
            for r in proof.rows
        ]
        o.table(("shape", "layers", "rank", "tensors", "result", "seconds"), rows)
    label = SERVERS[server][1]
    bad = proof.first_failure()
    if bad is None:
        if not o.as_json:
            o.result(
                f"[green]ok[/green]: {label} {proof.release}'s own MoE processing gives the "
                f"output's bytes on {len(proof.rows)} shape x rank proofs ({proof.device}, "
                f"{proof.seconds:.1f} s)"
            )
        return
    what = f"{bad.tensor} differs, {bad.where}" if bad.result == "differs" else bad.where
    o.problem(
        "mismatch" if bad.result == "differs" else "error",
        escape(f"{label} {proof.release} on {bad.shape} (rank {bad.rank}): {what}"),
    )
    raise typer.Exit(1)
