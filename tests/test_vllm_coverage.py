"""fi_convert/servers/vllm/coverage.json against vLLM's own registry of model architectures
(`vllm.model_executor.models.registry._VLLM_MODELS`, architecture -> (module, class)): every
architecture whose model module (a module of vllm.model_executor.models, or a package of
vllm.models read whole) builds MoE layers is recorded as such, and is either named by a family
file or listed with its kind and reason (tests/test_family_coverage.py holds the file to the
family files). A module builds MoE layers where it names FusedMoE (vLLM's models build their MoE
layer as FusedMoE or through FusedMoEFactory), or where its code (its import lines aside) uses a
class or function it imports from another module of vllm.model_executor.models or vllm.models
that does, itself or through what it uses in turn (SGLang's rule, tests/test_sglang_coverage.py),
or where it builds through vLLM's registry (init_vllm_registered_model) an architecture it names
that does: the Qwen3-Omni thinker's language model is Qwen3-MoE's, Qwen3.5's and Qwen4 Exp's
decoder layers Qwen3-Next's, GLM-4.5V's language model Glm4MoeForCausalLM (models/glm4_1v.py);
Step3-VL's Step3TextForCausalLM (named by the config module models/step3_vl.py imports, its
text config's architectures); reading each module's text alone missed them. The modules are
read as text, not imported. (Step-3.7's language model is Step-3.5's by its checkpoint's
text_config, which vLLM's text does not name: the rule misses it, and coverage.json with it;
servers/vllm/target.py refuses it.)"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import vllm
from vllm.model_executor.models.registry import _VLLM_MODELS

from fi_convert.servers.coverage import coverage, family_architectures

ROOT = Path(vllm.__file__).parent
MODELS = ("vllm.model_executor.models.", "vllm.models.")
MOE = re.compile("FusedMoE")  # (FusedMoE, FusedMoEFactory: a name it begins)
WHOLE = "*"  # a module's own code, its import lines aside


def _file(module: str) -> Path | None:
    """The file of a dotted module of vLLM (a package: its __init__.py), None if none."""
    p = ROOT.joinpath(*module.split(".")[1:])
    if p.is_dir():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


@functools.cache
def _text(path: Path) -> str:
    return path.read_text()


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(_text(path))


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an import names, a relative one resolved from the importing file."""
    if not node.level:
        return node.module or ""
    package = list(path.relative_to(ROOT.parent).parent.parts)
    package = package[: len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


@functools.cache
def _imported(path: Path) -> dict[str, tuple[str, str]]:
    """The names a module imports from modules of vLLM's models: local name -> (module, name
    there)."""
    return {
        a.asname or a.name: (module, a.name)
        for node in ast.walk(_parsed(path))
        if isinstance(node, ast.ImportFrom) and (module := _absolute(path, node)).startswith(MODELS)
        for a in node.names
    }


@functools.cache
def _defined(path: Path) -> dict[str, ast.stmt]:
    """A module's top-level classes, functions and assigned names."""
    out: dict[str, ast.stmt] = {}
    for node in _parsed(path).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out |= {t.id: node for t in node.targets if isinstance(t, ast.Name)}
    return out


@functools.cache
def _used(path: Path, name: str) -> frozenset[str]:
    """The names `name`'s code uses (WHOLE: the module's code, its import lines aside)."""
    body = _parsed(path).body
    nodes = [n for n in body if not isinstance(n, ast.Import | ast.ImportFrom)]
    nodes = nodes if name == WHOLE else [_defined(path)[name]]
    return frozenset(n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name))


# an import statement: its module (dots for a relative one) and what it imports
IMPORT = re.compile(r"^\s*from\s+(\.*[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)", re.M)


def _may_build_moe(path: Path, seen: frozenset = frozenset()) -> bool:
    """Whether the module at `path` names FusedMoE, or imports from a module of vLLM's models
    that may (read off the text, without parsing it: most modules need no parse)."""
    if path in seen:
        return False
    if path not in _MAY:
        _MAY[path] = bool(MOE.search(_text(path))) or any(
            (file := _file(f"{module}.{name}") or _file(module)) is not None
            and _may_build_moe(file, seen | {path})
            for module, names in _imports_read(path)
            for name in re.findall(r"\w+", names.split(" as ")[0])[:1] or [""]
        )
    return _MAY[path]


