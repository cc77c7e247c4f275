"""`fi-convert inspect MODEL_DIR`: the conversion plan (nothing written), and the schemes and
backends the checkpoint takes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ..names import Backend, SchemeName
from ._errors import handled
from ._options import (
    BackendOpt,
    DebugOpt,
    FamilyOpt,
    JsonOpt,
    SchemeOpt,
    ServerOpt,
    TpOpt,
    UnservableOpt,
)
from ._output import Output
from ._progress import size

if TYPE_CHECKING:
    from ..plan import Choice, Plan, ServerChoice


def inspect_cmd(
    model_dir: Annotated[str, typer.Argument(help="Source model folder.")],
    scheme: SchemeOpt = SchemeName.AUTO,
    backend: BackendOpt = Backend.TRTLLM,
    tp_size: TpOpt = 1,
    server: ServerOpt = "vllm",
    allow_unservable: UnservableOpt = False,
    family: FamilyOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Print MODEL_DIR's conversion plan (writes nothing) and the other schemes it takes.

    Of the other schemes and backends, it lists those that plan, says why the rest do not,
    and which of them quantize; and what each server (--server) would get.
    """
    from ..plan import Options, choices, make_plan, servers

    o = Output(as_json=as_json)
    with handled(debug):
        opts = Options(
            scheme,
            backend,
            tp_size,
            allow_unservable=allow_unservable,
            server=server,
            family=family,
        )
        plan = make_plan(model_dir, opts)
        cs = choices(plan)
        ss = servers(plan)
    for note in plan.notes:
        o.warning(note)
    here = next(c.precision or "" for c in cs if c.scheme is plan.scheme)
    if as_json:
        o.json(
            plan.summary()
            | {
                "precision": here,
                "choices": [c.summary() for c in cs],
                "servers": [x.summary() for x in ss],
            }
        )
        return
    render_plan(o, plan)
    o.result(f"precision: {escape(here)}")
    _render_choices(o, plan, cs)
    _render_servers(o, plan, ss)


def render_plan(o: Output, plan: Plan) -> None:
    """A plan as `inspect` and `convert --dry-run` print it: the model, each group of like
    MoE layers with a table of its tensors, and what else is read and written."""
    from ..format.manifest import layer_groups

    s = plan.summary()
    how = "detected" if plan.detected else "requested"
    o.result(
        f"[bold]{escape(str(plan.ckpt.root))}[/bold]: family {s['family']} "
        f"(model_type {s['model_type']}; routing {s['routing']}, activation {s['activation']}: "
        f"{s['kernel']}), "
        f"scheme [bold]{s['scheme']}[/bold] ({how}), backend {s['backend']}, tp {s['tp_size']}, "
        f"server {s['server']}"
    )
    for names, count, lay in layer_groups(s["layers"]):
        o.result(
            f"{count} MoE layer(s) {names}: {lay['num_experts']} experts, "
            f"H {lay['hidden_size']} (padded {lay['padded_hidden_size']}), "
            f"I {lay['intermediate_size']} = {lay['intermediate_size_per_rank']} per rank "
            f"(padded {lay['padded_intermediate_size_per_rank']})"
        )
        o.table(
            ("tensor", "dtype", "shape per rank", "layout"),
            (
                (name, ten["dtype"], str(ten["shape_per_rank"]), ten["layout"] + _tile(ten))
                for name, ten in lay["tensors"].items()
            ),
        )
    o.result(
        f"{s['passthrough_tensors']} other tensors copied unchanged; {len(s['side_files'])} "
        f"other files carried over; {s['output_shards']} output shard(s); read "
        f"{size(s['bytes_to_read'])}, write {size(s['bytes_to_write'])}"
    )


def _tile(tensor: dict) -> str:
    return f", tile {tensor['epilogue_tile_m']}" if tensor.get("epilogue_tile_m") else ""


def _render_choices(o: Output, plan: Plan, cs: list[Choice]) -> None:
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
    o.result(f"this checkpoint takes (--scheme, --backend; tp {plan.options.tp_size}):")
    for name, backends in takes.items():
        o.result(f"  {name} ({', '.join(backends)}): {escape(precision[name])}")
    if cannot:
        o.result("and cannot take:")
    for (name, why), backends in cannot.items():
        o.result(f"  {name} ({', '.join(backends)}): {escape(why)}")


def _render_servers(o: Output, plan: Plan, ss: list[ServerChoice]) -> None:
    """For each server (--server): what it would get of this scheme, backend and TP size."""
    o.result(
        f"servers (--server; {plan.scheme.value}, {plan.options.backend.value}, tp "
        f"{plan.options.tp_size}):"
    )
    for x in ss:
        if x.why_not is not None:
            o.result(f"  {x.server}: cannot: {escape(x.why_not)}")
        else:
            o.result(f"  {x.server}: {escape(x.layout_note)}; serve with `{escape(x.serve)}`")
            for key, value in x.releases.items():
                shown = ", ".join(value) if isinstance(value, list) else str(value)
                o.result(f"    {key}: {escape(shown or 'none')}")
