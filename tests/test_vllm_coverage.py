"""fi_convert/servers/vllm/coverage.json against vLLM's own registry of model architectures
(`vllm.model_executor.models.registry._VLLM_MODELS`, architecture -> (module, class)): every
architecture whose model module names FusedMoE (a module of vllm.model_executor.models, or a
package of vllm.models read whole) is recorded as one that builds MoE layers, and is either
named by a family file or listed with its kind and reason (tests/test_family_coverage.py holds
the file to the family files). The modules are read as text, not imported."""

from __future__ import annotations

from pathlib import Path

import vllm
from vllm.model_executor.models.registry import _VLLM_MODELS

from fi_convert.servers.coverage import coverage, family_architectures

ROOT = Path(vllm.__file__).parent


def _source(module: str) -> str:
    """The text of a registry entry's module: relative to vllm.model_executor.models, or
    absolute (`vllm.models.deepseek_v4`, a package: every file of it)."""
    if not module.startswith("vllm."):
        module = f"vllm.model_executor.models.{module}"
    p = ROOT.joinpath(*module.split(".")[1:])
    if p.is_dir():
        return "\n".join(f.read_text() for f in sorted(p.rglob("*.py")))
    return p.with_suffix(".py").read_text()


def moe_architectures() -> list[str]:
    return sorted(a for a, (module, _) in _VLLM_MODELS.items() if "FusedMoE" in _source(module))


def test_the_file_records_vllms_moe_architectures():
    assert vllm.__version__.startswith(coverage("vllm").release.rsplit(".", 1)[0])
    assert list(coverage("vllm").moe_architectures) == moe_architectures()


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