def _imports_read(path: Path) -> list[tuple[str, str]]:
    out = []
    for m in IMPORT.finditer(_text(path)):
        module = m.group(1)
        if module.startswith("."):
            level = len(module) - len(module.lstrip("."))
            package = list(path.relative_to(ROOT.parent).parent.parts)
            package = package[: len(package) - level + 1]
            module = ".".join(package + ([module.lstrip(".")] if module.lstrip(".") else []))
        if module.startswith(MODELS):
            out += [(module, n) for n in m.group(2).strip("()").split(",") if n.strip()]
    return out


_MAY: dict[Path, bool] = {}
_BUILDS: dict[tuple[Path, str], bool] = {}


def _builds_moe(path: Path, name: str, seen: frozenset = frozenset()) -> bool:
    """Whether `name` (WHOLE: the module), defined in or imported by the module at `path`,
    builds MoE layers: its code names FusedMoE, or uses a name that does."""
    if (path, name) in seen or not _may_build_moe(path):
        return False
    if (path, name) not in _BUILDS:
        _BUILDS[path, name] = _reads_moe(path, name, seen | {(path, name)})
    return _BUILDS[path, name]


def _reads_moe(path: Path, name: str, seen: frozenset) -> bool:
    text = _text(path)
    if name == WHOLE and MOE.search(text):
        return True
    node, imported = _defined(path).get(name), _imported(path)
    if name == WHOLE:
        return any(_builds_moe(path, u, seen) for u in sorted(_used(path, name) & imported.keys()))
    if node is None:  # imported: a name of another module, or a module itself
        module, there = imported.get(name, ("", ""))
        if (file := _file(f"{module}.{there}")) is not None:
            return _builds_moe(file, WHOLE, seen)
        file = _file(module) if module else None
        return bool(file and _builds_moe(file, there, seen))
    if MOE.search("\n".join(text.splitlines()[node.lineno - 1 : node.end_lineno])):
        return True
    local = _defined(path).keys() | imported.keys()
    return any(_builds_moe(path, u, seen) for u in sorted(_used(path, name) & local - {name}))


def _files(module: str) -> list[Path]:
    """The files of a registry entry's module (relative to vllm.model_executor.models, or
    absolute: `vllm.models.deepseek_v4`, a package: every file of it)."""
    if not module.startswith("vllm."):
        module = f"vllm.model_executor.models.{module}"
    p = ROOT.joinpath(*module.split(".")[1:])
    return sorted(p.rglob("*.py")) if p.is_dir() else [p.with_suffix(".py")]


def builds_moe(module: str) -> bool:
    """Whether a registry entry's module builds MoE layers by what it defines or imports."""
    files = _files(module)
    if any(MOE.search(_text(f)) for f in files):
        return True
    return any(_builds_moe(f, WHOLE) for f in files)


CONFIG_IMPORT = re.compile(r"^from (vllm\.transformers_utils\.configs\.\w+) import", re.M)


def nested(module: str) -> set[str]:
    """The architectures of the registry a module names where it builds a model through the
    registry (init_vllm_registered_model): a string of its code (GLM-4.1V's language model,
    Glm4MoeForCausalLM for a glm4v_moe config), or of a vLLM config module it imports, whose
    text config names its architecture (Step3-VL's language model: Step3TextConfig's
    architectures, Step3TextForCausalLM)."""
    files = [f for f in _files(module) if "init_vllm_registered_model" in _text(f)]
    configs = {
        ROOT.joinpath(*m.group(1).split(".")[1:]).with_suffix(".py")
        for f in files
        for m in CONFIG_IMPORT.finditer(_text(f))
    }
    texts = [_text(f) for f in files] + [_text(c) for c in sorted(configs) if c.exists()]
    return {a for t in texts for a in re.findall(r"[\"'](\w+)[\"']", t) if a in _VLLM_MODELS}


@functools.cache
def moe_architectures() -> list[str]:
    moe = {a for a, (module, _) in _VLLM_MODELS.items() if builds_moe(module)}
    while grown := {
        a for a, (module, _) in _VLLM_MODELS.items() if a not in moe and nested(module) & moe
    }:
        moe |= grown
    return sorted(moe)


def test_the_file_records_vllms_moe_architectures():
    assert vllm.__version__.startswith(coverage("vllm").release.rsplit(".", 1)[0])
    assert list(coverage("vllm").moe_architectures) == moe_architectures()


