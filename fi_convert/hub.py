"""The Hugging Face Hub: a repo id as the source, and publishing a finished output folder.

Everything goes through `huggingface_hub` with its defaults: the user's cache (HF_HOME /
HF_HUB_CACHE), the token (HF_TOKEN, or the one `hf auth login` stored; it is never printed),
offline mode (HF_HUB_OFFLINE=1) and the endpoint (HF_ENDPOINT, read when called). Failures
become `HubError`s with one-line messages that name the repo and the fix.

Downloads take only what a conversion reads: the safetensors shards the index names (or the
top-level `*.safetensors` without an index) and the small files beside them; never pickles
(`*.bin`, `*.pt`, ...), other weight formats, or `original/`.

A push uploads exactly the files the manifest lists, then, in a last commit, the model card
(README.md) and the manifest, so that a repo with a manifest is a complete one, as on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from . import manifest as mf
from .errors import HubError, OutputError, SourceError
from .plan import MANIFEST_NAME
from .served_config import serve_command
from .source import INDEX_NAME

CARD_NAME = "README.md"
LIBRARY = "fi-convert"
# Never downloaded: pickles and other weight formats fi-convert does not read, and the
# `original/` folder some repos keep (consolidated checkpoints for other runtimes).
IGNORE_PATTERNS = [
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.pkl",
    "*.pickle",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.onnx_data",
    "*.gguf",
    "*.tflite",
    "*.ot",
    "*.npz",
    "*.npy",
    "original/*",
    ".gitattributes",
]
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
_TRUE = {"1", "ON", "YES", "TRUE"}


def is_repo_id(s: str) -> bool:
    """Whether `s` has the form of a Hub repo id, `org/name`."""
    return bool(_REPO_ID.match(s)) and ".." not in s and "--" not in s and not s.endswith(".git")


@dataclass
class Source:
    """Where a conversion reads from: a local folder, or a Hub repo's snapshot in the cache."""

    path: Path
    repo_id: str | None = None
    revision: str | None = None  # as asked (--revision); None: the default branch
    commit: str | None = None  # the commit the snapshot holds

    def summary(self) -> dict:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}


def resolve_source(
    source: str | Path, *, revision: str | None = None, progress: bool = False
) -> Source:
    """A local folder as it is; a repo id (`org/name`, where no such local path exists) is
    downloaded into the Hugging Face cache first (or taken from it when offline)."""
    path = Path(source)
    if path.exists():
        if revision is not None:
            raise SourceError(
                f"{source}: a local folder, and --revision applies only to a Hub repo id; "
                "drop --revision, or pass the repo id (org/name)"
            )
        return Source(path)
    if not is_repo_id(str(source)):
        raise SourceError(
            f"{source}: no such folder, and not a Hub repo id (org/name); pass a local model "
            "folder or a repo id"
        )
    return download(str(source), revision=revision, progress=progress)


def download(repo_id: str, *, revision: str | None = None, progress: bool = False) -> Source:
    """Download (or find in the cache) what converting `repo_id` needs; the snapshot folder."""
    offline = is_offline()
    kw: dict = {
        "repo_id": repo_id,
        "repo_type": "model",
        "endpoint": endpoint(),
        "local_files_only": offline,
        "library_name": LIBRARY,
        "library_version": __version__,
    }
    from huggingface_hub import snapshot_download

    with _progress_bars(progress), _download_errors(repo_id, revision, offline):
        # 1. the small files (config, tokenizer, index, ...): no weights at all
        snap = Path(
            snapshot_download(
                revision=revision, ignore_patterns=[*IGNORE_PATTERNS, "*.safetensors"], **kw
            )
        )
        commit = snap.name
        # 2. the shards: those the index names, or the top-level ones without an index
        names = _index_shards(snap / INDEX_NAME)
        if names is None:
            allow, ignore = ["*.safetensors"], [*IGNORE_PATTERNS, "*/*"]
        else:
            allow, ignore = [_literal(n) for n in names], IGNORE_PATTERNS
        if allow:
            snap = Path(
                snapshot_download(
                    revision=commit, allow_patterns=allow, ignore_patterns=ignore, **kw
                )
            )
    missing = [n for n in names or [] if not (snap / n).exists()]
    if missing:
        raise HubError(
            f"{repo_id}: {INDEX_NAME} at commit {commit[:12]} names {missing[0]}, which the "
            f"repo does not hold ({len(missing)} missing); the repo is incomplete - ask its "
            "owner, or pick a complete commit with --revision"
        )
    return Source(snap, repo_id, revision, commit)


