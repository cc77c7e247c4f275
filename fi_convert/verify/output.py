"""`fi-convert verify`: prove an output folder is what its manifest says, that the manifest
says what fi-convert writes for its scheme, and optionally that its bytes are what the source
gives (re-derived with our code, or with FlashInfer's)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import dtypes, jsontext, mistral_format
from .. import manifest as mf
from ..errors import FiConvertError
from ..families import Family, config_field, model_type, recorded, served_architectures
from ..families import gated as gated_activation
from ..format import config_marker
from ..format import manifest as fm
from ..format.hashes import sha256_file
from ..format.names import (
    CONFIG_NAME,
    DEFAULT_SERVER,
    INDEX_NAME,
    MANIFEST_NAME,
    STATE_DIR,
    server_of,
    servers_of,
)
from ..names import Backend, SchemeName
from ..pipeline import resolve_device
from ..plan import Options, _layer_summary, first_difference, make_plan
from ..schemes import REGISTRY
from ..schemes.base import Ctx
from ..server_lookup import resolve
from ..source import open_checkpoint
from ..st_io import SourceFiles, TensorInfo, read_header
from ..target import VLLM_LAYOUT, Layout
from ..version import __version__

# What a Hub download adds beside the files its manifest lists: the repo's .gitattributes,
# and huggingface_hub's metadata of a `--local-dir` download.
HUB_FILES = (".gitattributes",)
HUB_DIRS = (".cache/huggingface",)
# ... and, from a streamed conversion's repo, its progress records in the state folder
PROGRESS_RE = re.compile(r"progress(-\d+-of-\d+)?\.json")
# Sizes a layer entry is re-planned for; past them it is garbled (no model comes close), and
# re-planning it would build index tensors of any size.
MAX_EXPERTS, MAX_SIZE, MAX_MATRIX, MAX_TP = 2**14, 2**20, 2**31, 2**12
SIZES = ("num_experts", "hidden_size", "intermediate_size")
DIFFER = "w13_scale_2_differs_for_experts"  # nvfp4: read from the source's data


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    # files in the folder that the manifest does not list: the folder is not the output the
    # manifest describes, though what it lists is intact (`push` uploads only that)
    unlisted: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unlisted

    def count(self, what: str, n: int = 1) -> None:
        self.checked[what] = self.checked.get(what, 0) + n

    def as_dict(self) -> dict:
        return {"ok": self.ok, "checked": self.checked, "problems": self.problems + self.unlisted}


def verify(
    out_dir: str | Path,
    *,
    source: str | Path | None = None,
    full: bool = False,
    against_flashinfer: bool = False,
    device: str = "auto",
) -> Report:
    """Check files, index and manifest (its fields, each layer against the scheme's own plan)
    and that the folder holds no file the manifest does not list; with `source`, re-derive a
    sample of experts (all with `full`) and compare bytes; `against_flashinfer` re-derives
    them with FlashInfer."""
    root = Path(out_dir)
    m = fm.read(root)
    if against_flashinfer and source is not None:
        refuse_against_flashinfer(root, m)
    rep = Report()
    rep.problems += fm.check_files(root, m)
    rep.count("files", len(m["files"]))
    _check_unlisted(root, m, rep)
    headers = check_index(root, m, rep)
    check_manifest(root, m, headers, rep)
    rep.problems = [p.replace("\n", "\\n") for p in rep.problems]  # one line each
    rep.unlisted = [p.replace("\n", "\\n") for p in rep.unlisted]
    if source is not None and not rep.problems:
        check_source(root, m, headers, Path(source), full, against_flashinfer, device, rep)
    return rep


def _check_unlisted(root: Path, m: dict, rep: Report) -> None:
    """Every file in the folder is one the manifest lists (a loader that globs, or an upload,
    would take an unlisted one for part of the output): all but the manifest itself and what a
    Hub download adds. A run's state folder is named as such: a finished output holds none.
    Unlisted files are named, never read."""
    skip = {*HUB_DIRS, STATE_DIR}
    found: list[str] = []
    state = root / STATE_DIR
    if _run_state(state):
        rep.unlisted.append(
            f"{state}: a conversion's state folder, which a finished output does not hold (a run "
            "was killed after its manifest, or one is writing here); run the conversion's "
            "command again, which removes it (or remove it)"
        )

    def cannot(e: OSError) -> None:
        rep.unlisted.append(f"{e.filename}: cannot list ({e.strerror})")

    for top, dirs, files in os.walk(root, onerror=cannot):
        here = Path(top).relative_to(root)
        walk = []
        for d in sorted(dirs):
            rel = (here / d).as_posix()
            if rel in skip:
                continue
            if os.path.islink(os.path.join(top, d)):  # not followed: named as it is
                found.append(rel)
            else:
                walk.append(d)
        dirs[:] = walk
        found += [(here / f).as_posix() for f in files]
    listed = {*m["files"], MANIFEST_NAME, *HUB_FILES}
    for rel in sorted(found):
        if rel not in listed:
            rep.unlisted.append(
                f"{root / rel}: in the folder, but the manifest does not list it; remove it "
                "(or convert again)"
            )


def _run_state(state: Path) -> bool:
    """Whether `state` is there, holding more than the progress records a streamed conversion
    keeps on its Hub repo (which a download of the repo holds): a local run's lock, journal."""
    if not (state.exists() or state.is_symlink()):
        return False
    try:
        names = [p.name for p in state.iterdir()] if not state.is_symlink() else []
    except OSError:
        return True
    return not names or not all(PROGRESS_RE.fullmatch(n) for n in names)


def check_index(root: Path, m: dict, rep: Report) -> dict[str, TensorInfo]:
    """The index names exactly the shards' tensors, its total size adds up, and every layer
    tensor of the manifest is in the shards with its dtype and [tp, *shape_per_rank]."""
    path = root / INDEX_NAME
    try:
        index = jsontext.loads(path.read_text())
        wm = index["weight_map"]
        if not isinstance(wm, dict):
            raise TypeError("weight_map is not a map")
    except (OSError, ValueError, KeyError, TypeError) as e:
        what = "missing" if isinstance(e, FileNotFoundError) else f"unreadable ({e})"
        rep.problems.append(f"{path}: {what}")
        return {}
    tensors: dict[str, TensorInfo] = {}
    for name, shard in wm.items():
        if not isinstance(shard, str):
            rep.problems.append(f"{path}: puts {name} in {mf.show(shard)}, not a file name")
    read: set[str] = set()  # shards whose header was read: the others' tensors are unknown
    for shard in sorted({v for v in wm.values() if isinstance(v, str)}):
        if shard not in m["files"]:
            rep.problems.append(f"{path}: names {shard}, which the manifest lacks")
            continue
        if fm.bad_path(shard) or not (root / shard).is_file():
            continue  # check_files said why
        try:
            infos = read_header(root / shard)[0]
        except FiConvertError as e:
            rep.problems.append(str(e))
            continue
        read.add(shard)
        for name, info in infos.items():
            tensors[name] = info
            if wm.get(name) != shard:
                rep.problems.append(f"{root / shard}: holds {name}, which the index puts elsewhere")
    for name, shard in wm.items():
        if name not in tensors and isinstance(shard, str) and shard in read:
            rep.problems.append(f"{path}: lists {name}, which no shard holds")
    complete = all(isinstance(v, str) and v in read for v in wm.values())
    total = sum(t.nbytes for t in tensors.values())
    md = index.get("metadata")
    if complete and not mf.same(md.get("total_size") if isinstance(md, dict) else None, total):
        rep.problems.append(f"{path}: metadata.total_size is not {total}")
    tp = m["tp_size"]
    for prefix, layer in m["layers"].items():
        for pname, meta in layer["tensors"].items():
            found = tensors.get(f"{prefix}.{pname}")
            want = (tp, *meta["shape_per_rank"])
            if found is None:
                if complete:
                    rep.problems.append(f"{root}: manifest tensor {prefix}.{pname} is in no shard")
            elif found.dtype != meta["dtype"] or found.shape != want:
                rep.problems.append(
                    f"{found.file}: {found.name} is {found.dtype} {list(found.shape)}, the "
                    f"manifest says {meta['dtype']} {list(want)}"
                )
            rep.count("tensors")
    rep.count("index_entries", len(wm))
    return tensors


def check_manifest(root: Path, m: dict, tensors: dict[str, TensorInfo], rep: Report) -> None:
    """The manifest's own fields: each a value fi-convert writes, the sizes those of the
    output's config.json, and each layer entry (sizes, padding, tensors, their dtypes, shapes
    and layouts) what the scheme's own planning gives for the layer's recorded sizes. The
    shards hold what the entries say (`_check_index`); so they hold what the scheme makes."""
    where = root / MANIFEST_NAME
    rep.problems += [f"{where}: {p}" for p in mf.check_fields(m)]
    config = _config(root, m, rep)
    src: dict = m["source"] if isinstance(m.get("source"), dict) else {}
    family = recorded(src)
    if config is not None:
        if "model_type" in src and not mf.same(src["model_type"], model_type(config)):
            rep.problems.append(
                f"{where}: source.model_type is {mf.show(src['model_type'])}, {CONFIG_NAME} "
                f"says {mf.show(model_type(config))}"
            )
        archs, said = _architectures(root, m, config)
        if "architectures" in src and said and not mf.same(src["architectures"], archs):
            rep.problems.append(
                f"{where}: source.architectures is {mf.show(src['architectures'])}, "
                f"{said} says {mf.show(archs)}"
            )
        if CONFIG_NAME in m["files"] and not config_marker.is_marked(
            config.get("quantization_config")
        ):
            rep.problems.append(
                f"{root / CONFIG_NAME}: quantization_config is not fi-convert's mark, so a stock "
                "server would load the layouts as the source's weights; convert again"
            )
    if family is not None and config is not None:
        rep.problems += [f"{where}: {line}" for line in _moe_problems(src, family, config)]
    planner = _Planner.of(m)
    if m["tp_size"] > MAX_TP:
        rep.problems.append(f"{where}: tp_size is {m['tp_size']}, more than any server runs")
    for prefix, lay in m["layers"].items():
        lines = _layer_problems(prefix, lay, planner, family, config)
        rep.problems += [f"{where}: layer {prefix}: {line}" for line in lines]
        rep.count("layers_replanned" if planner else "layers")
    for name, info in sorted(tensors.items()):
        head, _, param = name.rpartition(".")
        if param in ("w13_weight", "w2_weight") and head not in m["layers"]:
            rep.problems.append(
                f"{info.file}: holds {name}, converted experts of a layer the manifest does "
                "not list"
            )


def _moe_problems(src: dict, family: Family, config: dict) -> list[str]:
    """`source.routing` and `source.activation` against what the family gives for the
    output's config.json (the source's)."""
    act = family.moe.activation_of(config)
    want = {"routing": family.moe.routing(config), "activation": act}
    return [
        f"source.{key} is {mf.show(src.get(key))}, {family.title}'s experts under "
        f"{CONFIG_NAME} give {mf.show(value)}"
        for key, value in want.items()
        if not mf.same(src.get(key), value)
    ]


def _architectures(root: Path, m: dict, config: dict) -> tuple[list[str], str | None]:
    """The architectures the output's source had, and the file that says so: its config.json,
    else (a Mistral-format source's output) its params.json, read as the converter reads it;
    (_, None) when it cannot be read (check_files says why)."""
    if CONFIG_NAME in m["files"] or mistral_format.PARAMS_NAME not in m["files"]:
        return served_architectures(config), CONFIG_NAME
    p = root / mistral_format.PARAMS_NAME
    try:
        params = jsontext.loads(p.read_text())
        return served_architectures(mistral_format.config(params, p)), mistral_format.PARAMS_NAME
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, FiConvertError, AttributeError):
        return [], None


