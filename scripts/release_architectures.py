"""Write (or with --check, check) the installed server release's entry of
fi_convert/servers/<server>/architectures.json: every architecture of its model registry, and
those whose own config loading refuses a family's config.json as transformers writes it (the
tests' checkpoints' configs, tests/hf_checkpoints.py), with its message. Run it with the
release's venv's interpreter (scripts/release_env.sh), the clone on PYTHONPATH:

    PYTHONPATH=$PWD $(scripts/release_env.sh vllm 0.30.0)/bin/python \
        scripts/release_architectures.py vllm
    .venv/bin/python scripts/release_architectures.py sglang --check   # exit 1 if stale

tests/test_release_architectures.py checks the installed release's entry the same way.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fi_convert.families import all_families  # noqa: E402
from fi_convert.servers import installed_registry as installed  # noqa: E402
from fi_convert.servers.architectures import FILE  # noqa: E402

REGISTRY = {
    "vllm": "vllm.model_executor.models.registry.ModelRegistry.get_supported_archs()",
    "sglang": "sglang.srt.models.registry: each module of sglang/srt/models, its EntryClass "
    "(read as text)",
}


def family_configs(folder: Path, registry: frozenset[str]) -> dict[str, Path]:
    """A config.json of each tests' checkpoint kind (tests/hf_checkpoints.MODELS: transformers'
    config class at the tests' sizes, saved by transformers) whose architecture a family names
    and the registry holds, by architecture."""
    import transformers

    from tests import hf_checkpoints as hc

    named = {a for f in all_families() for a in f.architectures}
    out: dict[str, Path] = {}
    for kind, (config_cls, model_cls, own) in sorted(hc.MODELS.items()):
        arch = hc.RELEASED_ARCHITECTURES.get(kind, [model_cls])[0]
        if arch not in named or arch not in registry or not hasattr(transformers, config_cls):
            continue
        with hc.transformers_own_rope():
            config = getattr(transformers, config_cls)(**(hc.COMMON | own))
        config.architectures = [arch]
        config.save_pretrained(folder / kind)
        path = folder / kind / "config.json"
        if kind in hc.RELEASED_CONFIG:
            path.write_text(json.dumps(hc.RELEASED_CONFIG[kind](json.loads(path.read_text()))))
        out[arch] = folder / kind
    return out


def entry(server: str) -> dict:
    """The installed release's entry."""
    registry = installed.architectures(server)
    with tempfile.TemporaryDirectory(prefix="fi-convert-archs-") as tmp:
        refuses = installed.refusals(server, family_configs(Path(tmp), registry))
    return {"architectures": sorted(registry), "refuses": dict(sorted(refuses.items()))}


def path_of(server: str) -> Path:
    return ROOT / "fi_convert" / "servers" / server / FILE


def written(server: str, release: str, new: dict) -> str:
    """The file's text with the release's entry replaced by `new`."""
    path = path_of(server)
    d = json.loads(path.read_text()) if path.exists() else {}
    releases = dict(d.get("releases", {}))
    releases[release] = new
    from packaging.version import Version

    d = {
        "server": server,
        "registry": REGISTRY[server],
        "written_by": "scripts/release_architectures.py, in each release's venv",
        "releases": dict(sorted(releases.items(), key=lambda kv: Version(kv[0]))),
    }
    return json.dumps(d, indent=1) + "\n"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in REGISTRY:
        print("usage: release_architectures.py vllm|sglang [--check]", file=sys.stderr)
        return 2
    server, release = argv[0], installed.version(argv[0])
    text = written(server, release, entry(server))
    path = path_of(server)
    if "--check" in argv:
        if not path.exists() or text != path.read_text():
            print(f"{path}: {server} {release}'s entry is stale; run {Path(__file__).name}")
            return 1
        return 0
    path.write_text(text)
    print(f"{path}: {server} {release} written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
