"""fi_convert/servers/sglang/coverage.json against SGLang 0.5.23's own registry of model
architectures: `sglang.srt.models.registry.ModelRegistry` imports each module of
sglang.srt.models and takes its `EntryClass` (a class or a list of them) by class name. The
modules are read here as text, not imported (most need a GPU, or the stand-ins of
tests/sglang_stubs.py): each module's `EntryClass` assignment gives the class names (an alias,
`A = B` or `import B as A`, its class's own name), and a module builds MoE layers where it names
FusedMoE, get_moe_impl_class, DeepEPMoE or FlashInferFusedMoE (SGLang's models build their MoE
layer with one of them; a model that calls the fused_moe function itself, AFMoE's, builds
none), or where its code (its import lines aside) uses a class or function it imports from
another module of sglang.srt.models that does, itself or through what it uses in turn (Mellum's
decoder layers are Qwen3-MoE's, HY v4's MoE block DeepSeek-V2's: read by their text alone,
the first rule missed both; a name used for a helper alone counts too, as EmbeddingGemma 2's
use of Gemma 4's weight-name remapping: its entry says it builds none). Each such architecture
is either named by a family file or listed with its kind and reason (tests/
test_family_coverage.py holds the file to the family files)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from importlib import metadata
from pathlib import Path

from fi_convert.servers.coverage import coverage, family_architectures

MOE = re.compile(r"\b(FusedMoE|get_moe_impl_class|DeepEPMoE|FlashInferFusedMoE)\b")
MODELS = "sglang.srt.models"


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


@functools.cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text)


def _module_file(module: str) -> Path:
    """The file of a module of sglang.srt.models (a package: its __init__.py)."""
    p = _models().joinpath(*module.split(".")[3:])
    return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")


@functools.cache
def _imported(path: Path) -> dict[str, tuple[str, str]]:
    """The names a module imports from other modules of sglang.srt.models: local name ->
    (module, name there)."""
    tree = _parsed(path)[1]
    return {
        a.asname or a.name: (module, a.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (module := _absolute(path, node)).startswith(MODELS + ".")
        for a in node.names
    }


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an import names, a relative one (`from .granitemoe import ...`) resolved
    against the importing module's package."""
    if not node.level:
        return node.module or ""
    parts = ["sglang", *path.relative_to(_models().parents[1]).with_suffix("").parts]
    package = parts[:-1]  # (a package's __init__ is its package's own module)
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


@functools.cache
def _defined(path: Path) -> dict[str, ast.stmt]:
    """A module's top-level classes, functions and assigned names."""
    out: dict[str, ast.stmt] = {}
    for node in _parsed(path)[1].body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out |= {t.id: node for t in node.targets if isinstance(t, ast.Name)}
    return out


def _used(nodes) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _builds_moe(path: Path, name: str, seen: frozenset = frozenset()) -> bool:
    """Whether `name`, defined in or imported by the module at `path`, builds MoE layers: its
    definition names one of SGLang's MoE layer classes, or uses a name that does."""
    if (path, name) in seen:
        return False
    if (path, name) not in _BUILDS:
        _BUILDS[path, name] = _reads_moe(path, name, seen | {(path, name)})
    return _BUILDS[path, name]


_BUILDS: dict[tuple[Path, str], bool] = {}


def _reads_moe(path: Path, name: str, seen: frozenset) -> bool:
    node, imported = _defined(path).get(name), _imported(path)
    if node is None:
        module, there = imported.get(name, ("", ""))
        file = _module_file(module) if module else None
        return bool(file and file.exists() and _builds_moe(file, there, seen))
    lines = _parsed(path)[0].splitlines()[node.lineno - 1 : node.end_lineno]
    if MOE.search("\n".join(lines)):
        return True
    local = _defined(path).keys() | imported.keys()
    return any(_builds_moe(path, u, seen) for u in sorted(_used([node]) & local - {name}))


@functools.cache
def builds_moe(path: Path) -> bool:
    """Whether a module of sglang.srt.models builds MoE layers (the module docstring's rule)."""
    text, tree = _parsed(path)
    if MOE.search(text):
        return True
    body = [n for n in tree.body if not isinstance(n, ast.Import | ast.ImportFrom)]
    return any(_builds_moe(path, u) for u in _used(body) & _imported(path).keys())


@functools.cache
def registry() -> dict[str, bool]:
    """Each architecture of SGLang's registry, and whether its module builds MoE layers."""
    out: dict[str, bool] = {}
    for p in sorted(_models().glob("*.py")):
        moe = builds_moe(p)
        for arch in entry_classes(_parsed(p)[1]):
            assert arch not in out, f"{arch} twice"  # (SGLang's registry asserts so too)
            out[arch] = moe
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


def test_a_module_that_imports_its_moe_block_builds_moe_layers():
    """Mellum's decoder layers are Qwen3-MoE's (models/mellum.py imports them) and HY v4's MoE
    block is DeepSeek-V2's (models/hunyuan_v4.py): neither module names a MoE layer class, both
    build MoE layers; a module that imports only dense parts of another (Qwen3's: Qwen2's MLP
    and model) builds none."""
    archs = registry()
    assert archs["MellumForCausalLM"] and archs["HYV4ForCausalLM"]
    assert archs["Qwen3_5MoeForCausalLM"]  # (models/qwen3_5_text.py: Qwen2-MoE's block)
    # (models/granitemoehybrid.py: `from .granitemoe import GraniteMoeMoE`, a relative import)
    assert archs["GraniteMoeHybridForCausalLM"]
    assert not archs["Qwen3ForCausalLM"]
    assert "HYV4ForCausalLM" in coverage("sglang").moe_architectures


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
