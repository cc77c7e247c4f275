"""`fi-convert verify org/name`: a published output checked on the Hub, without downloading it.

Every file the manifest lists is checked against the Hub's own metadata: present, of the
listed size, and for LFS files (the shards) with the listed SHA-256, which the Hub records for
each; the small files (manifest, index, config, card) are downloaded and hashed. Files on the
Hub that the manifest does not list are named. The index and the manifest's content are
checked as for a local folder, on the shards' headers read by byte ranges (`remote.mirror`).
With `--source`, a sample of experts (all with `--full`) is re-derived from the source, a
local folder or a Hub repo, and compared with the output: only the bytes those experts
occupy are read, on both sides.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..format import manifest as mf
from ..format.hashes import sha256_file
from ..format.names import MANIFEST_NAME
from ..verify import Report, check_index, check_manifest, check_source
from . import remote

# what a Hub repo holds besides the output: its attributes and fi-convert's progress record
REPO_OWN = {".gitattributes"}


def verify_remote(
    repo_id: str,
    *,
    revision: str | None = None,
    source: str | None = None,
    source_revision: str | None = None,
    full: bool = False,
    against_flashinfer: bool = False,
    device: str = "auto",
) -> tuple[Report, dict]:
    """Verify the output published at `repo_id` (see the module's docstring). Returns the
    report and what was read from the Hub (range requests and bytes, per repo)."""
    out_repo = remote.RemoteRepo.open(repo_id, revision)
    with tempfile.TemporaryDirectory(prefix="fi-convert-verify-") as tmp:
        root = remote.mirror(out_repo, Path(tmp) / "out")
        m = mf.read(root)
        rep = Report()
        rep.problems += _check_files(out_repo, root, m)
        rep.count("files", len(m["files"]))
        for name in sorted(out_repo.files):
            hidden = any(part.startswith(".") for part in name.split("/"))
            if name not in m["files"] and name != MANIFEST_NAME and not hidden:
                rep.unlisted.append(
                    f"{repo_id}/{name}: on the Hub, but the manifest does not list it"
                )
        headers = check_index(root, m, rep)
        check_manifest(root, m, headers, rep)
        rep.problems = [p.replace("\n", "\\n") for p in rep.problems]
        read = {repo_id: out_repo}
        if source is not None and not rep.problems:
            routes: list = [(root, remote.RemoteSourceFiles(out_repo, root))]
            if Path(source).exists():
                src_root = Path(source)
            else:  # the commit the manifest says it was converted from, by default
                if source_revision is None and source == m["source"].get("repo_id"):
                    source_revision = m["source"].get("revision")
                src_repo = remote.RemoteRepo.open(source, source_revision)
                src_root = remote.mirror(src_repo, Path(tmp) / "source")
                routes.append((src_root, remote.RemoteSourceFiles(src_repo, src_root)))
                read[source] = src_repo
            files = remote.RoutedFiles(routes)
            check_source(
                root, m, headers, src_root, full, against_flashinfer, device, rep, files,
                card_replaced=True,  # the Hub's README.md is the model card
            )  # fmt: skip
    return rep, {k: {"requests": r.requests, "bytes": r.bytes_read} for k, r in read.items()}


def _check_files(repo: remote.RemoteRepo, root: Path, m: dict) -> list[str]:
    out = []
    for name, meta in m["files"].items():
        if mf.bad_path(name):
            out.append(f"{repo.repo_id}/{MANIFEST_NAME}: files lists {name!r}, {mf.bad_path(name)}")
            continue
        f = repo.files.get(name)
        where = f"{repo.repo_id}/{name}"
        if f is None:
            out.append(f"{where}: missing on the Hub")
        elif f.size != meta["size"]:
            out.append(f"{where}: {f.size} bytes on the Hub, manifest says {meta['size']}")
        elif f.sha256 is not None:
            if f.sha256 != meta["sha256"]:
                out.append(f"{where}: SHA-256 on the Hub differs from the manifest")
        elif not (root / name).is_file() or sha256_file(root / name) != meta["sha256"]:
            out.append(f"{where}: SHA-256 differs from the manifest")
    return out
