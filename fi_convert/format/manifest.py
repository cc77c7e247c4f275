"""Reading an fi-convert manifest and checking its form, and the files it lists: what a
server needs before it reads an output's tensors, without the converter."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import jsontext
from ..errors import ManifestError
from ..paths import OUTPUT_FIX, denied, exists
from ..version import __version__
from .hashes import sha256_file
from .keys import unknown_keys
from .names import FORMAT, FORMAT_VERSION, MANIFEST_NAME

HASH_JOBS = 8  # files `check_files` hashes at once, at most


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
        raise ManifestError(_other_format(path, m))
    unknown = unknown_keys(m)
    if unknown:
        raise ManifestError(_unknown_key(path, m, unknown[0]))
    bad = _malformed(m)
    if bad:
        raise ManifestError(f"{path}: {bad}; the manifest is damaged, convert again")
    return m


def _writer(m: dict) -> str:
    v = m.get("fi_convert_version")
    return f"fi-convert {v}" if isinstance(v, str) and v else "an fi-convert of unknown version"


def _newer(m: dict) -> bool:
    """Whether the manifest says a newer fi-convert than this one wrote it."""
    try:
        return Version(str(m.get("fi_convert_version"))) > Version(__version__)
    except InvalidVersion:
        return False


def _other_format(path: Path, m: dict) -> str:
    fv = m.get("format_version")
    if type(fv) is int and fv > FORMAT_VERSION:
        return (
            f"{path}: format version {fv}, written by {_writer(m)}; this fi-convert "
            f"({__version__}) reads format version {FORMAT_VERSION}: upgrade fi-convert to "
            "read it"
        )
    return (
        f"{path}: format version {fv}, this fi-convert reads {FORMAT_VERSION}; convert again "
        "with this version or use a matching fi-convert"
    )


def _unknown_key(path: Path, m: dict, key: str) -> str:
    """The line for a key the reader does not know: a newer writer's, or damage."""
    if _newer(m):
        return (
            f"{path}: key {key!r} is not one this fi-convert ({__version__}) knows; "
            f"{_writer(m)}, a newer release, wrote the manifest: upgrade fi-convert to read it"
        )
    return (
        f"{path}: key {key!r} is not one fi-convert writes; the manifest is damaged, convert again"
    )


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


SOURCE_ARCHITECTURES = "architectures"  # source.architectures: config.json's (docs/FORMAT.md)


def source_architectures(m: dict) -> list[str] | None:
    """The source's architectures an output's manifest records (config.json's), or None where
    it records none (fi-convert before the field): its releases are then judged by its layout
    alone."""
    src = m.get("source")
    archs = src.get(SOURCE_ARCHITECTURES) if isinstance(src, dict) else None
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else None


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


def version_in(spec: str, version: str, what: str, root: str, error: type[Exception]) -> bool:
    """Whether the release `version` is in the manifest's PEP 440 range `spec` (prereleases
    too); an unreadable range is `error`, one line naming the output."""
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion, TypeError):
        raise error(
            f"{root}: the manifest's {what} range {spec!r} is unreadable; convert again"
        ) from None
