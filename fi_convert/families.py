"""Model families as data: tensor-name patterns and config keys, one JSON file each.

A family file (see `families/`) lists the `model_type`s and `architectures` of `config.json`
it covers (the family is taken from those, never guessed from tensor names), where
`config.json` keeps the expert count and sizes, and one or more expert "forms": a regular
expression over tensor names with named groups `prefix` (the MoE module), `expert` (per-expert
form only), `proj` and `param`, and a map from projection names to vLLM's roles `w1` (gate),
`w3` (up), `w2` (down) or `w13` (a fused [gate; up] tensor); a non-gated expert (an activation
without a product, `relu2_no_mul`: Nemotron-H) has no gate, and its one up projection is `w1`, as
vLLM's FusedMoE holds it (w13 = w1 alone, [I, H]). A form with `refuse` is one
fi-convert recognizes but cannot convert: the text says why. `markers` are patterns of other
tensors only this family has, to name it when a config.json contradicts its tensors.
`size_multiples` names config.json fields that hold a multiple of the size they are read for
(ZAYA1's ffn_hidden_size: the rows of its fused gate/up, 2I), read divided. Adding a family is
adding a file.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

FAMILY_DIR = Path(__file__).with_name("families")
# the manifest's `source` field that holds a user's family file (`--family`) whole
FAMILY_FILE = "family_file"


@dataclass(frozen=True)
class Form:
    # "per_expert": one [out, in] tensor per expert and projection; "fused": one [E, 2I, H]
    # w13 tensor ([gate; up]) and one [E, H, I] w2; "stacked": one [E, out, in] tensor per
    # projection; "flat": one [E*out, in] per projection; "per_expert_fused": one [2I, H] w13
    # ([gate; up]) and one [H, I] w2 per expert (fi_convert/forms.py has the shapes of each)
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
    # per-expert forms whose experts are several MoE layers of the server's, one after
    # another: each set's module (appended to `prefix`), its experts the next `num_experts[k]`
    # of the checkpoint's (ERNIE-4.5-VL's 2N experts: N text_experts, then N vision_experts),
    # its sizes the k-th of config.json's lists
    sets: tuple[str, ...] = ()
    # the checkpoint's parameter names read as the ones the schemes know (Mistral's FP8
    # `qscale_weight` is `weight_scale`, as the server's own loader renames it)
    params: dict[str, str] = field(default_factory=dict)
    # a fused form whose w13 holds gate and up rows interleaved, [g0, u0, g1, u1, ...] per
    # expert, where the others hold [gate; up] halves (Inkling's mlp.experts.w13_weight, which
    # its servers' loaders de-interleave): its gate is the even rows, its up the odd ones
    interleaved: bool = False


# the decoder layer a MoE module's prefix names (`model.layers.3.mlp.experts`: 3)
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    model_types: tuple[str, ...]
    config_keys: dict[str, tuple[str, ...]]
    forms: tuple[Form, ...]
    manifest_keys: tuple[str, ...] = ()  # config.json values recorded per layer (swiglu_limit)
    # config.json fields holding the limit of the experts' SwiGLU clamp, which the model's MoE
    # passes its experts (SGLang's DeepseekV2MoE: swiglu_limit); one named in `layer_keys` too
    # holds one limit per decoder layer (Ling 3's expert_swiglu_limit_list), 0 or null for none
    clamp_keys: tuple[str, ...] = ()
    title: str = ""  # for messages: "Qwen3-MoE"
    architectures: tuple[str, ...] = ()
    markers: tuple[re.Pattern[str], ...] = ()
    file: str = ""  # the family file's name
    moe: MoeFacts = field(default_factory=lambda: MoeFacts())  # routing, activation, refusal
    source: dict = field(default_factory=dict, compare=False, repr=False)  # the file's JSON
    own: bool = False  # a user's family file (`--family`), not one of fi-convert's
    # config.json fields that hold one value per decoder layer (Hunyuan-A13B's
    # moe_intermediate_size), read at the MoE layer's index
    layer_keys: tuple[str, ...] = ()
    # a config.json field holding one map per decoder layer whose keys replace config.json's
    # for that layer (Nemotron-H Puzzle's block_configs)
    layer_configs: str = ""
    # config.json fields (of `config_keys`) that hold a multiple of the size they are read
    # for, by that multiple: the size is the value divided by it (ZAYA1's ffn_hidden_size: 2,
    # the rows of both halves of its fused gate/up; SGLang builds its FusedMoE of half)
    multiples: dict[str, int] = field(default_factory=dict)

    def config_value(self, config: dict, key: str, layer: str = "") -> int | None:
        """The first of the family's `config_keys[key]` config.json holds as an integer: a
        plain key in config.json or its text_config, a dotted one (`thinker_config.
        text_config.num_experts`) where it says; for the MoE layer `layer` of an expert set
        (`Form.sets`), the set's entry of a list; of a per-layer field (`layer_keys`), the
        layer's entry (none without a layer); the layer's own map (`layer_configs`) first; a
        field that holds a multiple of the size (`multiples`), divided by it."""
        found = self.config_source(config, key, layer)
        return found[1] if found else None

    def config_source(self, config: dict, key: str, layer: str = "") -> tuple[str, int] | None:
        """The config.json field `config_value` reads (`block_configs[3].n_routed_experts`
        where the layer's own map gives it; `ffn_hidden_size / 2` where it holds a multiple of
        the size) and the size, or None."""
        k_set = self.set_index(layer)
        for k in self.config_keys.get(key, ()):
            name, v = self._layer_field(config, k, layer)
            if isinstance(v, list) and k in self.layer_keys:
                v = _at(v, _layer_index(layer))
            elif isinstance(v, list) and k_set is not None and k_set < len(v):
                v = v[k_set]
            if KINDS["integer"](v):
                n = self.multiples.get(k, 1)
                said = f"{name} / {n}" if n > 1 else name
                return said, int(v) // n  # type: ignore[call-overload]
        return None

    def _layer_field(self, config: dict, k: str, layer: str) -> tuple[str, object]:
        """config.json's `k`, or the MoE layer's own map's (`layer_configs`), with its name."""
        i = _layer_index(layer)
        blocks = lookup(config, self.layer_configs) if self.layer_configs else None
        block = _at(blocks, i) if isinstance(blocks, list) else None
        if isinstance(block, dict) and k in block:
            return f"{self.layer_configs}[{i}].{k}", block[k]
        return k, lookup(config, k)

    def set_index(self, layer: str) -> int | None:
        """Which expert set (`Form.sets`) the MoE layer `layer` is, or None."""
        for form in self.forms:
            for k, module in enumerate(form.sets):
                if layer.endswith(module):
                    return k
        return None

    def config_fields(self) -> dict[str, str]:
        """The config.json fields this family reads, each with its kind (KINDS); dotted
        ones are checked where they sit (`config_problem`)."""
        size = "integer or list of integers" if any(f.sets for f in self.forms) else "integer"
        fields = {k: size for keys in self.config_keys.values() for k in keys}
        fields |= {k: "integer or list of integers" for k in self.layer_keys}
        fields |= {k: "number" for k in (*self.manifest_keys, *self.clamp_keys)}
        fields |= {k: "number or list of numbers" for k in self.clamp_keys if k in self.layer_keys}
        return fields | self.moe.config_fields()

    def swiglu_limit(self, config: dict, layer: str = "") -> float | None:
        """The experts' SwiGLU clamp limit config.json gives (`clamp_keys`) for the MoE layer
        `layer`, or None: a per-layer list's entry at the layer's index (`layer_keys`), where
        0 or null is no clamp, as both servers read it (a layer past the list's end: none)."""
        for k in self.clamp_keys:
            v = config_field(config, k)
            if isinstance(v, list) and k in self.layer_keys:
                v = _at(v, _layer_index(layer)) or None
            if KINDS["number"](v):
                return float(v)  # type: ignore[arg-type]
        return None


