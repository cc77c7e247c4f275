"""The load-time proof of a server release that an output does not list (issue 31, item 3),
the part every server shares; `servers/<name>/proof.py` runs the server's own code.

For each distinct layer shape of an output (scheme, backend, TP size, the layer's full and
per-rank sizes, its layouts and its activation facts), a source of two synthetic experts at
the layer's exact sizes (deterministic values, in the source format the scheme converts from)
is converted by fi-convert's own pipeline, and the same source is loaded and processed by the
installed server's own MoE layer for the rank; every tensor the output holds is compared byte
for byte with what the server holds. A passed proof is cached per (server release, layout
key, fi-convert version) under `${FI_CONVERT_CACHE:-~/.cache/fi-convert}/proofs/`.

It imports no server: the server's part is the `Run` a server's `proof.py` hands in.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cache import cache_root, write_atomic
from ..errors import FiConvertError, ManifestError
from ..version import __version__

# The source format each scheme's proof converts from (`Spec.quant` of fi_convert.testing):
# the checkpoint format whose MoE method the plugins serve for that scheme.
SOURCE_QUANT = {
    "bf16": "bf16",
    "fp8-block": "fp8-block",
    "fp8-tensor": "fp8-tensor",  # ModelOpt FP8, static activation scales
    "mxfp8": "mxfp8",  # ModelOpt MXFP8
    "nvfp4": "nvfp4",  # ModelOpt NVFP4
    "mxfp4": "mxfp4",  # gpt-oss
}
# The synthetic family that stands for a source's model_type (naming and config fields)
FAMILY = {
    "gpt_oss": "gpt-oss",
    "deepseek_v3": "deepseek-v3",
    "deepseek_v2": "deepseek-v3",
    "kimi_k2": "deepseek-v3",
    "mixtral": "mixtral",
    "nemotron_h": "nemotron-h",  # non-gated experts
}
EXPERTS = 2


# The servers a proof runs on: (the module that must import, its name, how to install it)
SERVERS = {
    "vllm": ("vllm", "vLLM", "pip install vllm"),
    "sglang": ("sglang", "SGLang", 'pip install "sglang[all]"'),
}


class ProofError(Exception):
    """The proof could not run on this server release (a hook it needs is missing)."""


class ServerNotInstalled(FiConvertError):
    """The server whose release is to be proven is not installed here."""


def prove_output(
    out_dir: str | Path, server: str, *, ranks: list[int] | None = None, cache: bool = True
) -> Proof:
    """`fi-convert verify OUT --server NAME`: the load-time proof of the installed release of
    `server` on the output's layer shapes (every TP rank unless `ranks`)."""
    from ..format import manifest as mf
    from ..format.names import servers_of

    m = mf.read(out_dir)
    module, label, install = SERVERS[server]
    if server not in servers_of(m):
        first = servers_of(m)[0]
        raise ManifestError(
            f"{out_dir}: converted for {first}, whose layouts differ from {label}'s; prove it "
            f"with --server {first}"
        )
    bad = [r for r in ranks or () if not 0 <= r < m["tp_size"]]
    if bad:
        raise ManifestError(
            f"{out_dir}: converted for tensor-parallel size {m['tp_size']}, which has no rank "
            f"{bad[0]}; pass --rank 0 to {m['tp_size'] - 1}"
        )
    if importlib.util.find_spec(module) is None:
        raise ServerNotInstalled(
            f"{label} is not installed here, so no release of it can be proven; install it "
            f"beside fi-convert ({install}) or run this where it serves"
        )
    proof = importlib.import_module(f"fi_convert.servers.{server}.proof")
    return proof.prove_installed(m, ranks=ranks, cache=cache)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Shape:
    """One distinct layer shape of an output: what a layer's bytes depend on, besides its
    values and its expert count."""

    scheme: str
    backend: str
    tp_size: int
    family: str
    hidden: int
    intermediate: int
    config: tuple[tuple[str, float], ...]  # config.json fields the server's layer reads
    entry: str  # the layer's manifest entry, expert counts left out (JSON)
    layers: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return (
            f"{self.scheme}/{self.backend} H {self.hidden} I {self.intermediate} TP {self.tp_size}"
        )

    def key(self) -> dict:
        return {
            "scheme": self.scheme,
            "backend": self.backend,
            "tp_size": self.tp_size,
            "family": self.family,
            "hidden": self.hidden,
            "intermediate": self.intermediate,
            "config": dict(self.config),
            "entry": json.loads(self.entry),
        }


# Layer entry fields that name experts (their count, which experts have a property): the
# stand-in's two experts have their own (`Spec`: the last expert's NVFP4 gate and up scales
# differ, as in the tests), so both cases go through the server's processing.
PER_EXPERT = ("num_experts", "w13_scale_2_differs_for_experts")
# ... and where the values came from, which the layout does not depend on (a BF16 source
# quantized to MXFP8 is laid out as a ModelOpt MXFP8 one, the proof's source)
PROVENANCE = ("source_format",)


