"""Plan a conversion before any long work: layers, output tensors, shards, sizes.

Everything that can be wrong with the input or the options is found here, so a run either
fails in seconds or has every shape and byte count settled before it starts writing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from . import jsontext, schemes
from .errors import FiConvertError, OutputError, SchemeMismatchError, SourceError
from .families import Family, FamilyFileError, config_field, load_file, served_architectures
from .format import config_marker
from .format.names import CONFIG_NAME, INDEX_NAME, MANIFEST_NAME
from .mistral_format import INDEX_NAME as MISTRAL_INDEX_NAME
from .names import DEFAULT_MAX_MEMORY, DEFAULT_SHARD_BYTES
from .paths import model_error, out_exists
from .schemes import Backend, LayerPlan, OutputTensor, SchemeName
from .server_lookup import names as server_names
from .server_lookup import resolve
from .source import (
    PICKLE_SUFFIXES,
    Checkpoint,
    check_real_path,
    check_regular,
    find_family,
    not_a_file,
    open_checkpoint,
)
from .st_io import OutEntry, TensorInfo
from .target import DEFAULT, Layout, Refusal, ServerTarget, release_fields
from .version import __version__


@dataclass(frozen=True)
class Options:
    scheme: SchemeName = SchemeName.AUTO
    backend: Backend = Backend.TRTLLM
    tp_size: int = 1
    max_shard_bytes: int = DEFAULT_SHARD_BYTES  # 0: the source's largest shard
    max_memory: int = DEFAULT_MAX_MEMORY
    # plan an output that its server cannot serve (`ServerTarget.unservable`); refused otherwise
    allow_unservable: bool = False
    # the server the output is for (`fi_convert.servers`), or several, comma-separated, where
    # their bytes are the same ("vllm,sglang"): the first is the manifest's `server`
    server: str = DEFAULT
    # a family file of the user's own (`--family FILE.json`), or the family itself (the one a
    # manifest records, for `verify --source`), tried before fi-convert's
    family: str | Family | None = None

    def __post_init__(self) -> None:  # accept plain strings from library callers
        object.__setattr__(self, "scheme", SchemeName(self.scheme))
        object.__setattr__(self, "backend", Backend(self.backend))
        names = [n.strip() for n in str(self.server).split(",")]
        object.__setattr__(self, "server", ",".join(dict.fromkeys(names)))

    @property
    def server_names(self) -> tuple[str, ...]:
        return tuple(self.server.split(","))

    @property
    def target(self) -> ServerTarget:
        """The facts of the server the output is for (the first, of several)."""
        return resolve(self.server_names[0])

    @property
    def targets(self) -> list[ServerTarget]:
        """The facts of every server the output is for."""
        return [resolve(n) for n in self.server_names]


@dataclass
class Item:
    """One tensor of an output shard: copied from the source, or produced by a scheme."""

    entry: OutEntry
    source: TensorInfo | None = None
    layer: LayerPlan | None = None
    output: OutputTensor | None = None


@dataclass
class ShardPlan:
    name: str
    items: list[Item]
    copy_of: Path | None = None  # a source shard without experts: carried over byte for byte

    @property
    def nbytes(self) -> int:
        return sum(i.entry.nbytes for i in self.items)


@dataclass
class Plan:
    ckpt: Checkpoint
    family: Family
    scheme: SchemeName
    detected: bool
    options: Options
    layers: list[LayerPlan]
    shards: list[ShardPlan]
    side_files: list[str]
    passthrough_count: int = 0
    notes: list[str] = field(default_factory=list)
    # where the source came from, for the manifest's `source` (a Hub repo id and its commit,
    # the command); set by the caller, not part of what the plan produces
    provenance: dict = field(default_factory=dict)

    @property
    def target(self) -> ServerTarget:
        return self.options.target

    @property
    def serving(self) -> tuple[str, str, int]:
        """(scheme, backend, tp size): what a server's facts take to say how to serve it."""
        return self.scheme.value, self.options.backend.value, self.options.tp_size

    @property
    def marker_note(self) -> str:
        """config.json's note: how each server the output is for serves it."""
        return " | ".join(t.marker_note(*self.serving) for t in self.options.targets)

    def marked(self, rel: str) -> bytes | None:
        """The output's bytes of side file `rel` where they are not the source's: its config
        (config.json, or a Mistral-format source's params.json), marked so that no server
        loads the output as the source; None for the others (copied as they are)."""
        if rel != self.ckpt.config_name:
            return None
        if rel == CONFIG_NAME:
            return config_marker.mark(self.ckpt.config, self.marker_note)
        params = jsontext.loads((self.ckpt.root / rel).read_text())
        return config_marker.mark_params(params, self.marker_note)

    @property
    def bytes_to_write(self) -> int:
        return sum(s.nbytes for s in self.shards)

    @property
    def bytes_to_read(self) -> int:
        return sum(p.stat().st_size for p in self.ckpt.shards)

    def key(self) -> str:
        """Identifies what this plan produces: same key, same output bytes."""
        d = {
            "fi_convert": __version__,
            "source": self.ckpt.fingerprint,
            "scheme": self.scheme.value,
            "backend": self.options.backend.value,
            "tp": self.options.tp_size,
            **({"server": self.options.server} if self.options.server != DEFAULT else {}),
            "shards": [[s.name, [i.entry.name for i in s.items]] for s in self.shards],
        }
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def moe(self) -> dict:
        """The family's routing method and activation for this checkpoint, and the kernel
        the server runs them on with the plan's scheme and backend."""
        routing = self.family.moe.routing(self.ckpt.config)
        kernel = self.target.moe_kernel(self.scheme.value, self.options.backend.value, routing)
        act = self.family.moe.activation_of(self.ckpt.config)
        return {"routing": routing, "activation": act, "kernel": kernel}

    def summary(self) -> dict:
        return {
            "source": str(self.ckpt.root),
            "model_type": self.ckpt.model_type,
            "family": self.family.name,
            **self.moe(),
            "scheme": self.scheme.value,
            "scheme_detected": self.detected,
            "backend": self.options.backend.value,
            "tp_size": self.options.tp_size,
            "server": self.options.server,
            "servers": list(self.options.server_names),
            "moe_layers": len(self.layers),
            "num_experts": self.layers[0].info["num_experts"],
            "layers": {lp.prefix: _layer_summary(lp) for lp in self.layers},
            "passthrough_tensors": self.passthrough_count,
            "side_files": self.side_files,
            "output_shards": len(self.shards),
            "bytes_to_read": self.bytes_to_read,
            "bytes_to_write": self.bytes_to_write,
            "warnings": self.notes,
        }