def _config(root: Path, m: dict, rep: Report) -> dict | None:
    """The output's config.json (the source's, marked); `{}` when the output has none, as its
    source had none; None when it cannot be read (check_files, or this, says why)."""
    if CONFIG_NAME not in m["files"]:
        return {}
    p = root / CONFIG_NAME
    if not p.is_file() or fm.bad_path(CONFIG_NAME):
        return None
    try:
        cfg = jsontext.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        rep.problems.append(f"{p}: not readable JSON ({e})")
        return None
    if not isinstance(cfg, dict):
        rep.problems.append(f"{p}: not a JSON object")
        return None
    if not isinstance(cfg.get("text_config"), dict | None):  # readers take it for a map
        cfg = {k: v for k, v in cfg.items() if k != "text_config"}
    return cfg


def _layer_problems(
    prefix: str, lay: dict, planner: _Planner | None, family: Family | None, config: dict | None
) -> list[str]:
    """What in one layer entry is not what fi-convert writes: values outside their closed sets,
    sizes other than config.json's, and every field the scheme's plan gives otherwise."""
    out: list[str] = []
    flagged: set[str] = set()  # fields already reported: the plan's difference would repeat it

    def flag(path: str, line: str) -> None:
        out.append(line)
        flagged.add(path)

    for key, allowed in mf.LAYER_VALUES.items():
        if key in lay and not any(mf.same(lay[key], a) for a in allowed):
            flag(key, f"{key} is {mf.show(lay[key])}, not one of {_one_of(allowed)}")
    for pname, t in lay["tensors"].items():
        for key, allowed in mf.TENSOR_VALUES.items():
            if key in t and not any(mf.same(t[key], a) for a in allowed):
                flag(
                    f"{pname}.{key}",
                    f"{pname}.{key} is {mf.show(t[key])}, not one of {_one_of(allowed)}",
                )
    sizes: dict[str, int] = {}
    for key in SIZES:
        v, top = lay.get(key), MAX_EXPERTS if key == "num_experts" else MAX_SIZE
        if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= top):
            flag(key, f"{key} is {mf.show(v)}, not a size from 1 to {top}")
            continue
        sizes[key] = v
        said = family.config_value(config, key, prefix) if family and config is not None else None
        if said is not None and said != v:
            flag(key, f"{key} is {v}, {CONFIG_NAME} says {said}")
    if planner is None or len(sizes) < len(SIZES):
        return out
    e, h, i = (sizes[k] for k in SIZES)
    if h * i > MAX_MATRIX:
        return [*out, f"hidden_size {h} times intermediate_size {i} is more than any model has"]
    clamp = family.swiglu_limit(config or {}, prefix) if family is not None else None
    gated = family is None or gated_activation(family.moe.activation)
    planned = planner.summaries(prefix, e, h, i, clamp, gated)
    if isinstance(planned, str):
        return [*out, f"{planner.label} cannot make a layer of E {e}, H {h}, I {i}: {planned}"]
    extra = {}
    if family is not None:  # what make_plan copies from config.json
        extra = {k: config_field(config or {}, k) for k in family.manifest_keys}
    if any(DIFFER in want for want in planned):
        got = lay.get(DIFFER)
        if _experts_list(got, e):
            extra[DIFFER] = got
        else:
            flag(
                DIFFER,
                f"{DIFFER} is {mf.show(got)}, not a sorted list of distinct experts "
                f"from 0 to {e - 1}",
            )
    diffs = [list(_diff(lay, {**want, **extra}, planner.label)) for want in planned]
    best = min(diffs, key=len)  # the source format this layer came from: the closest plan
    out += [line for path, line in best if path not in flagged]
    return out + planner.others_differ(prefix, e, h, i, gated)