def normalized_entry(entry: Mapping) -> str:
    """A layer's manifest entry without what the experts change (PER_EXPERT, the leading
    dimension of each tensor's shape) or where its values came from (PROVENANCE): the same for
    the two-expert stand-in."""
    out = {k: v for k, v in entry.items() if k not in PER_EXPERT + PROVENANCE}
    out["tensors"] = {
        name: {**t, "shape_per_rank": t["shape_per_rank"][1:]}
        for name, t in entry["tensors"].items()
    }
    return json.dumps(out, sort_keys=True)


def shapes(manifest: Mapping) -> list[Shape]:
    """The output's distinct layer shapes, in the order of their first layer."""
    source = manifest.get("source") or {}
    family = FAMILY.get(str(source.get("model_type")), "qwen3-moe")
    found: dict[str, Shape] = {}
    for prefix, lay in manifest["layers"].items():
        config = (("swiglu_limit", lay["swiglu_limit"]),) if "swiglu_limit" in lay else ()
        entry = normalized_entry(lay)
        if entry in found:
            s = found[entry]
            found[entry] = Shape(**{**vars(s), "layers": (*s.layers, prefix)})
            continue
        found[entry] = Shape(
            manifest["scheme"],
            manifest["backend"],
            manifest["tp_size"],
            family,
            lay["hidden_size"],
            lay["intermediate_size"],
            config,
            entry,
            (prefix,),
        )
    return list(found.values())


@dataclass
class Row:
    """One shape's proof on one rank."""

    shape: str
    layers: int
    rank: int
    tensors: int = 0
    result: str = "proven"  # proven, cached, differs, cannot run
    seconds: float = 0.0
    tensor: str | None = None  # the first tensor that differs
    where: str | None = None  # where it differs first, or why the proof cannot run

    @property
    def ok(self) -> bool:
        return self.result in ("proven", "cached")

    def as_dict(self) -> dict:
        return dict(vars(self))


@dataclass
class Proof:
    """A proof of one server release on an output's shapes."""

    server: str
    release: str
    device: str
    rows: list[Row] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rows)

    def first_failure(self) -> Row | None:
        return next((r for r in self.rows if not r.ok), None)

    def as_dict(self) -> dict:
        return {
            "server": self.server,
            "release": self.release,
            "device": self.device,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "shapes": [r.as_dict() for r in self.rows],
        }

    def line(self, label: str) -> str:
        """The plugin's log line of a passed proof."""
        shapes = len({r.shape for r in self.rows})
        cached = sum(r.result == "cached" for r in self.rows)
        how = f", {cached} from the cache" if cached else ""
        return (
            f"fi-convert: {label} {self.release} is not a release this output lists; its own MoE "
            f"processing proven on the output's {shapes} layer shape"
            f"{'s' if shapes != 1 else ''} (rank {self.rows[0].rank if self.rows else 0}, "
            f"{self.device}{how}) in {self.seconds:.1f} s: every tensor equals fi-convert's"
        )


# run(shape, source checkpoint, layer prefix, rank, names): what the server holds, by the output
# tensor names `names` (None for a tensor it does not hold)
Run = Callable[[Shape, Path, str, int, list[str]], dict[str, torch.Tensor | None]]