def _layer_index(layer: str) -> int | None:
    m = LAYER_INDEX.search(layer)
    return int(m.group(1)) if m else None


def _at(values: list, k: int | None) -> object:
    return values[k] if k is not None and k < len(values) else None


def _load(path: Path) -> Family:
    return parse(json.loads(path.read_text()), path.name)


def _form(f: dict) -> Form:
    return Form(
        f["kind"],
        re.compile(f["pattern"]),
        dict(f["projections"]),
        f.get("refuse"),
        tuple(f.get("transposed", ())),
        f.get("module", ""),
        tuple(f.get("expert_sets", ())),
        dict(f.get("params", {})),
        f.get("interleaved", False),
    )


def parse(d: dict, file: str = "") -> Family:
    """A family from a family file's JSON (`file`: its name, for messages); `check_family`
    first, for a file fi-convert did not ship."""
    keys = {k: tuple(v) for k, v in d["config_keys"].items()}
    return Family(
        d["name"],
        d.get("description", ""),
        tuple(d.get("model_types", ())),
        keys,
        tuple(_form(f) for f in d["forms"]),
        tuple(d.get("manifest_keys", ())),
        tuple(d.get("clamp_keys", ())),
        d.get("title", d["name"]),
        tuple(d.get("architectures", ())),
        tuple(re.compile(m) for m in d.get("markers", ())),
        file,
        _moe_facts(d),
        d,
        layer_keys=tuple(d.get("layer_keys", ())),
        layer_configs=d.get("layer_configs", ""),
        multiples=dict(d.get("size_multiples", {})),
    )