def _layer_summary(lp: LayerPlan) -> dict:
    return {
        **lp.info,
        "tensors": {
            o.name: {"dtype": o.dtype, "shape_per_rank": list(o.rank_shape), **o.layout}
            for o in lp.outputs
        },
    }


def quant_method(ckpt: Checkpoint) -> str | None:
    """The source's quantization method (`quantization_config.quant_method`; a ModelOpt
    `hf_quant_config.json` says "modelopt"), or None for an unquantized one."""
    qc = ckpt.quant_config
    if not isinstance(qc, dict):
        return None
    method = qc.get("quant_method")
    if method is None and isinstance(qc.get("producer"), dict):
        method = qc["producer"].get("name")
    return str(method) if method is not None else None


def _refuse_an_output(root: Path, config: dict) -> None:
    """An fi-convert output is no source: its experts are already in kernel layouts."""
    qc = config.get("quantization_config")
    if (root / MANIFEST_NAME).is_file() or config_marker.is_marked(qc):
        what = ""
        try:
            m = jsontext.loads((root / MANIFEST_NAME).read_text())
            what = f" (scheme {m['scheme']}, backend {m['backend']}, tp {m['tp_size']})"
        except (OSError, ValueError, KeyError, TypeError):
            pass
        raise SourceError(
            f"{root}: already an fi-convert output{what}: nothing to convert; serve it, or "
            "convert the original"
        )


