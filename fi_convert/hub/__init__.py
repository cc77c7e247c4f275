"""The Hugging Face Hub: a repo id as the source, and publishing a finished output folder.

Everything goes through `huggingface_hub` with its defaults: the user's cache (HF_HOME /
HF_HUB_CACHE), the token (HF_TOKEN, or the one `hf auth login` stored; it is never printed),
offline mode (HF_HUB_OFFLINE=1) and the endpoint (HF_ENDPOINT, read when called). Failures
become `HubError`s with one-line messages that name the repo and the fix.

Modules: `convert` (what the command line's `convert` does: `convert_source` converts a folder
or repo id and may push the result, `stream_source` converts straight to a repo), `download` (a
repo id as the source), `remote` (a repo read by byte ranges), `stream`
(converting straight to a repo within a disk budget), `push` (publishing a folder), `publish`
(what `push` and `stream` share: the target repo opened and listed, the files an older output
left, the last commit with the model card and the manifest, upload errors), `preflight` (what a
push needs, checked in seconds), `card` (the model card), `common` (endpoint, offline mode,
error messages).
"""

from __future__ import annotations

from .card import CARD_NAME, model_card, upload_manifest
from .common import LIBRARY, endpoint, is_offline, is_repo_id
from .convert import Conversion, Listener, Streamed, convert_source, stream_source
from .download import IGNORE_PATTERNS, Source, download, resolve_source
from .preflight import check_target
from .push import PushResult, check_out_dir, push

__all__ = [
    "CARD_NAME",
    "IGNORE_PATTERNS",
    "LIBRARY",
    "Conversion",
    "Listener",
    "PushResult",
    "Source",
    "Streamed",
    "check_out_dir",
    "check_target",
    "convert_source",
    "download",
    "endpoint",
    "is_offline",
    "is_repo_id",
    "model_card",
    "push",
    "resolve_source",
    "stream_source",
    "upload_manifest",
]
