"""Model families as data: tensor-name patterns and config keys, one JSON file each.

A family file (see `families/`) lists the `model_type`s and `architectures` of `config.json`
it covers (the family is taken from those, never guessed from tensor names), where
`config.json` keeps the expert count and sizes, and one or more expert "forms": a regular
expression over tensor names with named groups `prefix` (the MoE module), `expert` (per-expert
form only), `proj` and `param`, and a map from projection names to vLLM's roles `w1` (gate),
`w3` (up), `w2` (down) or `w13` (a fused [gate; up] tensor). A form with `refuse` is one
fi-convert recognizes but cannot convert: the text says why. `markers` are patterns of other
tensors only this family has, to name it when a config.json contradicts its tensors. Adding a
family is adding a file.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FAMILY_DIR = Path(__file__).with_name("families")


@dataclass(frozen=True)
class Form:
    # "per_expert": one [out, in] tensor per expert and projection; "fused": one [E, 2I, H]
    # w13 tensor ([gate; up]) and one [E, H, I] w2; "stacked": one [E, out, in] tensor per
    # projection (fi_convert/forms.py has the shapes of each)
    kind: str
    pattern: re.Pattern[str]
    projections: dict[str, str]
    refuse: str | None = None  # why this form is recognized but not converted
    # the roles ("w13", "w1", "w3", "w2") stored [in, out] per expert, as torch.bmm's
    # operands (Llama-4's gate_up_proj [E, H, 2I]), which the server's loader transposes
    transposed: tuple[str, ...] = ()
    # appended to the `prefix` group to name the server's MoE module, where the checkpoint's
    # names have no module of their own for the experts (Granite's block_sparse_moe.
    # input_linear: vLLM's module is block_sparse_moe.experts)
    module: str = ""


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    model_types: tuple[str, ...]
    config_keys: dict[str, tuple[str, ...]]
    forms: tuple[Form, ...]
    manifest_keys: tuple[str, ...] = ()  # config.json values recorded per layer (swiglu_limit)
    # config.json fields holding the limit of the experts' SwiGLU clamp, which the model's MoE
    # passes its experts (SGLang's DeepseekV2MoE: swiglu_limit)
    clamp_keys: tuple[str, ...] = ()
    title: str = ""  # for messages: "Qwen3-MoE"
    architectures: tuple[str, ...] = ()
    markers: tuple[re.Pattern[str], ...] = ()
    file: str = ""  # the family file's name

    def config_value(self, config: dict, key: str) -> int | None:
        for section in (config, _text_config(config)):
            for k in self.config_keys.get(key, ()):
                if KINDS["integer"](section.get(k)):
                    return int(section[k])
        return None

    def config_fields(self) -> dict[str, str]:
        """The config.json fields this family reads, each with its kind (KINDS)."""
        fields = {k: "integer" for keys in self.config_keys.values() for k in keys}
        return fields | {k: "number" for k in (*self.manifest_keys, *self.clamp_keys)}

    def swiglu_limit(self, config: dict) -> float | None:
        """The experts' SwiGLU clamp limit config.json gives (`clamp_keys`), or None."""
        for k in self.clamp_keys:
            v = config_field(config, k)
            if KINDS["number"](v):
                return float(v)  # type: ignore[arg-type]
        return None


def _load(path: Path) -> Family:
    d = json.loads(path.read_text())
    forms = tuple(
        Form(
            f["kind"],
            re.compile(f["pattern"]),
            dict(f["projections"]),
            f.get("refuse"),
            tuple(f.get("transposed", ())),
            f.get("module", ""),
        )
        for f in d["forms"]
    )
    keys = {k: tuple(v) for k, v in d["config_keys"].items()}
    return Family(
        d["name"],
        d.get("description", ""),
        tuple(d["model_types"]),
        keys,
        forms,
        tuple(d.get("manifest_keys", ())),
        tuple(d.get("clamp_keys", ())),
        d.get("title", d["name"]),
        tuple(d.get("architectures", ())),
        tuple(re.compile(m) for m in d.get("markers", ())),
        path.name,
    )


@lru_cache(maxsize=1)
def all_families() -> tuple[Family, ...]:
    return tuple(_load(p) for p in sorted(FAMILY_DIR.glob("*.json")))


# what a field fi-convert reads from config.json must hold (absent or null: not read)
KINDS = {
    "map": lambda v: isinstance(v, dict),
    "string": lambda v: isinstance(v, str),
    "list of strings": lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
}
# read in config.json and in its text_config; the families add their own (config_fields)
SECTION_FIELDS = {"model_type": "string", "architectures": "list of strings"}
TOP_FIELDS = {"text_config": "map", "quantization_config": "map"}
QUANT_FIELDS = {"quant_method": "string", "quant_algo": "string", "quantization": "map"}


def wrong_kind(fields: dict[str, str], section: dict, where: str = "") -> str | None:
    """The first of `fields` whose value in `section` is not of its kind, said as
    `text_config.num_experts is "8", not an integer`; None when each is (or is absent)."""
    for key, kind in fields.items():
        v = section.get(key)
        if v is not None and not KINDS[kind](v):
            shown = json.dumps(v)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"{where}{key} is {shown}, not {_article(kind)}"
    return None


def _article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def config_problem(config: dict) -> str | None:
    """The first field fi-convert reads from config.json that holds the wrong kind of value
    (a list where a map is, a string where a number is), in it or in its text_config; the
    family fields are those of the families it declares."""
    fields = dict(SECTION_FIELDS)
    for fam in declared(config):
        fields |= fam.config_fields()
    quant = config.get("quantization_config") or {}
    return (
        wrong_kind(TOP_FIELDS, config)
        or wrong_kind(fields, config)
        or wrong_kind(fields, _text_config(config), "text_config.")
        or wrong_kind(QUANT_FIELDS, quant, "quantization_config.")
    )


def config_field(config: dict, key: str) -> object:
    """config.json's `key`, or its text_config's where config.json has none."""
    return config.get(key, _text_config(config).get(key))


def model_type(config: dict) -> str | None:
    mt = config.get("model_type")
    if mt is None and isinstance(config.get("text_config"), dict):
        mt = config["text_config"].get("model_type")
    return mt if isinstance(mt, str) else None


def _text_config(config: dict) -> dict:
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else {}


def architectures(config: dict) -> list[str]:
    """config.json's `architectures` (and its text_config's), the strings only."""
    out: list[str] = []
    for section in (config, _text_config(config)):
        archs = section.get("architectures")
        if isinstance(archs, list):
            out += [a for a in archs if isinstance(a, str) and a not in out]
    return out


def declared(config: dict) -> tuple[Family, ...]:
    """The families config.json names: by `model_type` (its own or its text_config's) or by
    `architectures`."""
    found = (config.get("model_type"), _text_config(config).get("model_type"))
    types = {t for t in found if isinstance(t, str)}
    archs = set(architectures(config))
    return tuple(
        f for f in all_families() if types & set(f.model_types) or archs & set(f.architectures)
    )
