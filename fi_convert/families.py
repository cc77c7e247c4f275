"""Model families as data: tensor-name patterns and config keys, one JSON file each.

A family file (see `configs/`) lists the `model_type`s it covers, where `config.json` keeps
the expert count and sizes, and one or more expert "forms": a regular expression over tensor
names with named groups `prefix` (the MoE module), `expert` (per-expert form only), `proj` and
`param`, and a map from projection names to vLLM's roles `w1` (gate), `w3` (up), `w2` (down)
or `w13` (a fused [gate; up] tensor). Adding a family is adding a file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FAMILY_DIR = Path(__file__).with_name("families")


@dataclass(frozen=True)
class Form:
    kind: str  # "per_expert" | "fused"
    pattern: re.Pattern[str]
    projections: dict[str, str]


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    model_types: tuple[str, ...]
    config_keys: dict[str, tuple[str, ...]]
    forms: tuple[Form, ...]
    manifest_keys: tuple[str, ...] = ()  # config.json values recorded per layer (swiglu_limit)

    def config_value(self, config: dict, key: str) -> int | None:
        for section in (config, config.get("text_config") or {}):
            for k in self.config_keys.get(key, ()):
                if isinstance(section.get(k), int):
                    return int(section[k])
        return None


def _load(path: Path) -> Family:
    d = json.loads(path.read_text())
    forms = tuple(
        Form(f["kind"], re.compile(f["pattern"]), dict(f["projections"])) for f in d["forms"]
    )
    keys = {k: tuple(v) for k, v in d["config_keys"].items()}
    return Family(
        d["name"],
        d.get("description", ""),
        tuple(d["model_types"]),
        keys,
        forms,
        tuple(d.get("manifest_keys", ())),
    )


@lru_cache(maxsize=1)
def all_families() -> tuple[Family, ...]:
    return tuple(_load(p) for p in sorted(FAMILY_DIR.glob("*.json")))


def model_type(config: dict) -> str | None:
    mt = config.get("model_type")
    if mt is None and isinstance(config.get("text_config"), dict):
        mt = config["text_config"].get("model_type")
    return mt if isinstance(mt, str) else None


def candidates(config: dict) -> tuple[Family, ...]:
    """Families to try for a config: the one naming its model_type first, then the rest."""
    mt = model_type(config)
    fams = all_families()
    first = tuple(f for f in fams if mt in f.model_types)
    return first + tuple(f for f in fams if f not in first)