def make_plan(source: str | Path, options: Options) -> Plan:
    if options.tp_size < 1:
        raise SourceError(f"--tp-size must be at least 1, got {options.tp_size}")
    try:
        # a tensor made without a device (a layout's index, made here) is a host tensor,
        # whatever default device the caller set in this thread (`torch.set_default_device`,
        # a `with torch.device(...)` block around a server's load); the conversion's workers
        # are threads of their own, which it does not reach
        with torch.device("cpu"):
            return _make_plan(source, options)
    except OSError as e:  # a model folder (or a file in it) this user may not read
        raise model_error(e, source) from None


def _make_plan(source: str | Path, options: Options) -> Plan:
    target = options.targets[0]  # an unknown server fails before any reading
    ckpt = open_checkpoint(source)
    _refuse_an_output(ckpt.root, ckpt.config)
    family, layers = find_family(ckpt, user_families(options))
    assert family is not None  # find_family refuses a model of no family
    detected = options.scheme is SchemeName.AUTO
    name = schemes.detect(ckpt, layers) if detected else options.scheme
    scheme = schemes.get(name)
    if options.backend not in scheme.backends:
        why = target.no_path(name.value, options.backend.value)
        raise SchemeMismatchError(
            f"--scheme {name.value} --backend {options.backend.value}: {why}; "
            f"use --backend {scheme.backends[0].value}"
        )
    refused = (
        target.refuses(name.value, options.backend.value)
        or target.refuses_source(
            name.value, options.backend.value, quant_method(ckpt), ckpt.architectures, ckpt.config
        )
        or refuses_moe(target, name, options.backend, layers)
    )
    if refused:
        raise SchemeMismatchError(_refused_line(ckpt, layers, name, options, refused))
    layout = layout_of(target, scheme, options.backend)
    lps = []
    for layer in layers:
        scheme.check(ckpt, layer)
        lp = scheme.plan_layer(layer, options.backend, options.tp_size, layout=layout)
        for key in family.manifest_keys:
            lp.info[key] = config_field(ckpt.config, key)
        lps.append(lp)
    expert_names = {n for lp in lps for n in lp.source_names}
    items = _items(ckpt, lps, expert_names, options.tp_size)
    with_experts = {ckpt.tensors[n].file for n in expert_names}
    # sharded like the source (a few GB a file in released checkpoints), so that shards can be
    # written and hashed in parallel, and loaded so
    limit = options.max_shard_bytes or max(p.stat().st_size for p in ckpt.shards)
    shards = _pack_evenly(items, limit, set(ckpt.shards) - with_experts)
    side, skipped = _side_files(ckpt.root)
    plan = Plan(ckpt, family, name, detected, options, lps, shards, side)
    plan.passthrough_count = len(ckpt.tensors) - len(expert_names)
    plan.notes = skipped + grouped_notes(lps)
    refusal = target.unservable(
        name.value, options.backend.value, [lp.info for lp in lps], quant_method(ckpt)
    )
    if refusal and not options.allow_unservable:
        raise SchemeMismatchError(_unservable_line(ckpt, layers, name, options, refusal))
    for other in options.server_names[1:]:
        _same_for(ckpt, layers, name, options, lps, other)
    return plan


def user_families(options: Options) -> tuple[Family, ...]:
    """The family file of `--family` (checked), or none."""
    if not options.family:
        return ()
    if isinstance(options.family, Family):
        return (options.family,)
    try:
        return (load_file(options.family),)
    except FamilyFileError as e:
        raise SourceError(str(e)) from None


def refuses_moe(
    target: ServerTarget, name: SchemeName, backend: Backend, layers: list
) -> str | None:
    """Why the server would not run the scheme on the backend for the family's routing and
    activation (`ServerTarget.refuses_moe`) and any layer's SwiGLU clamp, or None."""
    first = layers[0]
    clamp = next((x.swiglu_limit for x in layers if x.swiglu_limit is not None), None)
    why = target.refuses_moe(name.value, backend.value, first.routing, first.activation, clamp)
    if why is None and not first.gated and not schemes.get(name).non_gated:
        why = (
            f"fi-convert writes no {name.value} layout of non-gated ({first.activation}) "
            f"experts yet; convert with --scheme {' or '.join(non_gated_schemes())}"
        )
    return why


def non_gated_schemes() -> list[str]:
    """The schemes that write a layout of non-gated experts (`Scheme.non_gated`)."""
    return [n.value for n, s in schemes.REGISTRY.items() if s.non_gated]