def test_a_module_that_imports_or_nests_its_moe_block_builds_moe_layers():
    """Modules that name no FusedMoE and build MoE layers: by a class they import (the
    Qwen3-Omni thinker's Qwen3MoeForCausalLM, Qwen3.5's and Qwen4 Exp's Qwen3-Next decoder
    layers, Granite-MoE-Shared's GraniteMoeMoE), or by an architecture they build through the
    registry (GLM-4.5V's Glm4MoeForCausalLM); a module that imports only dense parts of another
    (Qwen3's: Qwen2's MLP and model) builds none."""
    found = moe_architectures()
    for arch in [
        "Qwen3OmniMoeForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "GraniteMoeSharedForCausalLM",
        "Glm4vMoeForConditionalGeneration",
    ]:
        assert arch in found
        assert not any(MOE.search(_text(f)) for f in _files(_VLLM_MODELS[arch][0])), arch
    assert "Glm4MoeForCausalLM" in nested(_VLLM_MODELS["Glm4vMoeForConditionalGeneration"][0])
    # (its language model's architecture named by the config module it imports, not by it)
    step3_vl = _VLLM_MODELS["Step3VLForConditionalGeneration"][0]
    assert "Step3VLForConditionalGeneration" in found and "Step3TextForCausalLM" in nested(step3_vl)
    assert "Step3TextForCausalLM" not in _text(_files(step3_vl)[0])
    assert "Qwen3ForCausalLM" not in found and "LlamaForCausalLM" not in found
    assert len(found) > 190


def test_every_moe_architecture_is_a_familys_or_listed():
    cov, named = coverage("vllm"), family_architectures()
    missing = [a for a in moe_architectures() if a not in named and a not in cov.uncovered]
    assert missing == [], "add a family, or list them with their kind and reason"


def test_every_familys_architecture_is_in_vllms_registry():
    """No family names an architecture vLLM has no class for (a typo would match nothing),
    but those its facts list as SGLang's alone (NO_MODEL_CLASS), which fi-convert refuses to
    convert for vLLM, in one line naming the server to convert for."""
    from fi_convert.servers.vllm.target import NO_MODEL_CLASS, VllmTarget

    assert sorted(set(family_architectures()) - set(_VLLM_MODELS)) == sorted(NO_MODEL_CLASS)
    for arch in NO_MODEL_CLASS:
        why = VllmTarget().refuses_source("bf16", "cutlass", None, [arch])
        assert why == (
            f"vLLM 0.33 has no model class for {NO_MODEL_CLASS[arch]} ({arch}); "
            "convert with --server sglang"
        )


def test_the_generic_transformers_backend_is_listed_as_such():
    cov = coverage("vllm")
    moe = [a for a, (m, c) in _VLLM_MODELS.items() if m == "transformers" and "MoE" in c]
    moe = [a for a in moe if not _VLLM_MODELS[a][1].endswith("MTP")]  # (a draft model)
    named = family_architectures()
    assert moe and {cov.uncovered[a].kind for a in moe if a not in named} == {"transformers"}


def test_a_familys_transformers_backend_architecture_runs_custom_routings_kernels_for_vllm():
    """The families' architectures that vLLM 0.33 serves through its generic Transformers
    backend: where its MoEBlockFuser leaves the block's router to the model (Hunyuan-A13B,
    Kolibri1: Custom routing, tests/test_vllm_families.py shows it), planned for vLLM only on
    the kernels that take Custom routing, refused elsewhere naming the backend; where the fuser
    takes the router over (FlexOlmo, Mellum), planned by the family's routing data alone."""
    from fi_convert.servers.vllm.target import TRANSFORMERS_BACKEND, VllmTarget

    named = family_architectures()
    moe = [a for a, (m, c) in _VLLM_MODELS.items() if m == "transformers" and a in named]
    assert sorted(TRANSFORMERS_BACKEND) == ["HunYuanMoEV1ForCausalLM", "Kolibri1ForCausalLM"]
    assert sorted(moe) == sorted(
        [*TRANSFORMERS_BACKEND, "FlexOlmoForCausalLM", "MellumForCausalLM"]
    )
    for a in moe:
        why = VllmTarget().refuses_source("bf16", "trtllm", None, [a])
        assert (a in TRANSFORMERS_BACKEND) == bool(why)
        assert not why or ("generic Transformers backend" in why and "Custom routing" in why)
        assert VllmTarget().refuses_source("bf16", "cutlass", None, [a]) is None