@lru_cache(maxsize=1)
def all_families() -> tuple[Family, ...]:
    return tuple(_load(p) for p in sorted(FAMILY_DIR.glob("*.json")))


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# what a field fi-convert reads from config.json must hold (absent or null: not read)
KINDS = {
    "map": lambda v: isinstance(v, dict),
    "string": lambda v: isinstance(v, str),
    "list of strings": lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    # an expert-set family's sizes: one, or one per set
    "integer or list of integers": lambda v: (
        _integer(v) or (isinstance(v, list) and bool(v) and all(_integer(a) for a in v))
    ),
    "boolean": lambda v: isinstance(v, bool),
    # a per-layer clamp limit: one, or one per decoder layer (null: none)
    "number or list of numbers": lambda v: (
        _number(v) or (isinstance(v, list) and all(a is None or _number(a) for a in v))
    ),
    "number": _number,
}
# read in config.json and in its text_config; the families add their own (config_fields)
SECTION_FIELDS = {"model_type": "string", "architectures": "list of strings"}
TOP_FIELDS = {
    "text_config": "map",
    "llm_config": "map",
    "language_config": "map",
    "quantization_config": "map",
}
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


def config_problem(config: dict, extra: tuple[Family, ...] = ()) -> str | None:
    """The first field fi-convert reads from config.json that holds the wrong kind of value
    (a list where a map is, a string where a number is), in it or in its text_config; the
    family fields are those of the families it declares."""
    fields = dict(SECTION_FIELDS)
    for fam in declared(config, extra):
        fields |= fam.config_fields()
    quant = config.get("quantization_config") or {}
    return (
        wrong_kind(TOP_FIELDS, config)
        or _dotted_problem(fields, config)
        or wrong_kind(fields, config)
        or wrong_kind(fields, _text_config(config), f"{_text_section(config)}.")
        or wrong_kind(QUANT_FIELDS, quant, "quantization_config.")
        or _multiple_problem(config, declared(config, extra))
    )


def _multiple_problem(config: dict, fams: tuple[Family, ...]) -> str | None:
    """The first field a family reads as a multiple of a size (`Family.multiples`) whose value
    (or a per-layer entry of it) is not that multiple: no whole size is that part of it."""
    for fam in fams:
        for key, n in fam.multiples.items():
            v = lookup(config, key)
            values = v if isinstance(v, list) else [v]
            if any(isinstance(a, int) and not isinstance(a, bool) and a % n for a in values):
                shown = json.dumps(v)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                return f"{key} is {shown}, not a multiple of {n} ({fam.title} reads 1/{n} of it)"
    return None


def config_field(config: dict, key: str) -> object:
    """config.json's `key`, or its text_config's where config.json has none."""
    return config.get(key, _text_config(config).get(key))


def model_type(config: dict) -> str | None:
    mt = config.get("model_type")
    if mt is None:
        mt = _text_config(config).get("model_type")
    return mt if isinstance(mt, str) else None


# where a multimodal config.json holds its language model's config: text_config, llm_config
# (InternVL's InternVLChatConfig: model_type internvl_chat) or language_config (DeepSeek-VL2's
# and DeepSeek-OCR's: model_type deepseek_vl_v2, the servers' DeepseekVLV2Config)
TEXT_SECTIONS = ("text_config", "llm_config", "language_config")


