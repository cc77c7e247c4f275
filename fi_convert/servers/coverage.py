"""Which MoE architectures of each server's model registry fi-convert covers, as data: one
file per server release, `servers/<name>/coverage.json`, facts read from that release's own
registry (`tests/test_<name>_coverage.py` holds each file to the installed server's registry).

A file holds the registry it was read from, the rule by which an architecture builds MoE
layers (its model module names the server's MoE layer class, or uses what another model module
that does defines), every such architecture
(`moe_architectures`), and, for each of them no family file names (`fi_convert/families/*.json`
`architectures`), its kind (`KINDS`) and a one-line reason. An architecture a family names is
covered: converted, or refused with the server's reason (the family's `refuse`). It imports no
server and no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..families import all_families

# The kinds of an architecture of a server's registry that builds MoE layers and that no
# family file names, and what each means
KINDS = {
    "not-yet": (
        "a model family fi-convert has not added yet (no family file): converting it is "
        "refused as a model of no family fi-convert knows"
    ),
    "refused": (
        "a model class fi-convert refuses for this server, with the server's reason read from "
        "its code (servers/<name>/target.py): a user's family file for it (--family) is "
        "refused in one line"
    ),
    "draft": (
        "a speculative-decoding draft model (MTP, NextN, Eagle, DFlash, DSpark) the server "
        "runs beside its target model: fi-convert converts target models, and a draft's load "
        "through the plugin is not proven"
    ),
    "pooling": (
        "an embedding, classification or bidirectional model: fi-convert converts generative "
        "models, and a pooling model's load through the plugin is not proven"
    ),
    "transformers": (
        "the server's generic Transformers backend, which builds its MoE layers from "
        "transformers' own modeling code of whatever model it is given: the expert names are "
        "each model's, so fi-convert covers models by their own family files"
    ),
    "dense": (
        "a dense architecture whose module (or the generic Transformers backend's dense "
        "class) also holds MoE code: it builds no MoE layer"
    ),
    "alias": "another name of a model class a family covers, which no family file names",
    "wrapper": (
        "a multimodal model class over whichever language model its config.json names "
        "(text_config, llm_config, language_config): fi-convert takes a checkpoint of it as "
        "that language model's family"
    ),
}


@dataclass(frozen=True)
class Uncovered:
    kind: str
    reason: str


@dataclass(frozen=True)
class Coverage:
    server: str
    release: str
    registry: str  # where the server's registry of architectures is
    rule: str  # how an architecture of it is found to build MoE layers
    moe_architectures: tuple[str, ...]
    uncovered: dict[str, Uncovered]

    def covered(self) -> list[str]:
        """The registry's MoE architectures a family file names."""
        named = family_architectures()
        return [a for a in self.moe_architectures if a in named]


def path(server: str) -> Path:
    return Path(__file__).with_name(server) / "coverage.json"


@cache
def coverage(server: str) -> Coverage:
    """The coverage file of `server` ("vllm", "sglang")."""
    d = json.loads(path(server).read_text())
    return Coverage(
        server,
        d["release"],
        d["registry"],
        d["rule"],
        tuple(d["moe_architectures"]),
        {a: Uncovered(e["kind"], e["reason"]) for a, e in d["uncovered"].items()},
    )


def family_architectures() -> dict[str, str]:
    """Every architecture a family file names, with the family's title."""
    return {a: f.title for f in all_families() for a in f.architectures}


def problems(server: str) -> list[str]:
    """What in the server's coverage file contradicts itself or the family files, one line
    each: an uncovered entry of an unknown kind, a reason that is not one line, an entry that
    is not one of the registry's MoE architectures, or that a family names (stale), and a MoE
    architecture neither a family nor an entry covers."""
    cov, named, out = coverage(server), family_architectures(), []
    for arch, e in cov.uncovered.items():
        if e.kind not in KINDS:
            out.append(f"{arch}: kind {e.kind!r} is not one of {', '.join(KINDS)}")
        if not e.reason.strip() or "\n" in e.reason:
            out.append(f"{arch}: its reason is not one line")
        if arch not in cov.moe_architectures:
            out.append(f"{arch}: not one of the registry's MoE architectures")
        if arch in named:
            out.append(f"{arch}: listed as uncovered ({e.kind}), but family {named[arch]} names it")
    for arch in cov.moe_architectures:
        if arch not in named and arch not in cov.uncovered:
            out.append(f"{arch}: builds MoE layers, and no family and no entry covers it")
    return out