def _index_shards(index: Path) -> list[str] | None:
    """Shard names of the index, or None without an index (an unreadable index gives []: the
    checkpoint reader reports it)."""
    if not index.is_file():
        return None
    try:
        wm = json.loads(index.read_text()).get("weight_map")
        names = sorted({v for v in wm.values() if isinstance(v, str)})
    except (OSError, ValueError, AttributeError):
        return []
    # names that leave the folder are refused by the checkpoint reader; never fetch them
    return [n for n in names if "/" not in n and "\\" not in n and n not in (".", "..")]


def _literal(name: str) -> str:
    """An fnmatch pattern that matches exactly `name`."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def endpoint() -> str | None:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def is_offline() -> bool:
    from huggingface_hub import constants

    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper()
    return env in _TRUE or bool(constants.HF_HUB_OFFLINE)


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _hub_url(repo_id: str) -> str:
    from huggingface_hub import constants

    return f"{endpoint() or constants.ENDPOINT}/{repo_id}"


@contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    if not show and not was_disabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not show and not was_disabled:
            enable_progress_bars()


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Network failures of whichever HTTP client this huggingface_hub uses."""
    kinds: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for mod, name in (
        ("httpx2", "TransportError"),
        ("httpx", "TransportError"),
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
    ):
        cls = getattr(sys.modules.get(mod), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            kinds.append(cls)
    return tuple(kinds)


def _cause(e: BaseException) -> BaseException:
    """The HTTP error under huggingface_hub's wrappers (an LFS upload raises RuntimeError)."""
    while isinstance(e, RuntimeError) and e.__cause__ is not None:
        e = e.__cause__
    return e


def _status(e: BaseException) -> int | None:
    resp = getattr(e, "response", None)
    return getattr(resp, "status_code", None)


def _brief(e: BaseException) -> str:
    """One short line about `e`: the server's message, or the first line of the error."""
    msg = getattr(e, "server_message", None) or str(e) or type(e).__name__
    line = next((s.strip() for s in str(msg).splitlines() if s.strip()), type(e).__name__)
    return line if len(line) <= 160 else line[:157] + "..."


def _offline_fix(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return f"run without HF_HUB_OFFLINE, or `hf download {repo_id}{rev}` first"


def _not_cached(repo_id: str, revision: str | None) -> str:
    return (
        f"{repo_id}: no such local folder, and not in the Hugging Face cache ({_cache_dir()}), "
        f"which HF_HUB_OFFLINE=1 keeps to; {_offline_fix(repo_id, revision)}"
    )


@contextmanager
def _download_errors(repo_id: str, revision: str | None, offline: bool) -> Iterator[None]:
    from huggingface_hub import errors as he

    incomplete = getattr(he, "IncompleteSnapshotError", None)
    try:
        yield
    except he.OfflineModeIsEnabled:
        raise HubError(_not_cached(repo_id, revision)) from None
    except he.GatedRepoError:
        raise HubError(
            f"{repo_id}: a gated repo; accept its conditions at {_hub_url(repo_id)} and log in "
            "with an account that has access (`hf auth login` or HF_TOKEN)"
        ) from None
    except he.RepositoryNotFoundError:
        raise HubError(
            f"{repo_id}: no such local folder, and no such model repo on the Hub (or it is "
            "private and your token cannot read it); check the name, or log in "
            "(`hf auth login` or HF_TOKEN)"
        ) from None
    except he.RevisionNotFoundError:
        raise HubError(
            f"{repo_id}: no revision {revision!r}; pass an existing branch, tag or commit "
            "with --revision"
        ) from None
    except he.LocalEntryNotFoundError as e:
        if offline and incomplete is not None and isinstance(e, incomplete):
            raise HubError(
                f"{repo_id}: the cached copy in {_cache_dir()} is incomplete and HF_HUB_OFFLINE=1 "
                f"forbids downloading the rest; {_offline_fix(repo_id, revision)}"
            ) from None
        if offline:
            raise HubError(_not_cached(repo_id, revision)) from None
        raise HubError(
            f"{repo_id}: no such local folder, and cannot reach the Hub at {_hub_url(repo_id)} "
            f"({_brief(e)}) to download it; check the network and proxy (or the path), then "
            "run again"
        ) from None
    except he.HfHubHTTPError as e:
        raise HubError(_http_message(repo_id, e, "download")) from None
    except he.HFValidationError as e:
        raise HubError(f"{repo_id}: not a valid Hub repo id ({_brief(e)})") from None
    except _transport_errors() as e:
        raise HubError(
            f"{repo_id}: cannot reach the Hub at {_hub_url(repo_id)} ({type(e).__name__}: "
            f"{_brief(e)}); check the network and proxy, then run again - the files already "
            "downloaded stay in the cache"
        ) from None
    except OSError as e:
        raise HubError(
            f"{repo_id}: cannot store the download in {_cache_dir()} ({e.strerror or _brief(e)}); "
            "free disk space or point HF_HUB_CACHE elsewhere, then run again"
        ) from None


def _http_message(repo_id: str, e: BaseException, doing: str) -> str:
    code = _status(e)
    if code == 401:
        return (
            f"{repo_id}: the Hub refused the token (401 Unauthorized); log in again with "
            "`hf auth login` or set a valid HF_TOKEN"
        )
    if code == 403 and doing == "upload":
        namespace = repo_id.split("/")[0]
        return (
            f"{repo_id}: your token may not write to {namespace} (403 Forbidden); use a token "
            "with write access to it (`hf auth login` or HF_TOKEN)"
        )
    again = (
        "run the same push again - it resumes, skipping what is already uploaded"
        if doing == "upload"
        else "try again later"
    )
    return f"{repo_id}: the Hub answered HTTP {code} during the {doing} ({_brief(e)}); {again}"


# ---- publishing ----


@dataclass
class PushResult:
    repo_id: str
    revision: str
    url: str
    commit: str | None
    files: int
    base_model: str | None

    def summary(self) -> dict:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "url": self.url,
            "commit": self.commit,
            "files": self.files,
            "base_model": self.base_model,
        }


def check_out_dir(out_dir: str | Path) -> dict:
    """The manifest of a finished output that `verify` accepts (files, index, shapes)."""
    from .verify import verify  # verify imports the converter; keep hub light to import

    m = mf.read(out_dir)
    problems = verify(out_dir).problems
    if problems:
        raise OutputError(
            f"{out_dir}: {len(problems)} file(s) do not match {MANIFEST_NAME} (first: "
            f"{problems[0]}); not pushing - run `fi-convert verify {out_dir}` and convert again"
        )
    return m


def push(
    out_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str = "main",
    base_model: str | None = None,
    base_revision: str | None = None,
    progress: bool = False,
) -> PushResult:
    """Publish a finished output folder to the Hub repo `repo_id` (created when missing).

    Refuses a folder without a manifest or one that `verify` fails (files against their
    SHA-256s, the index, the manifest's shapes). Uploads the files the manifest lists
    (resumably: run it again after an interruption and what is already there is skipped),
    then, in a last commit, the model card and the manifest. The uploaded manifest lists the card as
    README.md (in place of a README.md carried over from the source), so `fi-convert verify`
    passes on a download of the repo; the local folder is not changed.
    """
    root = Path(out_dir)
    m = check_out_dir(root)
    if not is_repo_id(repo_id):
        raise HubError(f"{repo_id}: not a Hub repo id; push to org/name")
    if base_model is not None and not is_repo_id(base_model):
        raise HubError(f"--base-model {base_model}: not a Hub repo id (org/name)")
    if is_offline():
        raise HubError(f"{repo_id}: HF_HUB_OFFLINE=1 forbids uploading; run without it to push")
    from huggingface_hub import CommitOperationAdd, HfApi, get_token
    from huggingface_hub.utils.sha import git_hash

    if get_token() is None:
        raise HubError(
            f"{repo_id}: pushing needs a Hugging Face token with write access; log in with "
            "`hf auth login` or set HF_TOKEN"
        )
    source_card = root / CARD_NAME if CARD_NAME in m["files"] else None
    card = model_card(
        m,
        repo_id=repo_id,
        base_model=base_model,
        base_revision=base_revision,
        source_card=source_card.read_text(errors="replace") if source_card else None,
    ).encode()
    manifest = upload_manifest(m, card)
    names = [n for n in m["files"] if n not in (MANIFEST_NAME, CARD_NAME)]
    api = HfApi(endpoint=endpoint(), library_name=LIBRARY, library_version=__version__)
    with _progress_bars(progress), _push_errors(repo_id):
        url = str(api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model"))
        if revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        remote = _remote_top_level(api, repo_id, revision)
        # a manifest from an earlier push goes first: it must not vouch for a half-new repo
        stale = [p for p in remote if p.endswith(".safetensors") and p not in m["files"]]
        if remote.get(MANIFEST_NAME) not in (None, git_hash(manifest)):
            stale.append(MANIFEST_NAME)
        what = f"{m['scheme']} ({m['backend']}, TP {m['tp_size']})"
        version = m["fi_convert_version"]
        api.upload_folder(
            repo_id=repo_id,
            repo_type="model",
            folder_path=root,
            revision=revision,
            allow_patterns=[_literal(n) for n in names],
            delete_patterns=[_literal(n) for n in stale] or None,
            commit_message=f"Upload {what} weights, converted by fi-convert {version}",
        )
        info = api.create_commit(
            repo_id=repo_id,
            repo_type="model",
            revision=revision,
            operations=[
                CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=card),
                CommitOperationAdd(path_in_repo=MANIFEST_NAME, path_or_fileobj=manifest),
            ],
            commit_message=f"Add the fi-convert manifest and model card ({what})",
        )
    return PushResult(repo_id, revision, url, info.oid, len(names) + 2, base_model)


def _remote_top_level(api, repo_id: str, revision: str) -> dict[str, str]:
    """Top-level files of the repo at `revision`: path -> git blob id."""
    from huggingface_hub.hf_api import RepoFile

    return {
        f.path: f.blob_id
        for f in api.list_repo_tree(repo_id, revision=revision, repo_type="model")
        if isinstance(f, RepoFile)
    }


@contextmanager
def _push_errors(repo_id: str) -> Iterator[None]:
    from huggingface_hub import errors as he

    try:
        yield
    except Exception as exc:
        e = _cause(exc)
        if isinstance(e, he.RepositoryNotFoundError):
            raise HubError(
                f"{repo_id}: the Hub has no such repo for this token and would not create it; "
                "check the name and use a token with write access to its namespace "
                "(`hf auth login` or HF_TOKEN)"
            ) from None
        if isinstance(e, he.RevisionNotFoundError):
            raise HubError(
                f"{repo_id}: no such branch and it could not be created; push to an existing "
                "branch with --revision"
            ) from None
        if isinstance(e, he.HfHubHTTPError):
            raise HubError(_http_message(repo_id, e, "upload")) from None
        if isinstance(e, _transport_errors()):
            raise HubError(
                f"{repo_id}: lost the connection to the Hub at {_hub_url(repo_id)} "
                f"({type(e).__name__}: {_brief(e)}); run the same push again - it resumes, "
                "skipping what is already uploaded"
            ) from None
        if isinstance(e, ValueError):
            raise HubError(f"{repo_id}: the Hub refused the upload ({_brief(e)})") from None
        raise


# ---- the model card ----


def upload_manifest(manifest: dict, card: bytes) -> bytes:
    """The manifest as uploaded: the local one with README.md being the model card."""
    m = dict(manifest)
    m["files"] = dict(m["files"])
    m["files"][CARD_NAME] = {"sha256": hashlib.sha256(card).hexdigest(), "size": len(card)}
    m["files"] = {k: m["files"][k] for k in sorted(m["files"])}
    return (json.dumps(m, indent=2, sort_keys=True) + "\n").encode()


def _front_matter(text: str | None) -> dict:
    if not text:
        return {}
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not match:
        return {}
    import yaml

    try:
        d = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}
    return d if isinstance(d, dict) else {}