def _text_section(config: dict) -> str:
    """The name of config.json's language-model section (text_config where there is none)."""
    return next((k for k in TEXT_SECTIONS if isinstance(config.get(k), dict)), TEXT_SECTIONS[0])


def _text_config(config: dict) -> dict:
    tc = config.get(_text_section(config))
    return tc if isinstance(tc, dict) else {}


def served_architectures(config: dict) -> list[str]:
    """config.json's own `architectures` (strings only): those a server picks its model class
    by, the first its registry holds (a text_config's are the language model's)."""
    archs = config.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def architectures(config: dict) -> list[str]:
    """config.json's `architectures` (and its text_config's), the strings only."""
    out: list[str] = []
    for section in (config, _text_config(config)):
        archs = section.get("architectures")
        if isinstance(archs, list):
            out += [a for a in archs if isinstance(a, str) and a not in out]
    return out


def declared(config: dict, extra: tuple[Family, ...] = ()) -> tuple[Family, ...]:
    """The families config.json names: by `model_type` (its own or its text_config's) or by
    `architectures`; those of `extra` (a user's family file) first, then those config.json's
    own model_type or architectures name before those only its text_config's does (Kimi K3's
    config.json, model_type kimi_k3, is Kimi K3's, not its kimi_linear text_config's)."""
    found = (config.get("model_type"), _text_config(config).get("model_type"))
    types = {t for t in found if isinstance(t, str)}
    archs = set(architectures(config))
    named = [
        f
        for f in (*extra, *all_families())
        if types & set(f.model_types) or archs & set(f.architectures)
    ]
    own = {t for t in found[:1] if isinstance(t, str)} | set(served_architectures(config))
    return tuple(
        sorted(named, key=lambda f: (not f.own, not own & {*f.model_types, *f.architectures}))
    )


def lookup(config: dict, key: str) -> object:
    """config.json's value of `key`: a plain key in config.json, else in its text_config; a
    dotted key (`thinker_config.text_config.num_experts`) along its path only."""
    if "." not in key:
        return config_field(config, key)
    node: object = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _dotted_problem(fields: dict[str, str], config: dict) -> str | None:
    """`wrong_kind` for the dotted fields (a value nested where the family says)."""
    for key, kind in fields.items():
        v = lookup(config, key) if "." in key else None
        if v is not None and not KINDS[kind](v):
            return wrong_kind({key: kind}, {key: v})
    return None


# ------------------------------------------------ routing and activation: what the experts run

# FlashInfer's routing methods (flashinfer.fused_moe RoutingMethodType; vLLM 0.33 mirrors it in
# fused_moe/config.py, with DeepseekV4 and Custom for routers no FlashInfer kernel takes)
ROUTING_METHODS = (
    "Default",  # softmax -> top-k
    "Renormalize",  # top-k -> softmax
    "DeepSeekV3",  # sigmoid + bias -> grouped top-k -> renormalize
    "Llama4",  # top-1 -> sigmoid
    "RenormalizeNaive",  # softmax -> top-k -> renormalize
    "TopK",
    "SigmoidRenorm",  # sigmoid -> top-k -> renormalize
    "MiniMax2",  # sigmoid + bias -> top-k -> renormalize
    "Sigmoid",  # sigmoid -> top-k
    "Unspecified",  # a router FlashInfer's fused routing does not compute
    "DeepseekV4",  # sqrtsoftplus (+ bias) -> renormalize: passed to no FlashInfer kernel
    "Custom",  # the model's own routing function
)
# the experts' activation, as vLLM 0.33's MoEActivation names it (lower case);
# swigluoai_uninterleave is SwiGLU-OAI (clamped, alpha and beta) on w13's [gate; up] halves, as
# silu's are stored (MiniMax-M3), where swigluoai is gpt-oss's interleaved form; situ is Kimi
# K3's SiTU (activation_situ_beta, activation_situ_linear_beta: gated, [gate; up] as silu's)
ACTIVATIONS = (
    "silu",
    "gelu_tanh",
    "relu2_no_mul",
    "swigluoai",
    "swigluoai_uninterleave",
    "swiglustep",
    "situ",
)
# the activations without a product (vLLM 0.33's MoEActivation.is_gated is False for them):
# their experts have no gate, w13 is the up projection alone
NON_GATED = ("relu2_no_mul",)