def _same_for(
    ckpt: Checkpoint,
    layers: list,
    name: SchemeName,
    options: Options,
    lps: list[LayerPlan],
    other: str,
) -> None:
    """One output for several servers (`--server vllm,sglang`) only where each one's plan
    gives the first one's bytes: refused otherwise, naming the first tensor that differs."""
    first = options.server_names[0]
    head = f"--scheme {name.value} --backend {options.backend.value} --server {options.server}"
    why, unservable, theirs = _plan_layers(
        ckpt, layers, name, options.backend, replace(options, server=other)
    )
    if why is not None and not (unservable and options.allow_unservable):
        raise SchemeMismatchError(f"{head}: not for {other}: {why}; convert for {first} alone")
    diff = first_difference(lps, theirs, (first, other))
    if diff:
        raise SchemeMismatchError(
            f"{head}: {first} and {other} hold other bytes of this checkpoint (first {diff}); "
            f"convert once for each (--server {first}, --server {other})"
        )


# ---------------------------------------------------------------- what else a checkpoint takes


@dataclass(frozen=True)
class Choice:
    """One scheme x backend for a checkpoint: whether it plans and its server serves the
    output (`why_not` None), and what it does to the source's precision."""

    scheme: SchemeName
    backend: Backend
    why_not: str | None
    precision: str | None  # None where it does not plan
    unservable: bool = False  # it plans, but its server cannot serve it (--allow-unservable)

    def summary(self) -> dict:
        return {
            "scheme": self.scheme.value,
            "backend": self.backend.value,
            "ok": self.why_not is None,
            "why_not": self.why_not,
            "unservable": self.unservable,
            "precision": self.precision,
        }


def source_scheme(ckpt: Checkpoint, layers: list) -> SchemeName | None:
    """The scheme whose source format the checkpoint holds (None: no scheme reads it)."""
    try:
        return schemes.detect(ckpt, layers)
    except FiConvertError:
        return None


def _why_not(ckpt: Checkpoint, layers: list, name: SchemeName, backend: Backend, options: Options):
    """(why this scheme x backend cannot take the checkpoint or None, whether the reason is
    only that its server cannot serve the output)."""
    why, unservable, _ = _plan_layers(ckpt, layers, name, backend, options)
    return why, unservable


def _plan_layers(
    ckpt: Checkpoint, layers: list, name: SchemeName, backend: Backend, options: Options
) -> tuple[str | None, bool, list[LayerPlan]]:
    """`_why_not`, and the layers' plans (empty where it does not plan)."""
    scheme, target = schemes.get(name), options.target
    if backend not in scheme.backends:
        return target.no_path(name.value, backend.value), False, []
    refused = (
        target.refuses(name.value, backend.value)
        or target.refuses_source(
            name.value, backend.value, quant_method(ckpt), ckpt.architectures, ckpt.config
        )
        or refuses_moe(target, name, backend, layers)
    )
    if refused:
        return refused, False, []
    try:
        layout = layout_of(target, scheme, backend)
        lps = []
        for layer in layers:
            scheme.check(ckpt, layer)
            lps.append(scheme.plan_layer(layer, backend, options.tp_size, layout=layout))
    except FiConvertError as e:
        return str(e), False, []
    refusal = target.unservable(
        name.value, backend.value, [lp.info for lp in lps], quant_method(ckpt)
    )
    return (refusal.why, True, lps) if refusal else (None, False, lps)


# What a field of a layer entry (or of a tensor's) that differs between servers changes
WHY = {
    "tp_split": "the rows of I each TP rank holds",
    "layout": "the element order",
    "row_order": "the order of the gate and up rows",
    "formula": "how the value is made (docs/FORMAT.md)",
}
FIRST = ("dtype", "layout")  # a tensor's fields said first where they differ


