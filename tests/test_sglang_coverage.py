"""fi_convert/servers/sglang/coverage.json against SGLang 0.5.23's own registry of model
architectures: `sglang.srt.models.registry.ModelRegistry` imports each module of
sglang.srt.models and takes its `EntryClass` (a class or a list of them) by class name. The
modules are read here as text, not imported (most need a GPU, or the stand-ins of
tests/sglang_stubs.py): each module's `EntryClass` assignment gives the class names (an alias,
`A = B` or `import B as A`, its class's own name), and a module that names FusedMoE,
get_moe_impl_class, DeepEPMoE or FlashInferFusedMoE builds MoE layers (SGLang's models build
their MoE layer with one of them; a model that calls the fused_moe function itself, AFMoE's,
builds none). Each such architecture is either named by a family file or listed with its kind
and reason (tests/test_family_coverage.py holds the file to the family files)."""

from __future__ import annotations

import ast
import importlib.util
import re
from importlib import metadata
from pathlib import Path

from fi_convert.servers.coverage import coverage, family_architectures

MOE = re.compile(r"\b(FusedMoE|get_moe_impl_class|DeepEPMoE|FlashInferFusedMoE)\b")


def _models() -> Path:
    spec = importlib.util.find_spec("sglang")  # (the package found, not imported)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "srt" / "models"


def entry_classes(tree: ast.Module) -> list[str]:
    """The class names a module's `EntryClass` gives SGLang's registry."""
    alias: dict[str, str] = {}
    entry: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            alias |= {a.asname: a.name for a in node.names if a.asname}
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            continue
        target, value = node.targets[0].id, node.value
        if target == "EntryClass":
            items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            entry = [e.id for e in items if isinstance(e, ast.Name)]
            assert len(entry) == len(items), ast.unparse(value)
        elif isinstance(value, ast.Name):
            alias[target] = value.id
    return [alias.get(e, e) for e in entry]


def registry() -> dict[str, bool]:
    """Each architecture of SGLang's registry, and whether its module builds MoE layers."""
    out: dict[str, bool] = {}
    for p in sorted(_models().glob("*.py")):
        text = p.read_text()
        for arch in entry_classes(ast.parse(text)):
            assert arch not in out, f"{arch} twice"  # (SGLang's registry asserts so too)
            out[arch] = bool(MOE.search(text))
    return out


def test_the_file_records_sglangs_moe_architectures():
    assert metadata.version("sglang") == coverage("sglang").release
    moe = sorted(a for a, m in registry().items() if m)
    assert list(coverage("sglang").moe_architectures) == moe


def test_the_registry_is_read_whole():
    """The text reading finds the architectures SGLang's model classes are known by."""
    archs = registry()
    assert len(archs) > 250
    assert archs["DeepseekV3ForCausalLM"] and archs["Glm4MoeForCausalLM"]
    assert not archs["AfmoeForCausalLM"] and not archs["LlamaForCausalLM"]


def test_every_moe_architecture_is_a_familys_or_listed():
    cov, named = coverage("sglang"), family_architectures()
    moe = [a for a, m in registry().items() if m]
    missing = [a for a in moe if a not in named and a not in cov.uncovered]
    assert missing == [], "add a family, or list them with their kind and reason"


def test_a_family_sglang_has_no_class_for_is_refused_for_it():
    """A family's architectures SGLang's registry lacks (Aria, Jamba) are refused for
    `--server sglang` (fi_convert/servers/sglang/target.py says why)."""
    from fi_convert.families import all_families
    from fi_convert.servers.sglang.target import SGLANG_TARGET

    archs = registry()
    for fam in all_families():
        if fam.architectures and not any(a in archs for a in fam.architectures):
            assert fam.moe.refuse or SGLANG_TARGET.refuses_source(
                "bf16", "trtllm", None, fam.architectures
            )