def gated(activation: str) -> bool:
    """Whether experts of this activation multiply a gate into the up projection (w13 =
    [gate; up]), as vLLM's `MoEActivation.is_gated` says."""
    return activation not in NON_GATED


ROUTER_FIELDS = ("scoring", "bias", "renormalize", "groups")
SCORINGS = ("softmax", "sigmoid", "sqrtsoftplus")


@dataclass(frozen=True)
class MoeFacts:
    """How a family's MoE layers route and activate: the router as its model builds it (each
    field a value, or `{"key": config field, "default": value}` read from config.json), or a
    routing method its model declares itself (`method`); the activation; and `refuse`, why no
    server runs the family on FlashInfer's MoE kernels."""

    router: dict = field(default_factory=dict)
    method: str | None = None
    activation: str = "silu"
    refuse: str | None = None
    # where config.json says the experts' activation (`{"key": field, "refuse": why}`, and
    # optionally `"activations": [...]`, the values the key may give, each the experts'
    # activation, whose refusal is then each server's: Kimi K3's silu or situ): a value other
    # than `activation` (or than one of `activations`) is refused, `why` naming the reason
    activation_key: dict | None = None

    def takes(self) -> tuple[str, ...]:
        """The activations config.json may give the experts (`activation_key`'s `activations`,
        else the family's `activation` alone)."""
        return tuple((self.activation_key or {}).get("activations") or (self.activation,))

    def activation_of(self, config: dict) -> str:
        """The experts' activation for this config.json: the one its `activation_key` gives,
        where the family takes it (`takes`), else the family's `activation`."""
        v = lookup(config, self.activation_key["key"]) if self.activation_key else None
        return v if isinstance(v, str) and v in self.takes() else self.activation

    def activation_refused(self, config: dict) -> str | None:
        """Why config.json's activation (`activation_key`) is refused, or None: it gives one
        the family does not take (`takes`)."""
        if not self.activation_key:
            return None
        key = self.activation_key["key"]
        v = lookup(config, key)
        if v is None or v in self.takes():
            return None
        return f"config.json's {key} is {v!r}: {self.activation_key['refuse']}"

    def value(self, config: dict, name: str) -> object:
        spec = self.router.get(name, ROUTER_DEFAULTS[name])
        if not isinstance(spec, dict):
            return spec
        v = lookup(config, spec["key"])
        v = spec.get("default", ROUTER_DEFAULTS[name]) if v is None else v
        return v == spec["is"] if "is" in spec else v

    def routing(self, config: dict) -> str:
        """The FlashInfer routing method of the family's router for this config.json (as
        vLLM 0.33's get_routing_method_type derives it, fused_moe/config.py)."""
        if self.method:
            return self.method
        scoring = self.value(config, "scoring")
        renorm, bias = bool(self.value(config, "renormalize")), bool(self.value(config, "bias"))
        groups = self.value(config, "groups")
        grouped = bool(groups) and (groups is True or (isinstance(groups, int) and groups > 0))
        if scoring == "sqrtsoftplus":
            return "DeepseekV4" if renorm else "Unspecified"
        if bias:
            if scoring != "sigmoid" or not renorm:
                return "Unspecified"
            return "DeepSeekV3" if grouped else "MiniMax2"
        if scoring == "sigmoid":
            return "SigmoidRenorm" if renorm else "Sigmoid"
        return "RenormalizeNaive" if renorm else "Default"

    def config_fields(self) -> dict[str, str]:
        """The config.json fields the router is read from, each with its kind."""
        return {
            s["key"]: "string" if "is" in s else ROUTER_KINDS[name]
            for name, s in self.router.items()
            if isinstance(s, dict)
        }


ROUTER_KINDS = {
    "scoring": "string",
    "bias": "boolean",
    "renormalize": "boolean",
    "groups": "integer",
}
ROUTER_DEFAULTS: dict[str, object] = {
    "scoring": "softmax",
    "bias": False,
    "renormalize": True,
    "groups": False,
}


def _moe_facts(d: dict) -> MoeFacts:
    r = d.get("routing") or {}
    router = {k: v for k, v in r.items() if k in ROUTER_FIELDS}
    activation, key = d.get("activation", "silu"), d.get("activation_key")
    return MoeFacts(router, r.get("method"), activation, d.get("refuse"), key)