def first_difference(a: list[LayerPlan], b: list[LayerPlan], names: tuple[str, str]) -> str | None:
    """Where two plans of one checkpoint (the same scheme, backend and TP size, for the two
    servers `names`) give other bytes: the first tensor whose entry (dtype, shape, layout)
    differs, or whose layer's entry does (`tp_split`), and how; None when every layer entry
    is the same, which fixes every byte (docs/FORMAT.md)."""

    def line(where: str, key: str, x: object, y: object) -> str:
        why = f" ({WHY[key]})" if key in WHY else ""
        x, y = ("absent" if v is None else json.dumps(v) for v in (x, y))
        return f"{where}: {key}{why} is {x} for {names[0]}, {y} for {names[1]}"

    for p, q in zip(a, b, strict=True):
        sp, sq = _layer_summary(p), _layer_summary(q)
        for name in sp["tensors"]:
            tp, tq = sp["tensors"][name], sq["tensors"].get(name, {})
            for key in sorted(set(tp) | set(tq), key=lambda k: (k not in FIRST, k)):
                if tp.get(key) != tq.get(key):
                    return line(f"{p.prefix}.{name}", key, tp.get(key), tq.get(key))
        for key in sorted((set(sp) | set(sq)) - {"tensors"}):
            if sp.get(key) != sq.get(key):
                first = f"{p.prefix}.{next(iter(sp['tensors']))}"
                return line(first, key, sp.get(key), sq.get(key))
    return None


def _choices(ckpt: Checkpoint, layers: list, options: Options) -> list[Choice]:
    """Every registered scheme x backend for the checkpoint, for the options' TP size and
    server."""
    src = source_scheme(ckpt, layers)
    source = schemes.get(src) if src else None
    out = []
    for name, scheme in schemes.REGISTRY.items():
        for backend in Backend:
            why, unserv = _why_not(ckpt, layers, name, backend, options)
            planned = why is None or unserv
            precision = scheme.precision(source) if planned else None
            out.append(Choice(name, backend, why, precision, unserv))
    return out


def choices(plan: Plan) -> list[Choice]:
    """Every registered scheme x backend for the plan's checkpoint at its TP size: which
    plan and serve, why the others cannot, and which quantize."""
    _, layers = find_family(plan.ckpt, user_families(plan.options))
    return _choices(plan.ckpt, layers, plan.options)


@dataclass(frozen=True)
class ServerChoice:
    """What one server (`--server`) would get of a plan's scheme, backend and TP size: why
    fi-convert writes no output of it for that server (None: it writes one), how its layout
    compares with the plan's server's, its serve line, and the server releases proven to
    hold the bytes (the manifest target's fields that say so, `target.release_fields`)."""

    server: str
    why_not: str | None
    layout_note: str
    serve: str
    releases: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {
            "server": self.server,
            "ok": self.why_not is None,
            "why_not": self.why_not,
            "layout": self.layout_note,
            "serve": self.serve,
            "releases": self.releases,
        }


def servers(plan: Plan) -> list[ServerChoice]:
    """Each registered server's `ServerChoice` for the plan's scheme, backend and TP size."""
    _, layers = find_family(plan.ckpt, user_families(plan.options))
    own = plan.options.server_names[0]
    out = []
    for name in server_names():
        opts = replace(plan.options, server=name)
        why, _, lps = _plan_layers(plan.ckpt, layers, plan.scheme, plan.options.backend, opts)
        note = ""
        if why is None and name in plan.options.server_names:
            note = "this plan"
        elif why is None:
            diff = first_difference(plan.layers, lps, (own, name))
            note = f"other bytes, first {diff}" if diff else f"the same bytes as for {own}"
            if not diff:
                note += f" (one output serves both: --server {own},{name})"
        serve = opts.target.serve_command("OUT", *plan.serving)
        rel = {}
        if why is None:
            infos = {lp.prefix: lp.info for lp in lps}
            rel = release_fields(
                opts.target,
                plan.scheme.value,
                plan.options.backend.value,
                infos,
                served_architectures(plan.ckpt.config),
            )
        out.append(ServerChoice(name, why, note, serve, rel))
    return out


def servable_list(cs: list[Choice]) -> str:
    """'bf16 (trtllm, cutlass), mxfp8 (trtllm)': the schemes that plan and serve."""
    by: dict[SchemeName, list[str]] = {}
    for c in cs:
        if c.why_not is None:
            by.setdefault(c.scheme, []).append(c.backend.value)
    return ", ".join(f"{s.value} ({', '.join(b)})" for s, b in by.items())


