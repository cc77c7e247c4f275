"""The server an output is for, as the core sees it: what the core asks of one, never how.

Every fact about a server (the releases whose load-time processing gives an output's bytes,
the GPUs it runs each backend on, what it cannot serve and why, its serve line) lives in that
server's package, in a facts module that imports no server (`fi_convert/servers/<name>/
target.py`), registered by name in `fi_convert/servers/__init__.py`. The core takes a
`ServerTarget` object (`Options.server` names it, `Plan.target` holds it) and never imports a
server's package: `fi_convert.server_lookup` looks the name up in the registry when asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

DEFAULT = "vllm"


class Refusal(NamedTuple):
    """Why a server cannot serve an output as planned, and the source it would serve instead
    (for the line that refuses it)."""

    why: str
    instead: str


class ServerTarget(Protocol):
    @property
    def name(self) -> str:
        """Its name in the registry (and, with `--server`, on the command line)."""
        ...

    @property
    def versions(self) -> Mapping[str, str]:
        """The manifest's `target` (beside `gpu_family`): the releases whose load-time
        processing gives the output's bytes, and the version specifiers a loader accepts."""
        ...

    @property
    def ep_schemes(self) -> tuple[str, ...]:
        """The schemes it serves from a tp 1 output at any EP size."""
        ...

    @property
    def marker_note(self) -> str:
        """The output config.json's note: how to serve the output."""
        ...

    def no_path(self, scheme: str, backend: str) -> str:
        """Why it has no path for a backend the scheme does not implement."""
        ...

    def unservable(self, scheme: str, backend: str, layers: Sequence[Mapping]) -> Refusal | None:
        """Why it cannot serve this output as planned (a scheme and backend it has; each
        layer's entry in the manifest, `LayerPlan.info`), or None."""
        ...

    def gpu_family(self, backend: str, scheme: str) -> str:
        """The GPUs where it runs the scheme with the backend (the manifest's `gpu_family`)."""
        ...

    def ep_note(self, scheme: str, layers: Mapping[str, dict]) -> str:
        """The manifest's `expert_parallel`: the EP sizes the output serves as converted."""
        ...

    def serve_command(self, where: str, scheme: str, backend: str, tp: int, ep: int = 0) -> str:
        """Its command line that serves an output (a folder or a Hub repo id); with `ep`, on
        that many GPUs with expert parallelism."""
        ...

    def card_rows(self, target: Mapping) -> list[str]:
        """The model card's table rows of the releases the output targets (the manifest's
        `target`)."""
        ...

    def card_section(self, m: Mapping, repo_id: str) -> list[str]:
        """The model card's lines on serving the output (manifest `m`) from the Hub repo."""
        ...