# ------------------------------------------------- a family file of one's own (--family FILE)


class FamilyFileError(ValueError):
    """A family file that does not hold a family: one line naming the field."""


def load_file(path: str | Path) -> Family:
    """A user's family file (`--family FILE.json`), checked field by field."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise FamilyFileError(f"{p}: cannot read the family file ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise FamilyFileError(f"{p}: not a text file; pass a family JSON file") from None
    except json.JSONDecodeError as e:
        raise FamilyFileError(f"{p}: not JSON ({e.msg}, line {e.lineno}); fix the file") from None
    problem = check_family(d)
    if problem:
        raise FamilyFileError(f"{p}: {problem}; fix the family file (docs/architecture.md)")
    return replace(parse(d, p.name), own=True)


def recorded(src: dict) -> Family | None:
    """The family a manifest's `source` names: a user's family file it holds whole
    (`FAMILY_FILE`), else fi-convert's family of that name; None for neither."""
    own = src.get(FAMILY_FILE)
    if isinstance(own, dict) and check_family(own) is None:
        fam = replace(parse(own, FAMILY_FILE), own=True)
        return fam if fam.name == src.get("family") else None
    return next((f for f in all_families() if f.name == src.get("family")), None)


NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
SIZE_KEYS = ("num_experts", "intermediate_size", "hidden_size")
# gated: w1 gate, w3 up, w2 down (or a fused w13 [gate; up]); non-gated: w1 up, w2 down
ROLE_SETS = ({"w1", "w3", "w2"}, {"w13", "w2"}, {"w1", "w2"})


def check_family(d: object) -> str | None:
    """The first field of a family file's JSON that is missing or malformed, said as
    `forms[0].pattern: ...`; None when it holds a family."""
    if not isinstance(d, dict):
        return "not a JSON object"
    for check in (_check_names, _check_config_keys, _check_multiples, _check_forms, _check_moe):
        problem = check(d)
        if problem:
            return problem
    return None


def _strings(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(a, str) and a for a in v)


def _check_names(d: dict) -> str | None:
    unknown = sorted(set(d) - FILE_FIELDS)
    if unknown:
        return f"{unknown[0]}: not a family field (fields: {', '.join(sorted(FILE_FIELDS))})"
    if not (isinstance(d.get("name"), str) and NAME_RE.fullmatch(d["name"])):
        return 'name: missing or not a lower-case name (e.g. "glm4-moe")'
    for key in ("title", "description", "refuse", "layer_configs"):
        if key in d and not isinstance(d[key], str):
            return f"{key}: not a string"
    for key in (
        "model_types",
        "architectures",
        "manifest_keys",
        "clamp_keys",
        "checkpoints",
        "layer_keys",
    ):
        if key in d and not _strings(d[key]):
            return f"{key}: not a list of strings"
    if not (d.get("model_types") or d.get("architectures")):
        return "model_types: the family names no model_type and no architecture to match"
    for k, m in enumerate(d.get("markers", [])):
        if not isinstance(m, str) or _bad_regex(m):
            return f"markers[{k}]: not a regular expression ({_bad_regex(m) or 'not a string'})"
    return None


def _check_config_keys(d: dict) -> str | None:
    keys = d.get("config_keys")
    if not isinstance(keys, dict):
        return "config_keys: missing or not a map of " + ", ".join(SIZE_KEYS)
    for k in SIZE_KEYS:
        if not (_strings(keys.get(k)) and keys[k]):
            return f"config_keys.{k}: missing or not a list of config.json keys"
    extra = sorted(set(keys) - set(SIZE_KEYS))
    return f"config_keys.{extra[0]}: not a size fi-convert reads" if extra else None


def _check_multiples(d: dict) -> str | None:
    """`size_multiples`: config.json fields the family reads for a size (`config_keys`), each
    with a whole multiple of 2 or more."""
    m = d.get("size_multiples")
    if m is None:
        return None
    if not isinstance(m, dict):
        return "size_multiples: not a map of config.json fields to the multiple each holds"
    read = {k for keys in d["config_keys"].values() for k in keys}
    for key, n in m.items():
        if key not in read:
            return f"size_multiples.{key}: not a field config_keys reads"
        if not (_integer(n) and n >= 2):
            return f"size_multiples.{key}: not a whole number of 2 or more"
    return None