def _unservable_line(
    ckpt: Checkpoint, layers: list, name: SchemeName, options: Options, refusal: Refusal
) -> str:
    ok = servable_list(_choices(ckpt, layers, options))
    alts = f"--scheme {ok}, or {refusal.instead}" if ok else refusal.instead
    return (
        f"--scheme {name.value} --backend {options.backend.value}: {refusal.why}; "
        f"servable instead: {alts}; --allow-unservable converts it anyway"
    )


def layout_of(target: ServerTarget, scheme: schemes.Scheme, backend: Backend) -> Layout:
    """The layout variant the server needs for the scheme on the backend, which the scheme
    must implement (`Scheme.variants`)."""
    layout = target.layout(scheme.name.value, backend.value)
    missing = sorted(layout.variants() - scheme.variants)
    if missing:
        raise SchemeMismatchError(
            f"--scheme {scheme.name.value} --backend {backend.value} --server {target.name}: "
            f"the scheme does not implement the server's layout ({', '.join(missing)}); use "
            "--server vllm"
        )
    return layout


def _refused_line(
    ckpt: Checkpoint, layers: list, name: SchemeName, options: Options, why: str
) -> str:
    ok = servable_list(_choices(ckpt, layers, options))
    alts = f"; servable for {options.server} instead: --scheme {ok}" if ok else ""
    said = "--server vllm" in why  # (a server's reason that names the fix already)
    has = _vllm_has(ckpt, options, layers)
    vllm = "; or convert for vLLM (--server vllm)" if has and not said else ""
    return (
        f"--scheme {name.value} --backend {options.backend.value} --server {options.server}: "
        f"{why}{alts}{vllm}"
    )


def _vllm_has(ckpt: Checkpoint, options: Options, layers: list) -> bool:
    """Whether converting for vLLM is worth naming: another server was asked for, and vLLM's
    facts do not refuse the source's architecture whatever the scheme (BF16 on CUTLASS, which
    any routing takes: refused only where vLLM has no model class for it, SDAR MoE's) nor its
    experts' activation on it (situ experts, which vLLM runs on no output fi-convert writes)."""
    if options.server == DEFAULT:
        return False
    vllm = resolve(DEFAULT)
    first = layers[0]
    return (
        vllm.refuses_source("bf16", "cutlass", None, ckpt.architectures) is None
        and vllm.refuses_moe("bf16", "cutlass", first.routing, first.activation, None) is None
    )


def grouped_notes(lps: list[LayerPlan]) -> list[str]:
    """The layers' warnings, each said once: a note that starts with its layer's prefix is
    said once for all the layers it applies to, with their number (`58 layers (first to
    last): ...`)."""
    layers: dict[str, list[str]] = {}
    for lp in lps:
        for note in lp.notes:
            text = note.removeprefix(f"{lp.prefix}: ")
            layers.setdefault(text, [])
            if text != note and lp.prefix not in layers[text]:
                layers[text].append(lp.prefix)
    out = []
    for text, who in layers.items():
        if len(who) > 1:
            out.append(f"{len(who)} layers ({who[0]} to {who[-1]}): {text}")
        else:
            out.append(f"{who[0]}: {text}" if who else text)
    return out


def _items(ckpt: Checkpoint, lps: list[LayerPlan], expert_names: set[str], tp: int) -> list[Item]:
    """Output tensors in source order; a layer's outputs stand where its first expert stood."""
    shard_no = {p: k for k, p in enumerate(ckpt.shards)}

    def order(name: str) -> tuple[int, int]:
        info = ckpt.tensors[name]
        return (shard_no[info.file], info.start)

    first = {min(lp.source_names, key=order): lp for lp in lps}
    items: list[Item] = []
    for name in sorted(ckpt.tensors, key=order):
        info = ckpt.tensors[name]
        if name not in expert_names:
            items.append(Item(OutEntry(name, info.dtype, info.shape), source=info))
        elif name in first:
            lp = first[name]
            for o in lp.outputs:
                entry = OutEntry(f"{lp.prefix}.{o.name}", o.dtype, (tp, *o.rank_shape))
                # (a source tensor of the layer's own may have the output's name, which takes
                # its place: Inkling's experts are published as mlp.experts.w13_weight)
                if entry.name in ckpt.tensors and entry.name not in lp.source_names:
                    raise SourceError(f"{ckpt.root}: already holds {entry.name}; is it converted?")
                items.append(Item(entry, layer=lp, output=o))
    return items