def _experts_list(v: object, e: int) -> bool:
    return (
        isinstance(v, list)
        and all(type(x) is int and 0 <= x < e for x in v)
        and v == sorted(set(v))
    )


def _one_of(allowed: tuple) -> str:
    return ", ".join(mf.show(a) for a in allowed)


def _diff(got: dict, want: dict, label: str) -> Iterator[tuple[str, str]]:
    """(field, line) for each field of a layer entry that differs from the plan's."""

    def field_lines(path: str, g: dict, w: dict, key: str) -> Iterator[tuple[str, str]]:
        if key not in g:
            yield path, f"{path} is missing; {label} gives {mf.show(w[key])}"
        elif key not in w:
            yield path, f"{path} is not a field {label} writes"
        elif not mf.same(g[key], w[key]):
            yield path, f"{path} is {mf.show(g[key])}; {label} gives {mf.show(w[key])}"

    for key in sorted((set(got) | set(want)) - {"tensors"}):
        yield from field_lines(key, got, want, key)
    gt, wt = got["tensors"], want["tensors"]
    for pname in sorted(set(gt) | set(wt)):
        if pname not in gt:
            w = wt[pname]
            yield (
                pname,
                (
                    f"tensor {pname} is missing; {label} writes it ({w['dtype']} "
                    f"{w['shape_per_rank']} per rank)"
                ),
            )
        elif pname not in wt:
            yield pname, f"tensor {pname} is not one {label} writes"
        else:
            for key in sorted(set(gt[pname]) | set(wt[pname])):
                yield from field_lines(f"{pname}.{key}", gt[pname], wt[pname], key)


