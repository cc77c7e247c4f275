"""A published fi-convert output as a server's model: a repo id resolved to a local snapshot.

What both server plugins call when `--model-path` / `vllm serve` names a Hub repo id instead of
a folder: the manifest first (a repo without one is not an fi-convert output), then exactly the
files it lists (shards, index, config.json, tokenizer and the other small files carried over),
at the manifest's commit, into the Hugging Face cache (or the server's download folder), or
taken from there when offline (HF_HUB_OFFLINE=1). Nothing else the repo holds comes down (a
model card, other revisions' files). Every failure is a one-line `HubError` naming the repo and
the fix. Imports nothing of the converter (a server imports it).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import FiConvertError, HubError
from ..format import manifest as mf
from ..format.names import MANIFEST_NAME
from ..version import __version__
from .common import LIBRARY, cache_dir, endpoint, is_offline, is_repo_id, literal
from .download import download_errors

NOT_AN_OUTPUT_FIX = (
    "serve a repo that `fi-convert push` published (or its folder), or serve the source "
    "checkpoint with the server's own loader"
)


def fetch_output(
    repo_id: str,
    *,
    revision: str | None = None,
    cache: str | None = None,
    manifest_only: bool = False,
) -> Path:
    """The local snapshot of the output published at `repo_id` (see the module's docstring).

    `revision`: a branch, tag or commit (None: the default branch); `cache`: the cache folder
    (None: the user's Hugging Face cache); `manifest_only`: fetch the manifest alone (what a
    launcher checks before it starts anything)."""
    if not is_repo_id(repo_id):
        raise HubError(
            f"{repo_id}: no such folder, and not a Hub repo id (org/name); pass the output "
            "folder or the repo id it was published to"
        )
    snap = _manifest_snapshot(repo_id, revision, cache)
    manifest = _read_manifest(repo_id, snap)
    if not manifest_only:
        _fetch_files(repo_id, revision, snap, manifest, cache)
    return snap


def _kwargs(cache: str | None) -> dict:
    return {
        "repo_type": "model",
        "cache_dir": cache,
        "endpoint": endpoint(),
        "local_files_only": is_offline(),
        "library_name": LIBRARY,
        "library_version": __version__,
    }


def _manifest_snapshot(repo_id: str, revision: str | None, cache: str | None) -> Path:
    """The snapshot folder (named by its commit) holding the repo's manifest."""
    from huggingface_hub import errors as he
    from huggingface_hub import hf_hub_download

    with download_errors(repo_id, revision, is_offline(), cache):
        try:
            got = hf_hub_download(repo_id, MANIFEST_NAME, revision=revision, **_kwargs(cache))
        except he.RemoteEntryNotFoundError:
            at = f" at revision {revision}" if revision else ""
            raise HubError(
                f"{repo_id}: not an fi-convert output (the repo holds no {MANIFEST_NAME}{at}); "
                f"{NOT_AN_OUTPUT_FIX}"
            ) from None
    return Path(got).parent


def _read_manifest(repo_id: str, snap: Path) -> dict:
    try:
        return mf.read(snap)
    except FiConvertError as e:
        raise HubError(f"{repo_id} (commit {snap.name[:12]}): {e}") from None


def _listed(manifest: dict) -> list[str]:
    """The files the manifest lists, but for names no output may hold (never fetched: the
    reader refuses such a manifest)."""
    return sorted(n for n in manifest["files"] if mf.bad_path(n) is None)


def _fetch_files(
    repo_id: str, revision: str | None, snap: Path, manifest: dict, cache: str | None
) -> None:
    """The files `manifest` lists, at its commit (the snapshot's name)."""
    from huggingface_hub import snapshot_download

    names = _listed(manifest)
    commit, offline = snap.name, is_offline()
    with download_errors(repo_id, revision, offline, cache):
        snapshot_download(
            repo_id, revision=commit, allow_patterns=[literal(n) for n in names], **_kwargs(cache)
        )
    missing = [n for n in names if not (snap / n).is_file()]
    if not missing:
        return
    if offline:  # (a huggingface_hub without IncompleteSnapshotError gets here)
        raise HubError(
            f"{repo_id}: the cached copy in {cache or cache_dir()} lacks {missing[0]} "
            f"({len(missing)} of the manifest's files missing) and HF_HUB_OFFLINE=1 forbids "
            f"downloading them; run without HF_HUB_OFFLINE, or `hf download {repo_id}` first"
        )
    raise HubError(
        f"{repo_id}: the manifest at commit {commit[:12]} lists {missing[0]}, which the repo "
        f"does not hold ({len(missing)} missing); the output is incomplete - push it again "
        "(`fi-convert push` resumes)"
    )
