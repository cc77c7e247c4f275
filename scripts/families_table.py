"""docs/converting.md's table of model families, generated from fi_convert/families/*.json and
the servers' facts (fi_convert/servers/<name>/): each family's architectures, public
checkpoints, router (the FlashInfer routing method it gives), activation, and the schemes and
backends each server runs it with on FlashInfer, or why not.

    python scripts/families_table.py           # rewrite the table in docs/converting.md
    python scripts/families_table.py --check   # exit 1 where the doc differs (a test runs it)
"""

from __future__ import annotations

import sys
from pathlib import Path

from fi_convert.families import ROUTER_DEFAULTS, Family, MoeFacts, all_families, gated
from fi_convert.schemes import REGISTRY
from fi_convert.server_lookup import resolve

DOC = Path(__file__).resolve().parents[1] / "docs" / "converting.md"
BEGIN, END = "<!-- families:begin (scripts/families_table.py) -->", "<!-- families:end -->"
# the quantization method of each scheme's source, for the servers' source refusals (SGLang:
# ModelOpt FP8 on TRT-LLM needs a routing method its model class declares)
SOURCE_METHOD = {"fp8-tensor": "modelopt", "nvfp4": "modelopt", "mxfp8": "modelopt"}


def routing(fam: Family) -> str:
    """The routing method of the family's router under its public checkpoints' config.json
    (`released_config`), and the fields it is read from."""
    method = fam.moe.routing(fam.source.get("released_config", {}))
    keys = [s["key"] for s in fam.moe.router.values() if isinstance(s, dict)]
    return f"{method} (by {', '.join(keys)})" if keys else method


def router_text(moe: MoeFacts) -> str:
    """`sigmoid + bias + renormalize (norm_topk_prob) + groups`."""
    if moe.method:
        return f"its own ({moe.method})"
    parts = []
    for name in ("scoring", "bias", "renormalize", "groups"):
        spec = moe.router.get(name, ROUTER_DEFAULTS[name])
        if isinstance(spec, dict):
            word = spec.get("default", ROUTER_DEFAULTS[name]) if name == "scoring" else name
            parts.append(f"{word} ({spec['key']})")
        elif name == "scoring":
            parts.append(str(spec))
        elif spec:
            parts.append(name)
    return " + ".join(parts)


def schemes_of(fam: Family) -> list[str]:
    """The schemes that read the family's experts: gpt-oss's fused MXFP4 ones mxfp4 alone,
    the others every scheme but mxfp4 that reads one of the family's forms
    (`Scheme.form_kinds`: fp8-tensor and nvfp4 read per-expert tensors only); non-gated
    experts, the schemes that write a layout of them (`Scheme.non_gated`)."""
    mxfp4 = any("blocks" in f.pattern.pattern for f in fam.forms)
    both = gated(fam.moe.activation)
    kinds = {f.kind for f in fam.forms}
    return [
        s.value
        for s, scheme in REGISTRY.items()
        if (s.value == "mxfp4") == mxfp4
        and (both or scheme.non_gated)
        and (scheme.form_kinds is None or kinds & set(scheme.form_kinds))
    ]


def served(fam: Family, server: str) -> str:
    """`bf16 (trtllm, cutlass), fp8-block (trtllm, cutlass), ...` for the server, or why not:
    what the plan takes for a checkpoint of the family whose config.json is its public
    checkpoints' (`released_config`), from the same facts (its router's routing method, the
    experts' activation and SwiGLU clamp, `Family.swiglu_limit`, as source.py reads them); an
    architecture of the family the server refuses whole where it serves another (SGLang:
    Step-3's text model, not Step3-VL) said after them."""
    if fam.moe.refuse:
        return "refused: " + fam.moe.refuse.split(";")[0]
    released = fam.source.get("released_config", {})
    routing, clamp = fam.moe.routing(released), fam.swiglu_limit(released)
    target, out = resolve(server), []
    whole = {a: target.refuses_source("bf16", "trtllm", None, (a,)) for a in fam.architectures}
    archs = [a for a, why in whole.items() if not why] or list(fam.architectures)
    for name in schemes_of(fam):
        ok = [
            b.value
            for b in REGISTRY[name].backends  # type: ignore[index]
            if not (
                target.refuses(name, b.value)
                or target.refuses_source(
                    name,
                    b.value,
                    SOURCE_METHOD.get(name),
                    archs,
                )  # fmt: skip
                or target.refuses_moe(name, b.value, routing, fam.moe.activation, clamp)
            )
        ]
        if ok:
            out.append(f"{name} ({', '.join(ok)})")
    # a whole family (SGLang's AFMoE)
    why = target.refuses_source("bf16", "trtllm", None, fam.architectures)
    if not out:
        return "refused: " + why.split(";")[0] if why else "none"
    apart = [f"`{a}` refused: {w.split(';')[0]}" for a, w in whole.items() if w and a not in archs]
    return "; ".join([", ".join(out), *apart])


def activation(fam: Family) -> str:
    """The experts' activation; where config.json says it (`activation_key`), its field, any
    other value of which is refused; the others it may give (`activations`), each refused or
    not by each server's facts."""
    key = (fam.moe.activation_key or {}).get("key")
    if not key:
        return fam.moe.activation
    others = [a for a in fam.moe.takes() if a != fam.moe.activation]
    also = f", or {' or '.join(others)}: each server's reason" if others else ""
    return f"{fam.moe.activation} ({key}{also}; any other refused)"


def row(fam: Family) -> str:
    archs = ", ".join(f"`{a}`" for a in fam.architectures) or "-"
    ckpts = ", ".join(fam.source.get("checkpoints", [])) or "-"
    cells = [fam.title, archs, ckpts, f"{router_text(fam.moe)}: {routing(fam)}"]
    clamp = fam.swiglu_limit(fam.source.get("released_config", {}))
    act = activation(fam) + (f" clamped (swiglu_limit {clamp:g})" if clamp else "")
    cells += [act, served(fam, "vllm"), served(fam, "sglang")]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def table() -> str:
    head = (
        "| family | architectures | public checkpoints | router: FlashInfer routing | "
        "activation | vLLM 0.33 on FlashInfer | SGLang 0.5.23 on FlashInfer |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(row(f) for f in sorted(all_families(), key=lambda f: f.title)) + "\n"


def rewritten(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + table() + text[end:]


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = rewritten(text)
    if "--check" in argv:
        if new != text:
            print(f"{DOC}: the families table is out of date; run scripts/families_table.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