@dataclass
class _Planner:
    """Plans layers as `convert` does, from a manifest entry's recorded sizes: the scheme's own
    `plan_layer` on stand-ins of the source's experts, and the entry `convert` writes of it."""

    scheme: SchemeName
    backend: Backend
    tp: int
    server: str = DEFAULT_SERVER
    layout: Layout = VLLM_LAYOUT
    # the other servers an output for several declares, with their layouts: each must plan
    # the same layer entries (`others_differ`)
    others: tuple[tuple[str, Layout], ...] = ()
    cache: dict[tuple[int, int, int, float | None, bool], list[dict]] = field(default_factory=dict)

    @classmethod
    def of(cls, m: dict) -> _Planner | None:
        """None when the manifest's scheme, backend, TP size or server is not one to plan
        with (`check_fields` says why)."""
        scheme = next((s for s in REGISTRY if s.value == m["scheme"]), None)
        backend = next((b for b in Backend if b.value == m["backend"]), None)
        if scheme is None or backend not in REGISTRY[scheme].backends or m["tp_size"] > MAX_TP:
            return None
        assert backend is not None
        try:
            servers = [resolve(n) for n in servers_of(m)]
        except FiConvertError:
            return None
        if any(t.refuses(scheme.value, backend.value) for t in servers):
            return None
        layouts = [(t.name, t.layout(scheme.value, backend.value)) for t in servers]
        return cls(scheme, backend, m["tp_size"], *layouts[0], tuple(layouts[1:]))

    def others_differ(self, prefix: str, e: int, h: int, i: int, gated: bool = True) -> list[str]:
        """For an output declared for several servers: the line for each other server whose
        layout gives this layer other bytes than the first's (their plans differ)."""
        scheme, out = REGISTRY[self.scheme], []
        for name, layout in self.others:
            for layer in scheme.stand_in_layers(prefix, e, h, i, gated=gated):
                try:
                    a = scheme.plan_stand_in(layer, self.backend, self.tp, layout=self.layout)
                except FiConvertError:
                    continue  # a source format the first server's layout refuses
                try:
                    b = scheme.plan_stand_in(layer, self.backend, self.tp, layout=layout)
                except FiConvertError as err:
                    out.append(f"declared for {name} too, which cannot hold it: {err}")
                    break
                diff = first_difference([a], [b], (self.server, name))
                if diff:
                    out.append(f"declared for {name} too, which holds other bytes: {diff}")
                    break
        return out

    @property
    def label(self) -> str:
        label = f"{self.scheme.value}/{self.backend.value} at tp {self.tp}"
        return label if self.server == DEFAULT_SERVER else f"{label} for {self.server}"

    def summaries(
        self, prefix: str, e: int, h: int, i: int, clamp: float | None = None, gated: bool = True
    ) -> list[dict] | str:
        """The layer entry of each source format (JSON, as in the manifest), or why the scheme
        cannot make such a layer; `clamp`: the experts' SwiGLU clamp config.json gives;
        `gated`: whether the family's experts have a gate (non-gated: w13 is up alone)."""
        key = (e, h, i, clamp, gated)
        if key in self.cache:
            return self.cache[key]
        scheme = REGISTRY[self.scheme]
        out, refused = [], []
        try:
            for layer in scheme.stand_in_layers(prefix, e, h, i, gated=gated):
                layer.swiglu_limit = clamp
                try:
                    lp = scheme.plan_stand_in(layer, self.backend, self.tp, layout=self.layout)
                except FiConvertError as err:  # this source format only (e.g. BF16 for SGLang)
                    refused.append(err)
                    continue
                out.append(json.loads(json.dumps(_layer_summary(lp))))
        except (ValueError, RuntimeError, ArithmeticError) as err:  # sizes no checkpoint has
            return f"{type(err).__name__}: {err}"
        if not out and refused:
            return str(refused[0]).removeprefix(f"{prefix}: ")
        self.cache[key] = out
        return out


