"""The manifest: what an output folder holds, and the proof that it is complete.

It is written last. It holds no timestamps and no absolute paths, so two runs of the same
conversion give the same bytes.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import __version__, jsontext
from .errors import ManifestError
from .families import all_families
from .names import Backend
from .paths import OUTPUT_FIX, denied, exists
from .plan import MANIFEST_NAME, Plan
from .schemes import REGISTRY
from .source import INDEX_NAME
from .st_io import TMP_SUFFIX, sha256_file

FORMAT = "fi-convert"
# 2: nvfp4 g1_scale_c is vLLM's g1_alphas * (1 / a2) and CUTLASS scale_2 are folded;
# target.vllm_versions / flashinfer_versions say which releases the layouts match.
FORMAT_VERSION = 2
HASH_JOBS = 8  # files `check_files` hashes at once, at most
TARGET = {
    "vllm": "0.33.0",
    "flashinfer": "0.7.2.post1",
    "flashinfer_layouts": "0.6.18-0.7.4",
    # PEP 440 specifiers of the releases whose load-time processing gives these bytes: a
    # loader refuses any other (a layout can change in any release, patch releases included)
    "vllm_versions": "==0.33.0",
    "flashinfer_versions": ">=0.6.18,<0.7.5",
}
# Where vLLM 0.33 runs each FlashInfer backend and scheme: TRT-LLM on the SM10x family only
# (is_device_capability_family(100)); CUTLASS (FlashInferExperts._supports_current_device and
# _supports_quant_scheme) on SM90, SM10x and SM12x, never SM11x: block FP8 on SM90 only, NVFP4
# and MXFP4 x MXFP8 on SM100 and later ("sm100+": SM10x, SM12x), BF16 and static per-tensor
# FP8 on SM90 and later ("sm90+": SM90, SM10x, SM12x). vLLM has no CUTLASS MXFP8 path.
GPU_FAMILY = {
    ("trtllm", None): "sm100",
    ("cutlass", "fp8-block"): "sm90",
    ("cutlass", "nvfp4"): "sm100+",
    ("cutlass", "mxfp4"): "sm100+",  # FLASHINFER_CUTLASS_MXFP4_MXFP8
    ("cutlass", None): "sm90+",  # bf16, fp8-tensor
}


def build(plan: Plan, files: dict[str, dict]) -> dict:
    layers = plan.summary()["layers"]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "fi_convert_version": __version__,
        "scheme": plan.scheme.value,
        "backend": plan.options.backend.value,
        "tp_size": plan.options.tp_size,
        "target": {**TARGET, "gpu_family": gpu_family(plan)},
        "expert_parallel": _ep_note(plan.scheme.value, layers),
        "source": {
            "model_type": plan.ckpt.model_type,
            "family": plan.family.name,
            "fingerprint": plan.ckpt.fingerprint,
            "shards": len(plan.ckpt.shards),
            **plan.provenance,
        },
        "layers": layers,
        "files": {k: files[k] for k in sorted(files)},
    }


def _ep_note(scheme: str, layers: dict) -> str:
    # FP8 per-tensor activation scales are a max over experts, which vLLM takes over a rank's
    # local experts under EP; NVFP4 on FlashInfer uses the global max (use_global_sf)
    static = any(lay.get("activation_scheme") == "static" for lay in layers.values())
    if scheme == "fp8-tensor" and static:
        return (
            "EP size 1: activation scales are the max over all experts; under EP vLLM takes "
            "the max over a rank's local experts"
        )
    return "any EP size: ranks take whole experts, whose bytes do not change"


def layer_groups(layers: dict) -> list[tuple[str, int, dict]]:
    """Layers with identical descriptions, in order: (label, how many, description), the label
    naming the first and last prefix of the group."""
    groups: dict[str, list[str]] = {}
    for prefix, lay in layers.items():
        groups.setdefault(json.dumps(lay, sort_keys=True), []).append(prefix)
    return [
        (p[0] if len(p) == 1 else f"{p[0]} ... {p[-1]}", len(p), json.loads(key))
        for key, p in groups.items()
    ]


def gpu_family(plan: Plan) -> str:
    return gpu_family_of(plan.options.backend.value, plan.scheme.value)


def gpu_family_of(backend: str, scheme: str) -> str:
    return GPU_FAMILY.get((backend, scheme)) or GPU_FAMILY[(backend, None)]


def write(out_dir: Path, manifest: dict) -> None:
    path = out_dir / MANIFEST_NAME
    tmp = path.with_name(path.name + TMP_SUFFIX)
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(out_dir: str | Path) -> dict:
    """Read and sanity-check the manifest of a finished conversion."""
    path = Path(out_dir) / MANIFEST_NAME
    if not exists(path, ManifestError, OUTPUT_FIX):
        raise ManifestError(
            f"{path}: no manifest, so {out_dir} is not a finished fi-convert output; "
            "run (or resume) the conversion first"
        )
    try:
        m = jsontext.loads(path.read_text())
    except PermissionError as e:
        raise ManifestError(denied(path, e, OUTPUT_FIX)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: unreadable ({e}); run the conversion again") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ManifestError(f"{path}: not an fi-convert manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise ManifestError(
            f"{path}: format version {m.get('format_version')}, this fi-convert reads "
            f"{FORMAT_VERSION}; convert again with this version or use a matching fi-convert"
        )
    bad = _malformed(m)
    if bad:
        raise ManifestError(f"{path}: {bad}; the manifest is damaged, convert again")
    return m


def _malformed(m: dict) -> str | None:
    """What in the manifest does not have the form readers rely on (None when it does)."""

    def is_int(v: object, low: int = 0) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    for key, kind in (("scheme", str), ("backend", str), ("layers", dict), ("files", dict)):
        if not isinstance(m.get(key), kind):
            return f"{key!r} is missing or not a {kind.__name__}"
    if not is_int(m.get("tp_size"), 1):
        return "'tp_size' is missing or not a positive integer"
    for name, meta in m["files"].items():
        sha = meta.get("sha256") if isinstance(meta, dict) else None
        if not (isinstance(sha, str) and len(sha) == 64) or not is_int(meta.get("size")):
            return f"file entry {name!r} has no sha256 and size"
    for prefix, lay in m["layers"].items():
        tensors = lay.get("tensors") if isinstance(lay, dict) else None
        if not isinstance(tensors, dict) or not tensors:
            return f"layer {prefix!r} has no tensors"
        for key in ("padded_hidden_size", "padded_intermediate_size_per_rank", "num_experts"):
            if not is_int(lay.get(key), 1):
                return f"layer {prefix!r}: {key!r} is missing or not a positive integer"
        for pname, t in tensors.items():
            shape = t.get("shape_per_rank") if isinstance(t, dict) else None
            if not isinstance(t.get("dtype") if isinstance(t, dict) else None, str) or not (
                isinstance(shape, list) and all(is_int(d) for d in shape)
            ):
                return f"tensor {prefix}.{pname} has no dtype and shape_per_rank"
    return None


def check_files(out_dir: str | Path, manifest: dict) -> list[str]:
    """Problems with the files the manifest lists (empty when all sizes and SHA-256s match).

    Files are hashed several at a time (SHA-256 of one file runs on one core)."""
    root = Path(out_dir)

    def problem(item: tuple[str, dict]) -> str | None:
        p, meta = root / item[0], item[1]
        if bad_path(item[0]):  # never read: it could name any file on the machine
            return f"{root / MANIFEST_NAME}: files lists {item[0]!r}, {bad_path(item[0])}"
        if not p.is_file():
            return f"{p}: missing"
        if p.stat().st_size != meta["size"]:
            return f"{p}: {p.stat().st_size} bytes, manifest says {meta['size']}"
        if sha256_file(p) != meta["sha256"]:
            return f"{p}: SHA-256 differs from the manifest"
        return None

    jobs = min(HASH_JOBS, len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(jobs, thread_name_prefix="fi-convert-verify") as pool:
        found = list(pool.map(problem, manifest["files"].items()))
    return [p for p in found if p is not None]


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
    ),
    "epilogue_tile_m": (128, 64, None),
    "block_k_bytes": (128, None),
    "row_order": ("up_gate", "up_gate_pairs", "rows", None),
    "gated_interleave": (True, False),
    "packing": ("e2m1x2",),
    "rank0_only": (True,),
}
# ... and a layer entry's keys that have a closed set of values
LAYER_VALUES: dict[str, tuple] = {
    "activation_scheme": ("static", "dynamic"),
    "source_format": (
        "fp8 per-tensor",
        "bf16, quantized per tensor",
        "mxfp8",
        "bf16, quantized (OCP MX, E4M3 + UE8M0 per 32)",
    ),
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


def bad_path(name: str) -> str | None:
    """Why `name` cannot be a file of an output folder (None when it can): a relative POSIX
    path below the folder, no part hidden or empty, neither the manifest nor the state folder."""
    parts = name.split("/")
    if not name or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
        return "not a relative path inside the folder"
    if any(p.startswith(".") for p in parts):
        return "a hidden path, which fi-convert never writes"
    if name == MANIFEST_NAME:
        return "the manifest itself, which lists no hash of itself"
    return None


def check_fields(m: dict) -> list[str]:
    """What in the manifest's own fields (all but `layers`, which `verify` re-plans) is not a
    value this fi-convert writes: one line per field, `[]` when all are. `m` passed `read`."""
    out: list[str] = []

    def bad(field: str, value: object, want: str) -> None:
        out.append(f"{field} is {show(value)}, {want}")

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
        want = {**TARGET, "gpu_family": gpu_family_of(backend.value, scheme.value)}
        target = m.get("target")
        if not isinstance(target, dict):
            bad("target", target, f"not {show(want)}")
        else:
            for key in sorted(set(want) | set(target)):
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
    note = _ep_note(m["scheme"], m["layers"])
    if not same(m.get("expert_parallel"), note):
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


def _source_problems(src: object) -> list[str]:
    if not isinstance(src, dict):
        return [f"source is {show(src)}, not a map"]
    out = []
    mt = src.get("model_type")
    if "model_type" not in src:
        out.append("source.model_type is missing")
    elif mt is not None and not isinstance(mt, str):
        out.append(f"source.model_type is {show(mt)}, not a string or null")
    families = [f.name for f in all_families()]
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
