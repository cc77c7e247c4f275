"""Open a source checkpoint folder: validate its files, read shard headers, find MoE layers."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import forms, jsontext, mistral_format
from .errors import SourceError
from .families import (
    QUANT_FIELDS,
    Family,
    Form,
    all_families,
    architectures,
    config_problem,
    declared,
    model_type,
    wrong_kind,
)
from .format.names import INDEX_NAME
from .paths import MODEL_FIX, denied, model_error, model_exists
from .st_io import SourceFiles, TensorInfo, read_header

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# compressed-tensors calls packed FP4 weights `weight_packed`; schemes see them as `weight`
PARAM_ALIASES = {"weight_packed": "weight"}
# huggingface_hub's marker of its cache-wide blob store (`<cache>/blobs/`, see _allowed_roots)
SHARED_BLOBS_MARKER = ".huggingface-shared-blobs"


@dataclass
class Checkpoint:
    root: Path
    config: dict
    quant_config: dict | None
    tensors: dict[str, TensorInfo]
    shards: list[Path]
    fingerprint: str
    # the file the config was read from: config.json, or Mistral's params.json
    config_name: str = "config.json"

    @property
    def model_type(self) -> str | None:
        return model_type(self.config)

    @property
    def architectures(self) -> list[str]:
        """config.json's `architectures` (and its text_config's): the model classes a server
        picks by them."""
        return architectures(self.config)


# per run (its SourceFiles): per layer shape, the first layer's `ExpertLayer.read` calls, in
# order, and which layer made them; and how many calls each other layer has made
_LEARNT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class ExpertLayer:
    """One MoE layer's routed experts as found in the checkpoint."""

    prefix: str
    form: Form
    num_experts: int
    hidden_size: int
    intermediate_size: int
    # per-expert forms: (stored role, param, expert) -> tensor; the others: (stored role,
    # param, -1) -> tensor (forms.STORED: a fused w13 holds w1 and w3)
    params: dict[tuple[str, str, int], TensorInfo] = field(default_factory=dict)
    # the limit of the experts' SwiGLU clamp config.json gives (`Family.swiglu_limit`), or None
    swiglu_limit: float | None = None
    # the family's FlashInfer routing method for this config.json, and its experts' activation
    # (`Family.moe`): which kernels a server runs the layer on
    routing: str = "Unspecified"
    activation: str = "silu"

    def param_names(self) -> set[str]:
        return {p for (_, p, _) in self.params}

    @property
    def gated(self) -> bool:
        """Whether the experts have a gate: w13 is [gate; up] ([2I, H]); else (non-gated,
        relu2_no_mul) w13 is the up projection w1 alone ([I, H])."""
        return forms.gated(self.form)

    @property
    def roles(self) -> tuple[str, ...]:
        """One expert's matrices: w1, w3, w2 (gated) or w1, w2 (non-gated)."""
        return forms.roles(self.form)

    @property
    def w13_parts(self) -> int:
        """The projections w13 stacks: 2 ([gate; up]) or 1 (up, non-gated)."""
        return 2 if self.gated else 1

    def tensor(self, role: str, param: str, expert: int) -> TensorInfo:
        """The stored tensor that holds expert `expert`'s `role` matrix."""
        e = expert if forms.per_expert(self.form) else -1
        return self.params[(forms.stored_role(self.form, role), param, e)]

    def has(self, param: str) -> bool:
        stored = forms.stored_roles(self.form)
        if not forms.per_expert(self.form):
            return all((r, param, -1) in self.params for r in stored)
        return all((r, param, e) in self.params for r in stored for e in range(self.num_experts))

    def source_names(self) -> list[str]:
        return sorted(t.name for t in self.params.values())

    def proj_shape(self, role: str, param: str) -> tuple[int, ...]:
        """Shape of one expert's matrix of `role` (the fused tensor split into its halves)."""
        info = self.tensor(role, param, 0)
        if self.form.kind == "per_expert":
            return info.shape
        shape = forms.matrix_shape(self.form, info, self.num_experts)
        if forms.transposed(self.form, role):
            shape = shape[::-1]
        fused = forms.stored_role(self.form, role) == "w13"
        return (shape[0] // 2, *shape[1:]) if fused else shape

    def read(
        self,
        files: SourceFiles,
        role: str,
        param: str,
        experts: range,
        rows: tuple[int, int],
        cols: tuple[int, int] | None,
        dst: torch.Tensor,
    ) -> None:
        """Copy rows [a, b) (and columns [c, d)) of each expert's `role` matrix into dst[i]."""
        # the next chunk of experts will want the same rows
        after = range(experts.stop, min(experts.stop + len(experts), self.num_experts))
        where = [self._span(role, param, e, rows, cols) for e in (*experts, *after)]
        for i in range(len(experts)):
            # a source read over a link: the next `read_ahead` reads are in flight while
            # this one is taken (one at a time, each would wait out the link's latency)
            for s in where[i + 1 : i + 1 + files.read_ahead]:
                files.prefetch(s.info, s.start, s.extent)
            read_span_into(files, where[i], dst[i])
        if not files.read_ahead:
            # local files: have the kernel start reading the next chunk now, so that a cold
            # source is read while this chunk is transformed and written
            for s in where[len(experts) :]:
                files.prefetch(s.info, s.start, s.extent)
        else:
            self._ask_next_call(files, (role, param, experts, rows, cols), ask=not after)

    def _ask_next_call(self, files: SourceFiles, call: tuple, ask: bool) -> None:
        """A source read over a link, at the end of a read with no next chunk (`ask`): the
        first reads of the call that comes next are asked now, so that they arrive while
        this chunk is transformed and written. Which call comes next is learnt from the first
        layer of this shape that was read: every layer of a shape is read alike."""
        learnt = _LEARNT.setdefault(files, {})
        shape = (self.form.kind, self.num_experts, self.hidden_size, self.intermediate_size)
        teacher, calls = learnt.setdefault(shape, (self.prefix, []))
        if teacher == self.prefix:
            calls.append(call)
            return
        made = learnt.setdefault("calls made", {})  # per layer, in this run
        k = made[self.prefix] = made.get(self.prefix, -1) + 1
        if ask and k + 1 < len(calls):
            role, param, experts, rows, cols = calls[k + 1]
            for e in experts[: files.read_ahead]:
                s = self._span(role, param, e, rows, cols)
                files.prefetch(s.info, s.start, s.extent)

    def _span(
        self, role: str, param: str, e: int, rows: tuple[int, int], cols: tuple[int, int] | None
    ) -> forms.Span:
        """Where rows [a, b) (columns [c, d)) of expert e's `role` matrix are stored."""
        info = self.tensor(role, param, e)
        return forms.span(self.form, role, info, e, rows, cols, self.num_experts)


def expert_rows(info: TensorInfo) -> TensorInfo:
    """A fused [E, R, ...] tensor seen as [E*R, rest]: expert e's row r is row e*R + r."""
    return forms.flat_rows(info)


def read_span_into(files: SourceFiles, s: forms.Span, dst: torch.Tensor) -> None:
    """dst[:rows, :cols] = the part of one expert's matrix at `s` (transposed where it is
    stored [in, out]: its stored rows read, then turned; every `step`-th row of those it lies
    in, where it is an interleaved w13's gate or up)."""
    if s.step > 1:
        read_rows_stepped(files, s, dst)
        return
    if not s.transposed:
        read_rows_into(files, s.info, s.start, s.count, s.cols, dst)
        return
    assert s.cols is not None
    width = s.cols[1] - s.cols[0]
    if width <= 0 or s.count <= 0:
        return
    tmp = torch.empty((s.count, width), dtype=dst.dtype)
    read_rows_into(files, s.info, s.start, s.count, s.cols, tmp)
    dst[:width, : s.count].copy_(tmp.T)


def read_rows_stepped(files: SourceFiles, s: forms.Span, dst: torch.Tensor) -> None:
    """dst[:count, :cols] = every `s.step`-th row of the rows [start, start + extent) of the
    2-D `s.info` (columns `s.cols` when given): the stored rows read whole, then taken."""
    if s.count <= 0:
        return
    width = s.info.shape[1] if s.cols is None else s.cols[1] - s.cols[0]
    tmp = torch.empty((s.extent, width), dtype=dst.dtype)
    read_rows_into(files, s.info, s.start, s.extent, s.cols, tmp)
    dst[: s.count, :width].copy_(tmp[:: s.step])


def read_rows_into(
    files: SourceFiles,
    info: TensorInfo,
    start: int,
    count: int,
    cols: tuple[int, int] | None,
    dst: torch.Tensor,
) -> None:
    """dst[:count, :width] = rows [start, start + count) of the 2-D `info`, columns [c, d)
    when given; straight into `dst` when it is exactly that contiguous block."""
    if count <= 0:
        return
    if cols is None and dst.is_contiguous() and dst.numel() == count * math.prod(info.shape[1:]):
        files.read_rows(info, start, start + count, dst)
        return
    tmp = torch.empty((count, *info.shape[1:]), dtype=dst.dtype, device="cpu")
    files.read_rows(info, start, start + count, tmp)
    part = tmp if cols is None else tmp[:, cols[0] : cols[1]]
    dst[:count, : part.shape[1]].copy_(part)


def not_a_file(p: Path, root: Path | None = None) -> str | None:
    """What `p` is when it holds no file to read, None when it does (a regular file, or a
    link to one): a link loop, a link to nothing, a link to a folder (saying whether it is
    out of the model folder `root`), a FIFO, socket or device."""
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a link loop (following it leads back to it)"
        if e.errno in (errno.ENOENT, errno.ENOTDIR) and p.is_symlink():
            return f"a link to nothing ({os.readlink(p)} does not exist)"
        raise SourceError(f"{p}: cannot read ({e.strerror}); check the model folder") from None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        where = "" if root is None or is_inside(root, p) else ", outside the model folder"
        return f"a link to the folder {os.path.realpath(p)}{where}"
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def check_regular(p: Path, root: Path | None = None) -> None:
    """Refuse what is not a regular file (a FIFO would block a read forever), saying what it is."""
    what = not_a_file(p, root)
    if what:
        raise SourceError(
            f"{p}: not a regular file but {what}; remove it from the model folder or put the "
            "file there"
        )


def _load_json(path: Path) -> dict:
    if path.exists() or path.is_symlink():
        check_regular(path)
    try:
        d = jsontext.loads(path.read_text())
    except PermissionError as e:
        raise SourceError(denied(path, e, MODEL_FIX)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"{path}: not readable JSON ({e}); fix or restore the file") from None
    if not isinstance(d, dict):
        raise SourceError(f"{path}: expected a JSON object; fix or restore the file")
    return d


def _refuse_field(path: Path, problem: str | None) -> None:
    """A field of a config file that holds the wrong kind of value: one line naming both."""
    if problem:
        raise SourceError(f"{path}: {problem}; fix that field or restore the model's {path.name}")


def _inside(root: Path, name: str, what: Path) -> Path:
    """Resolve shard `name` from `what` (the index) and refuse paths that leave the folder."""
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or len(p.parts) != 1:
        raise SourceError(
            f"{what}: shard name {name!r} points outside the model folder; "
            "an index may only name files beside it"
        )
    return root / p


def _allowed_roots(root: Path) -> list[Path]:
    """Where a shard may really live: the folder itself, or for a Hugging Face cache snapshot
    (`models--org--name/snapshots/<rev>`) the repo's `blobs/`, which its symlinks point into,
    and the cache-wide store of Xet files (`<cache>/blobs/`, marked by huggingface_hub), which
    newer huggingface_hub versions link those blobs to."""
    real = root.resolve()
    roots = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        repo = real.parent.parent
        roots.append(repo / "blobs")
        store = repo.parent / "blobs"
        if (store / SHARED_BLOBS_MARKER).is_file():
            roots.append(store)
    return roots


def is_inside(root: Path, p: Path) -> bool:
    """Whether `p`, its links followed, is in the model folder (or its Hub cache's blobs)."""
    real = p.resolve()
    return any(real == r or r in real.parents for r in _allowed_roots(root))


def check_real_path(root: Path, p: Path) -> None:
    if not is_inside(root, p):
        real = p.resolve()
        raise SourceError(
            f"{p}: links to {real}, outside the model folder; copy the file into the folder "
            "instead of linking it"
        )


def _shard_paths(root: Path, mistral: bool = False) -> tuple[list[Path], dict[str, str] | None]:
    """The shards (those of its index, where it has one), and the index's weight map; in
    Mistral's format (`mistral`), its consolidated shards and their index."""
    index_name = mistral_format.INDEX_NAME if mistral else INDEX_NAME
    index = root / index_name
    if index.exists():
        d = _load_json(index)
        wm = d.get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise SourceError(f"{index}: no valid 'weight_map'; fix or restore the index")
        names = sorted(set(wm.values()))
        paths = [_inside(root, n, index) for n in names]
        for p in paths:
            if not p.exists():
                if p.is_symlink():
                    check_regular(p)  # says what the link is
                raise SourceError(
                    f"{p}: shard named by {index_name} is missing; download it again "
                    "(e.g. `hf download <repo> --local-dir <model-dir>`)"
                )
        return paths, wm
    paths = sorted(root.glob(mistral_format.SHARD_GLOB if mistral else "*.safetensors"))
    if not paths:
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise SourceError(
                f"{root}: holds only pickle weights ({pickles[0]}, ...); fi-convert reads "
                "safetensors only and never unpickles - convert them to safetensors first"
            )
        raise SourceError(f"{root}: no *.safetensors files; point at a model folder")
    return paths, None


def open_checkpoint(path: str | Path) -> Checkpoint:
    try:
        return _open_checkpoint(Path(path))
    except OSError as e:  # a model folder (or a file in it) this user may not read
        raise model_error(e, path) from None


def _open_checkpoint(root: Path) -> Checkpoint:
    if not model_exists(root):
        raise SourceError(f"{root}: no such folder; pass a local model folder")
    if not root.is_dir():
        raise SourceError(f"{root}: not a folder; pass the folder that holds config.json")
    cfg_path = root / "config.json"
    mistral = mistral_format.is_mistral(root)
    if not mistral and not (cfg_path.exists() or cfg_path.is_symlink()):
        raise SourceError(
            f"{root}: no config.json; fi-convert takes the model family and sizes from it and "
            "the output needs it - put the model's config.json in the folder (e.g. `hf download "
            f"<repo> config.json --local-dir {root}`)"
        )
    if mistral:  # Mistral's own format: params.json, consolidated shards
        cfg_path = root / mistral_format.PARAMS_NAME
        config = mistral_format.config(_load_json(cfg_path), cfg_path)
    else:
        config = _load_json(cfg_path)
    _refuse_field(cfg_path, config_problem(config))
    quant = config.get("quantization_config")
    hq = root / "hf_quant_config.json"
    if hq.exists():
        quant = _load_json(hq)
        inner = quant.get("quantization") or {}
        _refuse_field(
            hq, wrong_kind(QUANT_FIELDS, quant) or wrong_kind(QUANT_FIELDS, inner, "quantization.")
        )
    shards, wm = _shard_paths(root, mistral)
    for p in shards:
        check_regular(p)
        check_real_path(root, p)
    tensors: dict[str, TensorInfo] = {}
    fp = hashlib.sha256()
    for p in shards:
        infos, raw = read_header(p)
        fp.update(p.name.encode() + b"\0" + str(p.stat().st_size).encode() + b"\0" + raw)
        for name, info in infos.items():
            if name in tensors:
                raise SourceError(f"{p}: tensor {name!r} also in {tensors[name].file.name}")
            tensors[name] = info
    if wm is not None:
        index_name = mistral_format.INDEX_NAME if mistral else INDEX_NAME
        for name, shard in wm.items():
            if name not in tensors or tensors[name].file.name != shard:
                raise SourceError(
                    f"{root / shard}: {index_name} lists tensor {name!r} in this shard, "
                    "but the shard does not hold it; download the checkpoint again"
                )
    return Checkpoint(root, config, quant, tensors, shards, fp.hexdigest(), cfg_path.name)


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def find_family(
    ckpt: Checkpoint, extra: tuple[Family, ...] = ()
) -> tuple[Family | None, list[ExpertLayer]]:
    """The family config.json names (`model_type`, `architectures`) and its MoE layers; the
    families of `extra` (a user's `--family` file) first.

    Tensor names only confirm it: expert tensors named as another family's are a contradiction,
    refused; a model without MoE layers is refused as such; a family no server runs on
    FlashInfer (`MoeFacts.refuse`) is refused with the server's reason; a model of no family
    fi-convert knows is refused naming it and how to add one."""
    fams = (*extra, *all_families())
    if extra:  # the fields a user's family reads, as open_checkpoint checks the others'
        _refuse_field(ckpt.root / ckpt.config_name, config_problem(ckpt.config, extra))
    found = {fam.name: (fam, m) for fam in fams if (m := _match(ckpt, fam))}
    for fam in declared(ckpt.config, extra):
        _refuse_family(ckpt, fam, fam.name in found)
        if fam.name in found:
            layers = _layers(ckpt, fam, *found[fam.name][1])
            _check_sizes(ckpt, fam, layers)
            for layer in layers:
                layer.routing = fam.moe.routing(ckpt.config)
                layer.activation = fam.moe.activation_of(ckpt.config)
            return fam, layers
    if ckpt.config_name != "config.json" and declared(ckpt.config, extra):
        raise SourceError(_unfit(ckpt, declared(ckpt.config, extra)[0]))
    if found and declared(ckpt.config, extra):
        raise SourceError(_contradiction(ckpt, list(found.values())))
    if _dense(ckpt):
        raise SourceError(f"no MoE layers in {ckpt.root}: nothing to convert")
    raise SourceError(unknown_family(ckpt, list(found.values())))


def _refuse_family(ckpt: Checkpoint, fam: Family, matched: bool) -> None:
    """A family no server runs on FlashInfer's MoE: refused with the server's reason, where
    the model has experts (a dense model of its model_type has nothing to convert); and one
    whose config.json gives its experts an activation fi-convert does not write for it
    (`MoeFacts.activation_refused`: Kimi Linear's situ)."""
    if fam.moe.refuse and (matched or (fam.config_value(ckpt.config, "num_experts") or 0) > 1):
        raise SourceError(f"{ckpt.root / ckpt.config_name}: {fam.title}: {fam.moe.refuse}")
    why = fam.moe.activation_refused(ckpt.config)
    if why and matched:
        raise SourceError(f"{ckpt.root / ckpt.config_name}: {fam.title}: {why}")


def unknown_family(ckpt: Checkpoint, found: list[tuple[Family, tuple[Form, Groups]]]) -> str:
    """A model of no family fi-convert knows: its architecture, the families known, how to
    add one."""
    mt = model_type(ckpt.config)
    archs = architectures(ckpt.config)
    what = f"{', '.join(archs) or 'no architectures'} (model_type {mt or 'missing'})"
    names = ", ".join(sorted(f.name for f in all_families() if not f.moe.refuse))
    like = ""
    if found:
        best = _likeliest(ckpt, found)
        titles = " or ".join(f"{f.title}'s" for f, _ in best)
        like = (
            f"; its experts are named as {titles} ({_first(best[0][1][1])}): start from that file"
        )
    return (
        f"{ckpt.root / ckpt.config_name}: {what} is no model family fi-convert knows ({names}); "
        f"if a server runs it on FlashInfer's MoE, describe it in a family file and pass "
        f"--family FILE.json (docs/architecture.md#adding-a-family){like}"
    )


def _unfit(ckpt: Checkpoint, fam: Family) -> str:
    """A checkpoint in Mistral's format whose params.json implies a family (Mistral Large
    3) but whose expert tensors fit none of its forms: the first of them, and the naming."""
    experts = sorted((n for n in ckpt.tensors if "expert" in n.lower()), key=_natural)
    what = experts[0] if experts else f"{ckpt.root}: no tensor named for experts"
    names = " or ".join(f.pattern.pattern for f in fam.forms)
    return (
        f"{what}: {ckpt.root / ckpt.config_name} is {fam.title}'s, whose experts are named "
        f"{names}, and its shards' are not; download the checkpoint again as published (its "
        "consolidated*.safetensors and their index)"
    )


def _check_sizes(ckpt: Checkpoint, fam: Family, layers: list[ExpertLayer]) -> None:
    """Each size the family reads from config.json against the expert tensors."""
    for layer in layers:
        for key, got in (
            ("hidden_size", layer.hidden_size),
            ("intermediate_size", layer.intermediate_size),
        ):
            found = fam.config_source(ckpt.config, key, layer.prefix)
            if found is not None and found[1] != got:
                field, said = found
                raise SourceError(
                    f"{_first_name(layer)}: {key.replace('_', ' ')} {got} in the shards but "
                    f"{ckpt.config_name} says {field} = {said}; the checkpoint and its config "
                    "disagree (or the family file reads the wrong field)"
                )


def _first_name(layer: ExpertLayer) -> str:
    return min(layer.source_names(), key=_natural)


Groups = dict[str, dict[tuple[str, str, int], TensorInfo]]


def _contradiction(ckpt: Checkpoint, found: list[tuple[Family, tuple[Form, Groups]]]) -> str:
    """config.json names another family, or none, than the expert tensors' names: say both."""
    best = _likeliest(ckpt, found)
    fams = [f for f, _ in best]
    example = _first(best[0][1][1])
    mt = model_type(ckpt.config)
    archs = architectures(ckpt.config)
    says = f"model_type {mt}" if mt else "no model_type"
    if archs:
        says += f" ({', '.join(archs)})"
    titles = " or ".join(f"{f.title}'s" for f in fams)
    fix = "restore the model's config.json"
    if mt:
        fix = (
            f"fix config.json, or if the model is of that family pass a copy of its family "
            f'file with "{mt}" in "model_types" (--family FILE.json)'
        )
    return (
        f"{ckpt.root / 'config.json'} says {says} but the expert tensors are named as {titles} "
        f"({example}); {fix}"
    )


def _likeliest(
    ckpt: Checkpoint, found: list[tuple[Family, tuple[Form, Groups]]]
) -> list[tuple[Family, tuple[Form, Groups]]]:
    """Of the families whose forms name the experts, those most like the checkpoint: where
    several name experts alike (DeepSeek-V3, Qwen3-MoE, GLM-4.5), their other tensors
    (`markers`) tell them apart."""
    score = [sum(any(m.search(n) for m in f.markers) for n in ckpt.tensors) for f, _ in found]
    return [found[k] for k, sc in enumerate(score) if sc == max(score)]


def _first(groups: Groups) -> str:
    """The tensor to name for a form's match: the first layer's first expert, gate before up
    before down."""
    params = groups[min(groups, key=_natural)]
    return params[min(params, key=lambda k: (k[2], ROLE_ORDER.index(k[0]), k[1]))].name


ROLE_ORDER = ("w13", "w1", "w3", "w2")


def _dense(ckpt: Checkpoint) -> bool:
    """No tensor named for experts, and no expert count above one in config.json."""
    if any("expert" in n.lower() for n in ckpt.tensors):
        return False
    counts = [f.config_value(ckpt.config, "num_experts") for f in all_families()]
    return not any(c and c > 1 for c in counts)


def _match(ckpt: Checkpoint, fam: Family) -> tuple[Form, Groups] | None:
    """The family's first form that names tensors of the checkpoint, with them by MoE module."""
    for form in fam.forms:
        groups: Groups = defaultdict(dict)
        counts = _set_counts(ckpt, fam, form)
        for name, info in ckpt.tensors.items():
            m = form.pattern.match(name)
            if not m or m["proj"] not in form.projections:
                continue
            role = form.projections[m["proj"]]
            expert = int(m["expert"]) if forms.per_expert(form) else -1
            raw = m.groupdict().get("param") or "weight"
            param = form.params.get(raw) or PARAM_ALIASES.get(raw, raw)
            module = form.module
            if form.sets:  # the set the expert is in, and its index in that set
                k = 0
                while counts and k < len(counts) - 1 and expert >= counts[k]:
                    expert, k = expert - counts[k], k + 1
                module = form.sets[k]
            groups[m["prefix"] + module][(role, param, expert)] = info
        if groups:
            return form, groups
    return None


def _set_counts(ckpt: Checkpoint, fam: Family, form: Form) -> list[int] | None:
    """Each expert set's expert count (`Form.sets`) as config.json gives it (one count for
    every set, or one per set), or None where it gives none."""
    if not form.sets:
        return None
    counts = [fam.config_value(ckpt.config, "num_experts", m) for m in form.sets]
    return [c for c in counts if c is not None] if all(counts) else None


def _layers(ckpt: Checkpoint, fam: Family, form: Form, groups: Groups) -> list[ExpertLayer]:
    prefixes = sorted(groups, key=_natural)
    if form.refuse:
        raise SourceError(f"{_first(groups)}: {form.refuse}")
    if form.sets and _set_counts(ckpt, fam, form) is None:
        keys = " or ".join(fam.config_keys["num_experts"])
        raise SourceError(
            f"{_first(groups)}: {fam.title}'s experts are {len(form.sets)} sets one after "
            f"another, and config.json gives no expert count per set ({keys}); restore the "
            "model's config.json"
        )
    return [_make_layer(ckpt, fam, form, p, groups[p]) for p in prefixes]


def _make_layer(
    ckpt: Checkpoint, fam: Family, form: Form, prefix: str, params: dict
) -> ExpertLayer:
    """The layer's experts, each of their weight tensors checked against config.json's sizes
    under the form's one reading."""
    if form.kind == "fused" and ("w13", "blocks", -1) in params:  # gpt-oss MXFP4
        sizes = _mxfp4_sizes(ckpt, fam, params)
    else:
        _require_weights(ckpt, form, prefix, params)
        _refuse_quantized_transposed(fam, form, params)
        sizes = _sizes(ckpt, fam, form, prefix, params)
        for (role, param, _), info in sorted(params.items(), key=lambda kv: kv[1].name):
            if param == "weight":
                forms.check_shape(info, form, role, sizes, fam.title)
    e, h, i = sizes.num_experts, sizes.hidden_size, sizes.intermediate_size
    return ExpertLayer(prefix, form, e, h, i, dict(params), fam.swiglu_limit(ckpt.config, prefix))


def _refuse_quantized_transposed(fam: Family, form: Form, params: dict) -> None:
    """A transposed form's tensors are read in BF16 only: where a quantized parameter's
    orientation goes is the server's per-parameter rule, not proven here."""
    other = next((i for (_, p, _), i in params.items() if p != "weight"), None)
    if form.transposed and other is not None:
        raise SourceError(
            f"{other.name}: fi-convert reads {fam.title}'s transposed fused experts in BF16 "
            "only; convert the BF16 checkpoint (with --scheme bf16, or a scheme that quantizes "
            "it), or one that stores the experts one tensor per expert"
        )


def _require_weights(ckpt: Checkpoint, form: Form, prefix: str, params: dict) -> None:
    """Every expert's weight of each role the form stores is there."""
    where = f"{ckpt.root}: {prefix}"
    if not forms.per_expert(form):
        for r in forms.stored_roles(form):
            if (r, "weight", -1) not in params:
                names = " and ".join(_proj(form, x) for x in forms.stored_roles(form))
                raise SourceError(
                    f"{where}: no {_proj(form, r)} weight beside the others; {form.kind} "
                    f"experts need {names} - the checkpoint is incomplete, download it again"
                )
        return
    experts = sorted({e for (_, _, e) in params})
    num = len(experts)
    if experts != list(range(num)):
        missing = sorted(set(range(experts[-1] + 1)) - set(experts))
        raise SourceError(
            f"{where}: experts {missing[:5]} are missing (found {num} of "
            f"{experts[-1] + 1}); the checkpoint is incomplete - download it again"
        )
    for e in experts:
        for r in forms.stored_roles(form):
            if (r, "weight", e) not in params:
                raise SourceError(
                    f"{where}.{e}: no {_proj(form, r)} weight; the checkpoint is "
                    "incomplete - download it again"
                )


def _sizes(ckpt: Checkpoint, fam: Family, form: Form, prefix: str, params: dict) -> forms.Sizes:
    """E, H and I from config.json; where it gives none, from the first expert's gate."""
    if forms.per_expert(form):
        first = params[(forms.stored_role(form, "w1"), "weight", 0)]
        num = len({e for (_, _, e) in params})
    else:
        first = params[(forms.stored_role(form, "w1"), "weight", -1)]
    cfg_e = fam.config_value(ckpt.config, "num_experts", prefix)
    if not forms.per_expert(form):
        counted = forms.expert_count(form, first, cfg_e)
        if counted is None:  # a flat tensor's rows are E experts' of a count it does not say
            keys = " or ".join(fam.config_keys["num_experts"])
            raise SourceError(
                f"{first.name}: {fam.title} stores the experts one after another in one "
                f"tensor, and config.json gives no expert count ({keys}); restore the model's "
                "config.json"
            )
        num = counted
    if cfg_e is not None and cfg_e != num:
        raise SourceError(
            f"{ckpt.root}: {prefix}: {num} experts in the shards but {ckpt.config_name} says "
            f"{cfg_e}; "
            "the checkpoint and its config disagree - download both again"
        )
    h = fam.config_value(ckpt.config, "hidden_size", prefix)
    i = fam.config_value(ckpt.config, "intermediate_size", prefix)
    if h is not None and i is not None:
        return forms.Sizes(num, h, i)
    th, ti = forms.tensor_sizes(form, first, num)
    return forms.Sizes(num, h or th, i or ti, f"config.json and {first.name}")


def _mxfp4_sizes(ckpt: Checkpoint, fam: Family, params: dict) -> forms.Sizes:
    """gpt-oss MXFP4's [E, 2I, H/32, 16] gate_up_proj_blocks and [E, H, I/32, 16]
    down_proj_blocks, against config.json's sizes."""
    w13, w2 = params[("w13", "blocks", -1)], params.get(("w2", "blocks", -1))
    if w2 is None or len(w13.shape) != 4 or len(w2.shape) != 4 or w13.shape[1] % 2:
        raise SourceError(
            f"{w13.name}: expected [E, 2I, H/32, 16] gate_up_proj_blocks and "
            "[E, H, I/32, 16] down_proj_blocks"
        )
    num, hidden, inter = w13.shape[0], w13.shape[2] * 32, w13.shape[1] // 2
    cfg = {k: fam.config_value(ckpt.config, k) for k in ("num_experts", "hidden_size")}
    cfg["intermediate_size"] = fam.config_value(ckpt.config, "intermediate_size")
    if cfg["num_experts"] not in (None, num):
        raise SourceError(
            f"{ckpt.root}: {w13.name.rsplit('.', 1)[0]}: {num} experts in the shards but "
            f"config.json says {cfg['num_experts']}; the checkpoint and its config disagree - "
            "download both again"
        )
    e, h, i = num, cfg["hidden_size"] or hidden, cfg["intermediate_size"] or inter
    for info, want, letters in (
        (w13, (e, 2 * i, h // 32, 16), "E, 2I, H/32, 16"),
        (w2, (e, h, i // 32, 16), "E, H, I/32, 16"),
    ):
        if info.shape != want:
            raise SourceError(
                f"{info.name}: shape {list(info.shape)}, expected {list(want)} ([{letters}] "
                f"with E={e}, H={h}, I={i} from config.json); the checkpoint and config.json "
                "disagree - download both again"
            )
    return forms.Sizes(e, h, i)


def _proj(form: Form, role: str) -> str:
    name = next((k for k, v in form.projections.items() if v == role), role)
    return role if name == role else f"{role}, {name}"