def _pack_evenly(items: list[Item], limit: int, expert_free: set[Path]) -> list[ShardPlan]:
    """`_pack` with the smallest limit (at most `limit`) that gives no more shards than
    `limit` does: as many shards, of more even sizes, so that parallel shard jobs (each
    hashing its file from start to end) finish at about the same time."""
    n = len(_pack(items, limit, expert_free))
    lo, hi = 1, limit  # the shard count only grows as the limit shrinks
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_pack(items, mid, expert_free)) <= n:
            hi = mid
        else:
            lo = mid + 1
    return _pack(items, lo, expert_free)


def _pack(items: list[Item], limit: int, expert_free: set[Path]) -> list[ShardPlan]:
    """Whole tensors into shards of at most `limit` bytes, in source order; a source shard
    that holds no expert tensor becomes an output shard of its own, copied as it is."""
    groups: list[tuple[list[Item], Path | None]] = []
    size = 0
    for it in items:
        src = it.source.file if it.source is not None else None
        if src in expert_free:
            if not groups or groups[-1][1] != src:
                groups.append(([], src))
        elif not groups or groups[-1][1] is not None or size + it.entry.nbytes > limit:
            if not groups or groups[-1][0] or groups[-1][1] is not None:
                groups.append(([], None))
            size = 0
        groups[-1][0].append(it)
        size += it.entry.nbytes
    n = len(groups)
    return [
        ShardPlan(f"model-{k + 1:05d}-of-{n:05d}.safetensors", g, copy_of)
        for k, (g, copy_of) in enumerate(groups)
    ]


def _side_files(root: Path) -> tuple[list[str], list[str]]:
    """Files carried over unchanged: everything but weights, the index and hidden entries;
    and a warning for each entry of a subfolder that is no file to carry (a link loop, a
    link to nothing or to a folder, a FIFO), which is left out."""
    out, skipped = [], []
    for p in _entries(root):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or (p.is_dir() and not p.is_symlink()):
            continue
        if p.suffix in (".safetensors", *PICKLE_SUFFIXES) or rel.name in (
            INDEX_NAME,
            MISTRAL_INDEX_NAME,  # Mistral's format's index, of shards the output has not
            MANIFEST_NAME,
        ):
            continue
        what = not_a_file(p, root)
        if what and len(rel.parts) > 1:
            skipped.append(f"{p}: {what}, not a file; left out of the output")
            continue
        # copied into the output (and pushed to the Hub): never a FIFO or device (a read would
        # block or never end), never a link out of the folder (a local secret); beside
        # config.json, where servers look for files by name, such an entry stops the run
        check_regular(p, root)
        check_real_path(root, p)
        out.append(rel.as_posix())
    return out, skipped


def _entries(root: Path) -> list[Path]:
    """Every entry under `root` but in hidden folders, sorted; links to folders are entries,
    not followed. A folder this user may not list is an error (`rglob` leaves it out, and the
    output would lack its files without a word)."""

    def refuse(e: OSError) -> None:
        raise model_error(e, root)

    found = []
    for top, dirs, files in os.walk(root, onerror=refuse):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(top) / name for name in (*dirs, *files)]
    return sorted(found)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except OSError:
        return False


def _overlap(src: Path, out: Path) -> bool:
    """Whether `out` is `src`, inside it, or holds it: by path, and by filesystem identity
    (device and inode), which also sees a bind mount of one at the other."""
    if out == src or src in out.parents or out in src.parents:
        return True
    outs = [q for q in (out, *out.parents) if out_exists(q)]
    return any(_same_file(q, src) for q in outs) or any(_same_file(q, out) for q in src.parents)


def check_out_dir(plan: Plan, out_dir: Path) -> None:
    src, out = plan.ckpt.root.resolve(), out_dir.resolve()
    if _overlap(src, out):
        raise OutputError(
            f"{out_dir}: the output folder must not be the source folder, inside it, or hold it; "
            "choose another out-dir"
        )
