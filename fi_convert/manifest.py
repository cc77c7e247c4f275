"""The manifest: what an output folder holds, and the proof that it is complete.

It is written last. It holds no timestamps and no absolute paths, so two runs of the same
conversion give the same bytes.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import __version__
from .errors import ManifestError
from .plan import MANIFEST_NAME, Plan
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
# Where vLLM 0.33 runs each FlashInfer backend (its flashinfer_cutlass_moe.py, oracle/*.py).
GPU_FAMILY = {
    ("trtllm", None): "sm100",
    ("cutlass", "fp8-block"): "sm90",
    ("cutlass", "nvfp4"): "sm100",
    ("cutlass", "mxfp4"): "sm100",  # FLASHINFER_CUTLASS_MXFP4_MXFP8
    ("cutlass", None): "sm90+",
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
    b, s = plan.options.backend.value, plan.scheme.value
    return GPU_FAMILY.get((b, s)) or GPU_FAMILY[(b, None)]


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
    if not path.exists():
        raise ManifestError(
            f"{path}: no manifest, so {out_dir} is not a finished fi-convert output; "
            "run (or resume) the conversion first"
        )
    try:
        m = json.loads(path.read_text())
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