def _check_forms(d: dict) -> str | None:
    forms = d.get("forms")
    if not (isinstance(forms, list) and forms):
        return "forms: missing or not a list of expert forms"
    for k, f in enumerate(forms):
        problem = _check_form(f)
        if problem:
            return f"forms[{k}]{problem}"
    return None


FORM_KINDS = ("per_expert", "fused", "stacked", "flat", "per_expert_fused")
# the forms of one tensor per expert and stored role (their pattern names the `expert`)
PER_EXPERT_KINDS = ("per_expert", "per_expert_fused")


def _check_form(f: object) -> str | None:
    if not isinstance(f, dict):
        return ": not a map"
    if f.get("kind") not in FORM_KINDS:
        return f".kind: not one of {', '.join(map(repr, FORM_KINDS))}"
    pat = f.get("pattern")
    why = _bad_regex(pat) if isinstance(pat, str) else "not a string"
    if why:
        return f".pattern: not a regular expression ({why})"
    groups = set(re.compile(str(pat)).groupindex)
    need = {"prefix", "proj"} | ({"expert"} if f["kind"] in PER_EXPERT_KINDS else set())
    if need - groups:
        return f".pattern: no named group {sorted(need - groups)[0]!r} (?P<...>)"
    proj = f.get("projections")
    if not (isinstance(proj, dict) and proj and all(isinstance(v, str) for v in proj.values())):
        return ".projections: missing or not a map of tensor names to w1, w3, w2 or w13"
    if set(proj.values()) not in ROLE_SETS:
        return (
            f".projections: maps to {sorted(set(proj.values()))}, not w1, w3, w2 or w13, w2 "
            "(or w1, w2: a non-gated expert's up and down)"
        )
    problem = _per_expert_roles(f["kind"], set(proj.values()))
    if problem:
        return problem
    if "refuse" in f and not isinstance(f["refuse"], str):
        return ".refuse: not a string"
    if "transposed" in f and not (
        _strings(f["transposed"]) and set(f["transposed"]) <= set(proj.values())
    ):
        return ".transposed: not a list of the form's roles (w1, w3, w2, w13) stored [in, out]"
    if f.get("transposed") and f["kind"] == "per_expert":
        return (
            ".transposed: a per_expert form's matrices are read as stored, [out, in] "
            "(nn.Linear's); one stored [in, out] is not read turned"
        )
    if "params" in f and not (
        isinstance(f["params"], dict)
        and all(isinstance(v, str) and v for v in f["params"].values())
    ):
        return ".params: not a map of the checkpoint's parameter names to the schemes' names"
    problem = _check_interleaved(f)
    if problem:
        return problem
    if "module" in f and not isinstance(f["module"], str):
        return ".module: not a string (appended to the prefix to name the server's MoE module)"
    if "expert_sets" in f and not (
        _strings(f["expert_sets"]) and f["kind"] == "per_expert" and len(f["expert_sets"]) > 1
    ):
        return (
            ".expert_sets: not a list of two or more MoE modules (appended to the prefix) of a "
            "per_expert form"
        )
    return None


def _per_expert_roles(kind: str, roles: set[str]) -> str | None:
    """A per-expert form's roles: per_expert keeps w1, w3 and w2 apart (or w1, w2 non-gated),
    per_expert_fused holds one [gate; up] w13 and one w2 per expert."""
    if kind == "per_expert_fused" and roles != {"w13", "w2"}:
        return (
            f".projections: maps to {sorted(roles)}, but a per_expert_fused form holds one w13 "
            "([gate; up]) and one w2 per expert"
        )
    if kind == "per_expert" and "w13" in roles:
        return (
            ".projections: maps to w13, but a per_expert form keeps w1, w3 and w2 apart (one "
            '[gate; up] tensor per expert is kind "per_expert_fused")'
        )
    return None