def model_card(
    manifest: dict,
    *,
    repo_id: str,
    base_model: str | None = None,
    base_revision: str | None = None,
    source_card: str | None = None,
) -> str:
    """README.md for the pushed repo: Hub metadata, how it was made, what it holds, how to load
    it. Deterministic (no dates), so a second push of the same folder changes nothing."""
    from huggingface_hub import ModelCardData

    m = manifest
    scheme, backend, tp = m["scheme"], m["backend"], m["tp_size"]
    src = _front_matter(source_card)
    data = ModelCardData(
        base_model=base_model,
        # Valid values are adapter, merge, quantized and finetune. These are the base model's
        # own weights, untrained, complete and unmerged, re-laid out (and for some schemes
        # requantized) for one runtime: the Hub's "quantized" covers exactly such format
        # conversions of a base model (GGUF, AWQ, MLX...). "adapter" would claim a LoRA-style
        # add-on that needs the base weights; "finetune" would claim training.
        base_model_relation="quantized" if base_model else None,
        # "fi-convert", not "vllm": the expert tensors are in FlashInfer's kernel layouts,
        # which only a loader that reads the manifest (fi_convert.load_moe_layer, fi-convert's
        # vLLM plugin) can use. Stock `vllm serve` without --load-format fi-convert cannot,
        # so the Hub's vLLM snippet would mislead.
        library_name=LIBRARY,
        tags=["fi-convert", "flashinfer", "moe", scheme, backend, f"tp{tp}"],
        license=src.get("license"),
        license_name=src.get("license_name"),
        license_link=src.get("license_link"),
        pipeline_tag=src.get("pipeline_tag"),
    )
    return f"---\n{data.to_yaml()}\n---\n\n{_card_body(m, repo_id, base_model, base_revision)}"