def _sample(n: int, full: bool) -> list[int]:
    return list(range(n)) if full else sorted({0, n // 2, n - 1})


def check_source(
    root, m, tensors, source, full, against_flashinfer, device, rep, files=None,
    card_replaced=False,
) -> None:  # fmt: skip
    """Re-derive experts of the checkpoint at `source` and compare them with the output's,
    reading both through `files` (local files by default; a remote verify reads the Hub);
    and the manifest's fields that only the source proves."""
    where = root / MANIFEST_NAME
    if against_flashinfer:
        refuse_against_flashinfer(root, m)
    fingerprint = open_checkpoint(source).fingerprint
    if fingerprint != m["source"]["fingerprint"]:
        rep.problems.append(
            f"{where}: source.fingerprint is {mf.show(m['source']['fingerprint'])}, {source} "
            f"has {fingerprint}: not the checkpoint this output was converted from, or the "
            "manifest was changed; pass the original model folder, or convert again"
        )
        return
    # the output exists: re-derive it even where vLLM cannot serve it (--allow-unservable)
    servers = ",".join(servers_of(m))
    family = recorded(m["source"])  # a user's family file the output holds, or None
    own = family if family is not None and family.own else None
    opts = Options(
        m["scheme"], m["backend"], m["tp_size"], allow_unservable=True, server=servers, family=own
    )
    plan = make_plan(source, opts)
    rep.problems += [f"{where}: {line}" for line in _source_bound(m, plan)]
    dev = resolve_device(device)
    files = files or SourceFiles()
    try:
        _side_files(plan, m, card_replaced, rep)
        if full:
            _carried(plan, tensors, files, rep)
        if against_flashinfer:
            _against_flashinfer(plan, tensors, files, full, dev, rep)
        else:
            _against_ours(plan, tensors, files, full, dev, rep)
    finally:
        files.close()


def _source_bound(m: dict, plan) -> list[str]:
    """The manifest's fields that the output's files cannot prove, against what this
    fi-convert writes for the source: `source` (its model_type, family, shard count; every key
    `build` writes for a local source) and `fi_convert_version`, which must be this
    fi-convert's, since its code is what re-derives the bytes."""
    out = []
    if not mf.same(m["fi_convert_version"], __version__):
        v = m["fi_convert_version"]
        out.append(
            f"fi_convert_version is {mf.show(v)}, but this fi-convert ({__version__}) "
            f"re-derives the bytes and proves only its own; verify with fi-convert {v}, or "
            "convert again"
        )
    want = mf.build(plan, {})["source"]
    for key, value in want.items():
        if not mf.same(m["source"].get(key), value):
            got = mf.show(m["source"].get(key))
            out.append(f"source.{key} is {got}, the source gives {mf.show(value)}")
    return out


def _side_files(plan, m: dict, card_replaced: bool, rep: Report) -> None:
    """The side files the output lists are the source's as it is now (config.json: marked),
    so a source changed since (a new tokenizer config) is seen. They are small: hashed."""
    for rel in plan.side_files:
        meta = m["files"].get(rel)
        if meta is None or (rel == "README.md" and card_replaced):  # a Hub card replaced it
            continue
        marked = plan.marked(rel)
        if marked is not None:
            sha = hashlib.sha256(marked).hexdigest()
        else:
            sha = sha256_file(plan.ckpt.root / rel)
        if sha != meta["sha256"]:
            rep.problems.append(
                f"{rel}: differs from the source's {plan.ckpt.root / rel} (the source changed "
                "since it was converted, or the output's copy did); convert again"
            )
        rep.count("side_files_compared")


def _carried(plan, tensors: dict[str, TensorInfo], files: SourceFiles, rep: Report) -> None:
    """With --full: every tensor carried over unchanged holds the source's bytes."""
    for shard in plan.shards:
        for it in shard.items:
            if it.source is None or it.entry.name not in tensors:
                continue
            if not _same_bytes(files, tensors[it.entry.name], it.source):
                rep.problems.append(
                    f"{tensors[it.entry.name].file}: {it.entry.name} differs from the source's "
                    f"({it.source.file}); convert again"
                )
            rep.count("carried_tensors_compared")


def _same_bytes(files: SourceFiles, a: TensorInfo, b: TensorInfo, piece: int = 64 << 20) -> bool:
    """Whether two stored tensors hold the same bytes, compared piece by piece."""
    if a.nbytes != b.nbytes:
        return False
    piece = max(1, min(piece, a.nbytes))
    x = torch.empty(piece, dtype=torch.uint8, device="cpu")
    y = torch.empty(piece, dtype=torch.uint8, device="cpu")
    for off in range(0, a.nbytes, piece):
        n = min(piece, a.nbytes - off)
        files.read_bytes(a.file, a.start + off, x[:n])
        files.read_bytes(b.file, b.start + off, y[:n])
        if not torch.equal(x[:n], y[:n]):
            return False
    return True


def _stored(files: SourceFiles, info: TensorInfo, rank: int) -> torch.Tensor:
    """One rank's slice of a stored tensor."""
    t = torch.empty(info.shape[1:], dtype=dtypes.to_torch(info.dtype), device="cpu")
    files.read_rows(info, rank, rank + 1, t)
    return t


def _stored_expert(files: SourceFiles, info: TensorInfo, rank: int, e: int) -> torch.Tensor:
    """Expert `e` of one rank's slice of a stored [tp, E, ...] tensor, as [1, ...]."""
    tp, n = info.shape[0], info.shape[1]
    rows = TensorInfo(
        info.name, info.dtype, (tp * n, *info.shape[2:]), info.start, info.nbytes, info.file
    )
    t = torch.empty((1, *info.shape[2:]), dtype=dtypes.to_torch(info.dtype), device="cpu")
    files.read_rows(rows, rank * n + e, rank * n + e + 1, t)
    return t


def _produce(ctx: Ctx, out, rank: int, experts: range, dst: torch.Tensor) -> None:
    """`out.produce`, then its staging buffers free again (as the converter does per chunk:
    kept, they would pile up with every expert checked)."""
    out.produce(ctx, rank, experts, dst)
    if dst.is_cuda:  # the copies from the staging buffers must be done before their reuse
        torch.cuda.current_stream(dst.device).synchronize()
    ctx.release()


def _against_ours(plan, tensors, files, full, dev, rep) -> None:
    ctx = Ctx(files, dev)
    tp = plan.options.tp_size
    for lp in plan.layers:
        experts = _sample(lp.info["num_experts"], full)
        for out in lp.outputs:
            info = tensors[f"{lp.prefix}.{out.name}"]
            for rank in range(tp):
                got = torch.empty(out.rank_shape, dtype=dtypes.to_torch(info.dtype), device=dev)
                if not out.chunked:
                    _produce(ctx, out, rank, range(lp.info["num_experts"]), got)
                    pairs = [(got, _stored(files, info, rank))]
                else:  # only the sampled experts' bytes are read
                    pairs = []
                    for e in experts:
                        one = got[e : e + 1]
                        _produce(ctx, out, rank, range(e, e + 1), one)
                        pairs.append((one, _stored_expert(files, info, rank, e)))
                for a, b in pairs:
                    if not dtypes.same_bytes(a, b):
                        rep.problems.append(
                            f"{info.file}: {info.name} rank {rank} differs from the source "
                            "re-derived; convert again"
                        )
                        break
                rep.count("rank_tensors_rederived")
        rep.count("experts_rederived", len(experts) * tp)


def refuse_against_flashinfer(root: Path, m: dict) -> None:
    """`--against-flashinfer` re-derives the bytes with vLLM 0.33's load-time pipeline
    (`flashinfer_reference`): another server's output is refused, not compared with it."""
    server = server_of(m)
    if DEFAULT_SERVER not in servers_of(m):
        raise FiConvertError(
            f"{root}: an output for {server}, and --against-flashinfer re-derives vLLM 0.33's "
            f"load-time pipeline, not {server}'s; verify it against the source without "
            "--against-flashinfer (its layouts are proven against SGLang's own processing in "
            "fi-convert's tests)"
        )
    layers = m.get("layers")
    entries = layers.items() if isinstance(layers, dict) else ()
    non_gated = next((p for p, lay in entries if lay.get("gated") is False), None)
    if non_gated is not None:
        raise FiConvertError(
            f"{root}: {non_gated} holds non-gated experts (w13 the up projection alone), and "
            "--against-flashinfer re-derives vLLM's pipeline of gated ones only; verify it "
            "against the source without --against-flashinfer (its layouts are proven against "
            "vLLM's own processing in fi-convert's tests)"
        )


def _against_flashinfer(plan, tensors, files, full, dev, rep) -> None:
    try:
        reference = importlib.import_module("fi_convert.verify.flashinfer_reference")
    except ImportError as e:
        raise FiConvertError(
            f"--against-flashinfer needs FlashInfer ({e.name} is missing); install it with "
            "`pip install flashinfer-python==0.7.2.post1` (or `make install`), or verify without it"
        ) from None
    tp = plan.options.tp_size
    # the family's fused form is stored transposed ([E, in, out]), which vLLM's loader turns
    transposed = any(f.transposed for f in plan.family.forms if f.kind == "fused")
    # ... its w13's gate and up rows interleaved, which the model's loader de-interleaves
    interleaved = any(f.interleaved for f in plan.family.forms if f.kind == "fused")
    layers = plan.layers if full else [plan.layers[0], plan.layers[-1]]
    for lp in {id(x): x for x in layers}.values():
        for rank in range(tp):
            want = reference.expected(
                plan.ckpt.root,
                lp.prefix,
                lp.info["num_experts"],
                plan.scheme.value,
                plan.options.backend.value,
                tp,
                rank,
                str(dev),
                transposed=transposed,
                interleaved=interleaved,
            )
            for name, t in want.items():
                info = tensors.get(f"{lp.prefix}.{name}")
                if info is None or not dtypes.same_bytes(_stored(files, info, rank), t):
                    rep.problems.append(
                        f"{plan.ckpt.root}: {lp.prefix}.{name} rank {rank} differs from "
                        "FlashInfer's own pipeline"
                    )
                rep.count("tensors_vs_flashinfer")
