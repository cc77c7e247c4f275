"""What every Hub operation shares: the endpoint, offline mode, progress bars, and turning
huggingface_hub's and the HTTP client's errors into one-line messages."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

LIBRARY = "fi-convert"
_TRUE = {"1", "ON", "YES", "TRUE"}
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")


def is_repo_id(s: str) -> bool:
    """Whether `s` has the form of a Hub repo id, `org/name`."""
    return bool(_REPO_ID.match(s)) and ".." not in s and "--" not in s and not s.endswith(".git")


def literal(name: str) -> str:
    """An fnmatch pattern that matches exactly `name`."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def endpoint() -> str | None:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def is_offline() -> bool:
    from huggingface_hub import constants

    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper()
    return env in _TRUE or bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def hub_url(repo_id: str) -> str:
    from huggingface_hub import constants

    return f"{endpoint() or constants.ENDPOINT}/{repo_id}"


@contextmanager
def progress_bars(show: bool) -> Iterator[None]:
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


def transport_errors() -> tuple[type[BaseException], ...]:
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


def cause(e: BaseException) -> BaseException:
    """The HTTP error under huggingface_hub's wrappers (an LFS upload raises RuntimeError)."""
    while isinstance(e, RuntimeError) and e.__cause__ is not None:
        e = e.__cause__
    return e


def status(e: BaseException) -> int | None:
    resp = getattr(e, "response", None)
    return getattr(resp, "status_code", None)


def brief(e: BaseException) -> str:
    """One short line about `e`: the server's message, or the first line of the error."""
    msg = getattr(e, "server_message", None) or str(e) or type(e).__name__
    line = next((s.strip() for s in str(msg).splitlines() if s.strip()), type(e).__name__)
    return line if len(line) <= 160 else line[:157] + "..."


def http_message(repo_id: str, e: BaseException, doing: str) -> str:
    code = status(e)
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
    return f"{repo_id}: the Hub answered HTTP {code} during the {doing} ({brief(e)}); {again}"