def _card_body(m: dict, repo_id: str, base_model: str | None, base_revision: str | None) -> str:
    scheme, backend, tp = m["scheme"], m["backend"], m["tp_size"]
    t, s = m["target"], m["source"]
    layers: dict = m["layers"]
    first = next(iter(layers)) if layers else "model.layers.N.mlp.experts"
    src = f"[{base_model}](/{base_model})" if base_model else "a Mixture-of-Experts checkpoint"
    at = f" at commit `{base_revision}`" if base_revision else ""
    source_arg = base_model or "MODEL_DIR"
    rev = f" --revision {base_revision}" if base_revision and base_model else ""
    files = len(set(m["files"]) | {CARD_NAME})
    shards = [f for n, f in m["files"].items() if n.endswith(".safetensors")]
    weights = f"{sum(f['size'] for f in shards):,} bytes in {len(shards)} shard(s)"
    lines = [
        f"# {repo_id.split('/')[-1]}",
        "",
        f"The weights of {src}{at}, with every MoE layer's routed experts converted offline by "
        f"fi-convert into the byte layouts of FlashInfer's fused-MoE kernels (scheme `{scheme}`, "
        f"{backend} backend, tensor-parallel size {tp}). A server loads these pre-shuffled "
        "tensors straight into the kernel instead of stacking, padding, interleaving, "
        "shuffling and swizzling them at every start. All other tensors are the source's, "
        "byte for byte.",
        "",
        "## How it was made",
        "",
        "```",
        f"fi-convert {source_arg}{rev} OUT_DIR --scheme {scheme} --backend {backend} "
        f"--tp-size {tp}",
        "fi-convert verify OUT_DIR",
        f"fi-convert push OUT_DIR {repo_id}",
        "```",
        "",
        "| | |",
        "|---|---|",
        f"| fi-convert | {m['fi_convert_version']} (manifest format {m['format_version']}) |",
        f"| scheme | `{scheme}` |",
        f"| backend | `{backend}` (GPU family `{t.get('gpu_family')}`) |",
        f"| tensor-parallel size | {tp} (every rank's tensors are stored) |",
        f"| expert parallelism | {m.get('expert_parallel', '')} |",
        f"| target vLLM | {t.get('vllm')} |",
        f"| target FlashInfer | {t.get('flashinfer')} (layouts of {t.get('flashinfer_layouts')}) |",
        f"| source | model type `{s.get('model_type')}`, family `{s.get('family')}`, "
        f"{s.get('shards')} shard(s), fingerprint `{str(s.get('fingerprint'))[:16]}` |",
        "",
        "## What it holds",
        "",
    ]
    for names, count, lay in mf.layer_groups(layers):
        lines.append(
            f"- {count} MoE layer(s), `{names}`: {lay.get('num_experts')} experts, hidden "
            f"{lay.get('hidden_size')} (padded {lay.get('padded_hidden_size')}), intermediate "
            f"{lay.get('intermediate_size')} = {lay.get('intermediate_size_per_rank')} per rank "
            f"(padded {lay.get('padded_intermediate_size_per_rank')})"
        )
    lines += ["", "| tensor | dtype | shape per rank | layout |", "|---|---|---|---|"]
    for name, ten in (layers.get(first) or {}).get("tensors", {}).items():
        tile = f", tile {ten['epilogue_tile_m']}" if ten.get("epilogue_tile_m") else ""
        lines.append(
            f"| `{name}` | {ten.get('dtype')} | {ten.get('shape_per_rank')} | "
            f"{ten.get('layout')}{tile} |"
        )
    lines += [
        "",
        f"Each tensor is stored under the layer's prefix (e.g. `{first}.w13_weight`) with the "
        f"TP rank as its leading dimension ({weights}). `{MANIFEST_NAME}` lists all {files} "
        "files with their SHA-256s, this card included; `fi-convert verify` on a download "
        "checks them all.",
        "",
        "## How to load it",
        "",
        "```python",
        "from huggingface_hub import snapshot_download",
        "from fi_convert import load_moe_layer, read_manifest",
        "",
        f'path = snapshot_download("{repo_id}")',
        "manifest = read_manifest(path)  # scheme, backend, tp_size, padded sizes per layer",
        f't = load_moe_layer(path, "{first}", tp_rank=0, device="cuda",',
        f'                   scheme="{scheme}", backend="{backend}")',
        "t['w13_weight'].shape  # as vLLM holds it after process_weights_after_loading",
        "```",
        "",
        f"**vLLM.** The expert bytes are those vLLM {t.get('vllm')} with FlashInfer "
        f"{t.get('flashinfer')} holds after `process_weights_after_loading`. Serve it with "
        "fi-convert's vLLM plugin, which loads them straight into the MoE layers and runs "
        "kernel setup only:",
        "",
        "```",
        'pip install "fi-convert[vllm]"',
        serve_command(repo_id, scheme, backend, tp),
        "```",
        "",
        f"The plugin refuses, before loading anything, a vLLM outside {t.get('vllm_versions')}, "
        f"another TP size, another MoE backend, or a GPU outside the {t.get('gpu_family')} "
        "family. Stock `vllm serve` without `--load-format fi-convert` must not be used on this "
        "repo.",
        "",
    ]
    return "\n".join(lines)