def _check_interleaved(f: dict) -> str | None:
    """`interleaved`: true or false, and true only where a fused form's w13 is stored [out, in]
    (its rows are what interleave)."""
    if "interleaved" not in f:
        return None
    if not isinstance(f["interleaved"], bool):
        return ".interleaved: not true or false (w13's gate and up rows interleaved)"
    if f["interleaved"] and f["kind"] != "fused":
        return (
            ".interleaved: only a fused form's w13 holds gate and up rows interleaved (kind "
            f"is {f['kind']!r})"
        )
    if f["interleaved"] and "w13" in f.get("transposed", ()):
        return ".interleaved: w13's rows interleave only where it is stored [out, in], not turned"
    return None


def _check_moe(d: dict) -> str | None:
    if "released_config" in d and not isinstance(d["released_config"], dict):
        return "released_config: not a map (config.json values as the public checkpoints set them)"
    if "activation" in d and d["activation"] not in ACTIVATIONS:
        return f"activation: not one of {', '.join(ACTIVATIONS)}"
    problem = _check_activation_key(d)
    if problem:
        return problem
    act = d.get("activation", "silu")
    for k, f in enumerate(d.get("forms", [])):
        roles = set(f.get("projections", {}).values())
        if (roles == {"w1", "w2"}) == gated(act):
            why = (
                f"maps to w1 and w2 only (a non-gated expert), but the activation {act} is gated"
                if gated(act)
                else f"has a gate, but the activation {act} is non-gated (map its up "
                "projection to w1 and down to w2)"
            )
            return f"forms[{k}].projections: {why}"
    r = d.get("routing", {})
    if not isinstance(r, dict):
        return "routing: not a map"
    for key, spec in r.items():
        problem = _check_router_field(key, spec)
        if problem:
            return f"routing.{key}{problem}"
    return None


def _check_activation_key(d: dict) -> str | None:
    """`activation_key`: `{"key": field, "refuse": why}`, and `activations`, where present, a
    list of activations fi-convert knows that holds the family's `activation` and whose
    gating is its (one form's roles serve them all)."""
    ak = d.get("activation_key")
    if ak is None:
        return None
    if not (
        isinstance(ak, dict)
        and {"key", "refuse"} <= set(ak) <= {"key", "refuse", "activations"}
        and all(isinstance(ak[k], str) and ak[k] for k in ("key", "refuse"))
    ):
        return (
            'activation_key: not {"key": a config.json field, "refuse": why another is, '
            '"activations": the ones it may give (optional)}'
        )
    if "activations" not in ak:
        return None
    acts, act = ak["activations"], d.get("activation", "silu")
    if not (_strings(acts) and acts and set(acts) <= set(ACTIVATIONS)):
        return f"activation_key.activations: not a list of activations ({', '.join(ACTIVATIONS)})"
    if act not in acts:
        return f"activation_key.activations: does not list the family's activation {act}"
    mixed = next((a for a in acts if gated(a) != gated(act)), None)
    if mixed:
        return (
            f"activation_key.activations: {mixed} is "
            f"{'gated' if gated(mixed) else 'non-gated'}, the family's activation {act} is not"
        )
    return None


def _check_router_field(key: str, spec: object) -> str | None:
    if key == "method":
        return None if spec in ROUTING_METHODS else f": not one of {', '.join(ROUTING_METHODS)}"
    if key not in ROUTER_FIELDS:
        return f": not a router field ({', '.join((*ROUTER_FIELDS, 'method'))})"
    if isinstance(spec, dict):
        if not (isinstance(spec.get("key"), str) and set(spec) <= {"key", "default", "is"}):
            return ': not {"key": a config.json field, "default": a value, "is": a value}'
        if "is" in spec:
            return None if isinstance(spec["is"], str) else ".is: not a string"
        spec = spec.get("default", ROUTER_DEFAULTS[key])
    if key == "scoring":
        return None if spec in SCORINGS else f": not one of {', '.join(SCORINGS)}"
    ok = isinstance(spec, bool) or (key == "groups" and KINDS["integer"](spec))
    return None if ok else ": not true or false"


def _bad_regex(p: object) -> str | None:
    if not isinstance(p, str):
        return "not a string"
    try:
        re.compile(p)
    except re.error as e:
        return str(e)
    return None


FILE_FIELDS = frozenset(
    {
        "name", "title", "description", "checkpoints", "model_types", "architectures",
        "markers", "config_keys", "manifest_keys", "clamp_keys", "forms", "routing",
        "activation", "activation_key", "refuse", "released_config", "layer_keys",
        "layer_configs", "size_multiples",
    }
)  # fmt: skip
