"""Which releases of a server have a model class for a source's architecture, as data read from
each release's own code: `servers/<name>/architectures.json`, one entry per release, written by
`scripts/release_architectures.py` run in that release's venv (and checked against the
installed release by tests/test_release_architectures.py, in `make test` and in each
release's leg). An entry holds

- `architectures`: every architecture of the release's model registry (the server picks a
  model class by config.json's `architectures`; one its registry lacks it serves through its
  generic Transformers backend, if at all, where fi-convert's plugin does not load);
- `refuses`: the architectures whose model the release refuses for a family's config.json as
  transformers writes it (its own config class raises), with the release's own message.

An output's releases (the manifest target's lists) are those whose own processing holds its
bytes and that have a model class for its architecture (the manifest's `source.architectures`,
config.json's) that takes its family's config; an output written before the manifest recorded
the architecture is judged by its layout alone, as before. Imports no server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from packaging.version import Version

from ..format.manifest import source_architectures

FILE = "architectures.json"


@dataclass(frozen=True)
class Release:
    """One release's registry and the architectures whose model refuses a family's config."""

    architectures: frozenset[str]
    refuses: Mapping[str, str]


@dataclass(frozen=True)
class Facts:
    server: str
    registry: str  # where the release's registry is, and how it was read
    releases: Mapping[str, Release]

    def known(self, release: str) -> bool:
        return release in self.releases

    def why_not(self, release: str, archs: Sequence[str]) -> str | None:
        """Why `release` has no model for a source of `archs` (None: it has one, or the
        release or the architectures are unknown here). The server takes the first of
        config.json's architectures its registry holds."""
        rel = self.releases.get(release)
        if rel is None or not archs:
            return None
        held = [a for a in archs if a in rel.architectures]
        if not held:
            return f"its model registry has no {' or '.join(archs)}"
        if held[0] in rel.refuses:
            return f"its {held[0]} refuses the family's config.json ({rel.refuses[held[0]]})"
        return None

    def serving(self, archs: Sequence[str], releases: Sequence[str]) -> list[str]:
        """The releases of `releases` that have a model for a source of `archs`."""
        return [r for r in releases if self.why_not(r, archs) is None]

    def left_out(self, archs: Sequence[str], releases: Sequence[str]) -> str:
        """Why releases of `releases` are left out for `archs`, in one sentence ("" for none)."""
        by: dict[str, list[str]] = {}
        for r in releases:
            why = self.why_not(r, archs)
            if why is not None:
                by.setdefault(why, []).append(r)
        return "; ".join(f"{self.label} {', '.join(rs)}: {why}" for why, rs in by.items())

    @property
    def label(self) -> str:
        return {"vllm": "vLLM", "sglang": "SGLang"}.get(self.server, self.server)


@cache
def facts(server: str) -> Facts:
    """The server's file, read once."""
    d = json.loads((Path(__file__).parent / server / FILE).read_text())
    releases = {
        r: Release(frozenset(e["architectures"]), dict(e.get("refuses", {})))
        for r, e in d["releases"].items()
    }
    return Facts(d["server"], d["registry"], dict(sorted(releases.items(), key=_key)))


def _key(item: tuple[str, object]) -> Version:
    return Version(item[0])


def unserved(server: str, archs: Sequence[str]) -> str | None:
    """Why no release of `server` that fi-convert knows has a model for a source of `archs`,
    release by release (None: some has one, or the source names no architecture)."""
    f = facts(server)
    known = list(f.releases)
    if not archs or f.serving(archs, known):
        return None
    return f.left_out(archs, known)


def of_manifest(m: Mapping) -> list[str]:
    """The source's architectures the manifest records (config.json's), [] where it records
    none (an output written before the field, or a config.json without them)."""
    return source_architectures(dict(m)) or []


def narrowed(server: str, m: Mapping, releases: Sequence[str]) -> list[str]:
    """`releases` (those that hold the output's bytes) less those without a model for the
    architecture the manifest records."""
    return facts(server).serving(of_manifest(m), releases)


def why_left_out(server: str, m: Mapping, releases: Sequence[str]) -> str:
    return facts(server).left_out(of_manifest(m), releases)


def table(server: str, releases: Sequence[str]) -> list[str]:
    """The docs' table of the families' architectures some of `releases` has no model for
    (its registry lacks it, or its class refuses the family's config.json) and some has,
    made from the
    server's file; under the support table (scripts/support_table.py,
    scripts/sglang_support_table.py)."""
    from ..families import all_families

    f = facts(server)
    rows = []
    for fam in sorted(all_families(), key=lambda x: x.name):
        for arch in fam.architectures:
            out = [
                r
                if arch not in f.releases[r].architectures
                else f"{r} ({f.releases[r].refuses[arch]})"
                for r in releases
                if f.known(r) and f.why_not(r, [arch]) is not None
            ]
            ok = f.serving([arch], releases)
            if not out or not ok:  # (one no release serves: coverage.json's business)
                continue
            rows.append(f"| `{arch}` ({fam.name}) | {', '.join(out)} | {', '.join(ok) or 'none'} |")
    if not rows:
        return []
    return [
        f"Architectures some {f.label} release has no model class for (its registry lacks it), "
        "or whose class refuses the family's config.json (as transformers writes it), read from "
        f"each release's own code (`fi_convert/servers/{server}/{FILE}`): an output of them "
        "lists only the releases that serve them.",
        "",
        "| architecture (family) | left out: no class, or its class refuses | served by |",
        "|---|---|---|",
        *rows,
    ]