def prove(
    manifest: Mapping,
    *,
    server: str,
    release: str,
    ranks: list[int],
    run: Run,
    cache: bool = True,
) -> Proof:
    """Prove `release` of `server` on each of the output's shapes, for each rank of `ranks`;
    stops at the first shape that differs."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    proof = Proof(server, release, device)
    for shape in shapes(manifest):
        for rank in ranks:
            row = _prove_one(shape, server, release, rank, run, cache, device)
            proof.rows.append(row)
            if not row.ok:
                return proof
    return proof


def _prove_one(
    shape: Shape, server: str, release: str, rank: int, run: Run, cache: bool, device: str
) -> Row:
    row = Row(shape.label, len(shape.layers), rank)
    t0 = time.perf_counter()
    key = _cache_key(shape, server, release, rank, device)
    if cache and (hit := read_cached(key)) is not None:
        row.result, row.tensors = "cached", hit
        row.seconds = time.perf_counter() - t0
        return row
    ours: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory(prefix="fi-convert-proof-") as tmp:
        try:
            src, out = _convert(shape, server, Path(tmp))
            ours, prefix = our_tensors(out, rank)
            theirs = run(shape, src, prefix, rank, list(ours))
        except ProofError as e:
            row.result, row.where = "cannot run", str(e)
        except FiConvertError as e:  # this fi-convert no longer converts such a layer
            row.result, row.where = "cannot run", f"fi-convert's conversion of it: {e}"
    row.tensors = len(ours)
    if row.result == "proven":
        diff = first_difference(ours, theirs)
        if diff is not None:
            row.result, (row.tensor, row.where) = "differs", diff
    row.seconds = time.perf_counter() - t0
    if cache and row.result == "proven":
        write_cached(key, row.tensors)
    return row


def _convert(shape: Shape, server: str, root: Path) -> tuple[Path, Path]:
    """The two-expert source of `shape` and fi-convert's output of it for `server`."""
    from .. import Backend, Options, SchemeName, convert
    from ..testing.synthetic import Spec, write_checkpoint

    spec = Spec(
        shape.family,
        layers=1,
        dense_layers=0,
        experts=EXPERTS,
        hidden=shape.hidden,
        intermediate=shape.intermediate,
        shards=1,
        quant=SOURCE_QUANT[shape.scheme],
        config=dict(shape.config),
        moe_only=True,
    )
    src = write_checkpoint(root / "source", spec)
    opts = Options(
        scheme=SchemeName(shape.scheme),
        backend=Backend(shape.backend),
        tp_size=shape.tp_size,
        server=server,
    )
    out = root / "output"
    convert(src, out, opts, device="cpu", fsync=False)
    entry = next(iter(_manifest(out)["layers"].values()))
    if normalized_entry(entry) != shape.entry:
        raise ProofError(
            "this fi-convert lays the layer out otherwise than the output's manifest says "
            "(converted by another fi-convert version?)"
        )
    return src, out


def _manifest(out: Path) -> dict:
    from ..format import manifest as mf

    return mf.read(out)


def our_tensors(out: Path, rank: int) -> tuple[dict[str, torch.Tensor], str]:
    """fi-convert's tensors of the output's one layer for `rank`, and the layer's prefix."""
    from ..format.reader import OutputReader

    with OutputReader(out) as reader:
        prefix = next(iter(reader.manifest["layers"]))
        ours = {}
        for name in reader.layer(prefix)["tensors"]:
            _, shape, dtype = reader.info(prefix, name)
            ours[name] = torch.empty(shape, dtype=dtype)
            reader.read_into(prefix, name, rank, ours[name])
    return ours, prefix


def first_difference(
    ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor | None]
) -> tuple[str, str] | None:
    """The first tensor (in the output's order) whose bytes differ from the server's, and
    where: (name, what differs); None when every tensor is equal."""
    for name, t in ours.items():
        other = theirs.get(name)
        why = _differs(t, other)
        if why is not None:
            return name, why
    return None


def _differs(ours: torch.Tensor, theirs: torch.Tensor | None) -> str | None:
    if theirs is None:
        return "the server holds no such tensor"
    theirs = theirs.detach().cpu()
    # a server may view UE8M0 scale bytes as float8_e4m3fn for its kernel: the same bytes
    same_kind = theirs.dtype == ours.dtype or theirs.dtype.itemsize == ours.dtype.itemsize
    if not same_kind or theirs.numel() != ours.numel():
        return (
            f"the server holds {theirs.dtype} {tuple(theirs.shape)}, fi-convert "
            f"{ours.dtype} {tuple(ours.shape)}"
        )
    a = ours.contiguous().view(-1).view(torch.uint8)
    b = theirs.contiguous().view(-1).view(torch.uint8)
    if torch.equal(a, b):
        return None
    unequal = a != b
    element = int(torch.nonzero(unequal)[0]) // ours.dtype.itemsize
    index = list(torch.unravel_index(torch.tensor(element), ours.shape))
    count = int(unequal.view(-1, ours.dtype.itemsize).any(dim=1).sum())
    return f"first at index {[int(i) for i in index]} ({count} of {ours.numel()} elements differ)"


# ---------------------------------------------------------------- the cache of passed proofs


def _cache_key(shape: Shape, server: str, release: str, rank: int, device: str) -> dict:
    return {
        "server": server,
        "release": release,
        "fi_convert_version": __version__,
        "rank": rank,
        "device": device,
        "shape": shape.key(),
    }


def _cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_root() / "proofs" / f"{key['server']}-{key['release']}" / f"{digest}.json"


def read_cached(key: dict) -> int | None:
    """The tensor count of a passed proof of `key`, or None: no entry, or one that is not
    exactly this key's record (damaged, or written by another fi-convert), is not trusted."""
    try:
        rec = json.loads(_cache_path(key).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or rec.get("result") != "proven":
        return None
    tensors = rec.get("tensors")
    return tensors if isinstance(tensors, int) and tensors > 0 else None


def write_cached(key: dict, tensors: int) -> None:
    """Record a passed proof (atomically; a cache that cannot be written is skipped)."""
    rec = {"key": key, "result": "proven", "tensors": tensors}
    write_atomic(_cache_path(key), json.dumps(rec, sort_keys=True).encode())
