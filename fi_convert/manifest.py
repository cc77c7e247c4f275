"""The manifest as the converter builds and writes it, and the checks of its content that
`verify` runs. Reading a manifest and checking its form is the format's
(`fi_convert.format.manifest`), which servers use without the converter.

It is written last. It holds no timestamps and no absolute paths, so two runs of the same
conversion give the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from .errors import FiConvertError
from .families import FAMILY_FILE, all_families, check_family, served_architectures
from .format.manifest import SOURCE_ARCHITECTURES as ARCHITECTURES
from .format.manifest import source_architectures as recorded
from .format.names import (
    DEFAULT_SERVER,
    FORMAT,
    FORMAT_VERSION,
    INDEX_NAME,
    MANIFEST_NAME,
    SERVER_FIELD,
    SERVERS_FIELD,
    TARGETS_FIELD,
)
from .names import Backend
from .plan import Plan
from .schemes import REGISTRY
from .server_lookup import of_manifest, resolve
from .st_io import TMP_SUFFIX
from .target import ServerTarget, release_fields
from .version import __version__


def target_fields(
    server: ServerTarget,
    scheme: str,
    backend: str,
    layers: Mapping,
    architectures: list[str] | None = None,
) -> dict:
    """A server's `target`: the releases an output's bytes are (those proven for its layers'
    sizes among them, and with a model class for its source's `architectures`), and where it
    runs them."""
    return {
        **server.versions,
        **release_fields(server, scheme, backend, layers, architectures),
        "gpu_family": server.gpu_family(backend, scheme),
    }


def _accepted_targets(server: ServerTarget, m: dict) -> list[dict]:
    """The targets `verify` accepts for the output: this fi-convert's, and any a server lists
    as what older fi-convert releases wrote (`former_targets`)."""
    scheme, backend = str(m.get("scheme")), str(m.get("backend"))
    gpu = {"gpu_family": server.gpu_family(backend, scheme)}
    return [target_fields(server, scheme, backend, m["layers"], recorded(m))] + [
        {**t, **gpu} for t in getattr(server, "former_targets", ())
    ]


def build(plan: Plan, files: dict[str, dict]) -> dict:
    layers = plan.summary()["layers"]
    scheme, backend, server = plan.scheme.value, plan.options.backend.value, plan.target
    archs = served_architectures(plan.ckpt.config)
    several = {}
    if len(plan.options.targets) > 1:
        several = {
            SERVERS_FIELD: list(plan.options.server_names),
            TARGETS_FIELD: {
                t.name: target_fields(t, scheme, backend, layers, archs)
                for t in plan.options.targets
            },
        }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "fi_convert_version": __version__,
        "scheme": scheme,
        "backend": backend,
        "tp_size": plan.options.tp_size,
        SERVER_FIELD: server.name,
        **several,
        "target": target_fields(server, scheme, backend, layers, archs),
        "expert_parallel": server.ep_note(scheme, layers),
        "source": {
            "model_type": plan.ckpt.model_type,
            ARCHITECTURES: archs,
            "family": plan.family.name,
            **family_fields(plan),
            "fingerprint": plan.ckpt.fingerprint,
            "shards": len(plan.ckpt.shards),
            **plan.provenance,
        },
        "layers": layers,
        "files": {k: files[k] for k in sorted(files)},
    }


def family_fields(plan: Plan) -> dict:
    """The manifest's record of the source's family: its routing method and activation, and
    a user's family file (`--family`) whole, so that `verify` reads the output by it."""
    moe = plan.moe()
    own = {FAMILY_FILE: plan.family.source} if plan.family.own else {}
    return {"routing": moe["routing"], "activation": moe["activation"], **own}


def provenance(repo_id: str | None, commit: str | None, plan: Plan) -> dict:
    """The manifest's record of where a conversion's source came from (`Plan.provenance`): for
    a Hub repo, its id and the exact commit, and the command that converts it (local paths
    never appear); nothing for a local folder."""
    if repo_id is None:
        return {}
    o = plan.options
    cmd = f"fi-convert {repo_id} OUT_DIR --revision {commit} --scheme {plan.scheme.value} "
    cmd += f"--backend {o.backend.value} --tp-size {o.tp_size}"
    if o.server != DEFAULT_SERVER:
        cmd += f" --server {o.server}"
    if o.max_shard_bytes:
        cmd += f" --max-shard-size {o.max_shard_bytes}"
    return {"repo_id": repo_id, "revision": commit, "command": cmd}


def write(out_dir: Path, manifest: dict) -> None:
    path = out_dir / MANIFEST_NAME
    tmp = path.with_name(path.name + TMP_SUFFIX)
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- content, for `verify`

# Top-level fields every manifest has (`build`).
FIELDS = (
    "format",
    "format_version",
    "fi_convert_version",
    "scheme",
    "backend",
    "tp_size",
    "target",
    "expert_parallel",
    "source",
    "layers",
    "files",
)
# The values a tensor entry's keys can take, over all schemes and backends (docs/FORMAT.md).
TENSOR_VALUES: dict[str, tuple] = {
    "dtype": ("BF16", "F16", "F32", "F8_E4M3", "U8"),
    "layout": (
        "BlockMajorK",
        "MajorK",
        "row_major_blocks",
        "swizzled_128x4",
        "per_expert",
        "scalar",
        "rows",
        "sm90_mixed_interleave",
        "sm90_scale_fold_64x128",
    ),
    "epilogue_tile_m": (128, 64, None),
    "block_k_bytes": (128, None),
    "row_order": ("up_gate", "up_gate_pairs", "gate_up", "up", "rows", None),
    "gated_interleave": (True, False),
    "packing": ("e2m1x2",),
    "rank0_only": (True,),
    "formula": ("sglang",),
}
# ... and a layer entry's keys that have a closed set of values
LAYER_VALUES: dict[str, tuple] = {
    "activation_scheme": ("static", "dynamic"),
    "gated": (False,),
    "source_format": tuple(f for s in REGISTRY.values() for f in s.source_formats),
}
_HEX = frozenset("0123456789abcdef")


def same(a: object, b: object) -> bool:
    """JSON values equal in type too: `true` is not `1`, `128.0` is not `128`."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def show(v: object, limit: int = 80) -> str:
    """A value as the manifest writes it (JSON), shortened."""
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_hex(v: object, n: int = 64) -> bool:
    return isinstance(v, str) and len(v) == n and set(v) <= _HEX


def check_fields(m: dict) -> list[str]:
    """What in the manifest's own fields (all but `layers`, which `verify` re-plans) is not a
    value this fi-convert writes: one line per field, `[]` when all are. `m` passed `read`."""
    out: list[str] = []

    def bad(field: str, value: object, want: str) -> None:
        out.append(f"{field} is {show(value)}, {want}")

    try:
        server = of_manifest(m)
    except FiConvertError as e:  # a server this fi-convert does not know: checked as vLLM's
        bad(SERVER_FIELD, m.get(SERVER_FIELD), str(e))
        server = resolve(DEFAULT_SERVER)
    if SERVER_FIELD in m and not isinstance(m[SERVER_FIELD], str):
        bad(SERVER_FIELD, m[SERVER_FIELD], "not a server's name")
    others = _several_problems(m, server.name)
    out += others

    out += [f"{key!r} is missing" for key in FIELDS if key not in m]
    if type(m.get("format_version")) is not int:
        bad("format_version", m.get("format_version"), f"not the integer {FORMAT_VERSION}")
    version = m.get("fi_convert_version")
    if not (isinstance(version, str) and version):
        bad("fi_convert_version", version, "not a version string")
    names = {s.value: s for s in REGISTRY}
    scheme, backend = names.get(m["scheme"]), {b.value: b for b in Backend}.get(m["backend"])
    if scheme is None:
        bad("scheme", m["scheme"], f"not a scheme ({', '.join(names)})")
    if backend is None:
        bad("backend", m["backend"], f"not a backend ({', '.join(b.value for b in Backend)})")
    elif scheme is not None and backend not in REGISTRY[scheme].backends:
        have = ", ".join(b.value for b in REGISTRY[scheme].backends)
        bad("backend", m["backend"], f"which scheme {scheme.value} has not (it has {have})")
    if scheme is not None and backend is not None:
        refused = server.refuses(scheme.value, backend.value)
        if refused:
            bad("scheme", m["scheme"], f"with backend {backend.value} for {server.name}: {refused}")
        wants = _accepted_targets(server, m)
        since = release_fields(server, scheme.value, backend.value, m["layers"], recorded(m))
        target = m.get("target")
        # an older fi-convert's target is checked as such; else this one's, field by field
        want = next((w for w in wants[1:] if same(target, w)), wants[0])
        if not isinstance(target, dict):
            bad("target", target, f"not {show(want)}")
        else:
            for key in sorted(set(want) | set(target)):
                if key not in target and key in since:
                    continue  # written since: an older output's plugin derives it (FORMAT.md)
                if key not in target:
                    out.append(f"target.{key} is missing ({show(want[key])})")
                elif key not in want:
                    out.append(f"target.{key} is not a field of the target")
                elif not same(target[key], want[key]):
                    bad(
                        f"target.{key}",
                        target[key],
                        f"{scheme.value}/{backend.value} needs {show(want[key])}",
                    )
    note = server.ep_note(m["scheme"], m["layers"])
    former = getattr(server, "former_ep_notes", ())  # what older fi-convert releases wrote
    if not same(m.get("expert_parallel"), note) and m.get("expert_parallel") not in former:
        bad("expert_parallel", m.get("expert_parallel"), f"the layers give {show(note)}")
    out += _source_problems(m.get("source"))
    for name, meta in m["files"].items():
        if not is_hex(meta["sha256"]):
            bad(f"files[{name!r}].sha256", meta["sha256"], "not a lowercase hex SHA-256")
    if INDEX_NAME not in m["files"]:
        out.append(f"files does not list {INDEX_NAME}")
    if not m["layers"]:
        out.append("layers is empty: an output has at least one converted MoE layer")
    return out


def _several_problems(m: dict, first: str) -> list[str]:
    """An output for several servers: `servers` lists two or more known servers, the first
    being `server`, and `targets` holds each one's target (checked with the fields, below)."""
    names, targets = m.get(SERVERS_FIELD), m.get(TARGETS_FIELD)
    if names is None and targets is None:
        return []
    if names is None:
        return [f"{TARGETS_FIELD} is there without {SERVERS_FIELD}"]
    ok = isinstance(names, list) and len(names) >= 2 and len(set(map(str, names))) == len(names)
    if not ok or names[0] != first:
        return [f"{SERVERS_FIELD} is {show(names)}, not two or more servers starting with {first}"]
    if not isinstance(targets, dict) or sorted(targets) != sorted(names):
        return [f"{TARGETS_FIELD} is {show(targets)}, not one target for each of {show(names)}"]
    out = []
    for name in names:
        try:
            server = resolve(name)
        except FiConvertError as e:
            out.append(f"{SERVERS_FIELD} names {show(name)}: {e}")
            continue
        scheme, backend = str(m.get("scheme")), str(m.get("backend"))
        since = release_fields(server, scheme, backend, m["layers"], recorded(m))
        wants = _accepted_targets(server, m)
        got = targets[name]
        if isinstance(got, dict):  # fields written since: an older output lacks them
            wants = [{k: v for k, v in w.items() if k in got or k not in since} for w in wants]
        if not any(same(got, want) for want in wants):
            out.append(f"{TARGETS_FIELD}.{name} is {show(got)}, not {show(wants[0])}")
        refused = server.refuses(str(m.get("scheme")), str(m.get("backend")))
        if refused:
            out.append(f"{SERVERS_FIELD} names {name}, for which {refused}")
    return out


def _source_problems(src: object) -> list[str]:
    if not isinstance(src, dict):
        return [f"source is {show(src)}, not a map"]
    out = []
    mt = src.get("model_type")
    if "model_type" not in src:
        out.append("source.model_type is missing")
    elif mt is not None and not isinstance(mt, str):
        out.append(f"source.model_type is {show(mt)}, not a string or null")
    archs = src.get(ARCHITECTURES)
    if ARCHITECTURES in src and not (
        isinstance(archs, list) and all(isinstance(a, str) for a in archs)
    ):
        out.append(f"source.{ARCHITECTURES} is {show(archs)}, not a list of strings")
    families = [f.name for f in all_families()]
    own = src.get(FAMILY_FILE)
    if own is not None:
        problem = check_family(own)
        if problem:
            out.append(f"source.{FAMILY_FILE}: {problem}")
        else:
            families.append(own["name"])
    if src.get("family") not in families:
        out.append(
            f"source.family is {show(src.get('family'))}, not a family ({', '.join(families)})"
        )
    if not is_hex(src.get("fingerprint")):
        out.append(f"source.fingerprint is {show(src.get('fingerprint'))}, not a hex SHA-256")
    n = src.get("shards")
    if not (type(n) is int and n >= 1):
        out.append(f"source.shards is {show(n)}, not a positive integer")
    # provenance, when the source was a Hub repo: its id, the commit, the command
    if "repo_id" in src and not (isinstance(src["repo_id"], str) and "/" in src["repo_id"]):
        out.append(f"source.repo_id is {show(src['repo_id'])}, not a Hub repo id")
    if "revision" in src and not is_hex(src["revision"], 40):
        out.append(f"source.revision is {show(src['revision'])}, not a commit id")
    if "command" in src and not isinstance(src["command"], str):
        out.append(f"source.command is {show(src['command'])}, not a string")
    return out
