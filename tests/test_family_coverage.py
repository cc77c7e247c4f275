"""The servers' coverage files (fi_convert/servers/<name>/coverage.json: every architecture of
a server release's registry that builds MoE layers, and for each no family file names, its
kind and a one-line reason) against the family files, without the servers: no listed
architecture is one a family names (a stale entry), each MoE architecture is covered one way,
and docs/converting.md's list is the one scripts/coverage_table.py generates. Each file against
its server's own registry: tests/test_vllm_coverage.py, tests/test_sglang_coverage.py.

And the SGLang facts kept per model class (servers/sglang/target.py): they are matched by
config.json's `architectures`, as SGLang picks its model class, so LongCat-Flash's published
config.json, which has no `model_type`, gets them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fi_convert.servers import TARGETS
from fi_convert.servers.coverage import KINDS, coverage, family_architectures, problems
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("server", sorted(TARGETS))
def test_each_servers_file_agrees_with_the_family_files(server):
    assert problems(server) == []
    cov = coverage(server)
    assert set(cov.covered()) | set(cov.uncovered) == set(cov.moe_architectures)


def test_a_stale_entry_is_found(monkeypatch):
    """An architecture listed as uncovered that a family names is one line naming both."""
    from fi_convert.servers import coverage as c

    cov = coverage("vllm")
    covered = cov.covered()[0]
    stale = c.Coverage(
        "vllm",
        cov.release,
        cov.registry,
        cov.rule,
        cov.moe_architectures,
        {**cov.uncovered, covered: c.Uncovered("not-yet", "stale")},
    )
    monkeypatch.setattr(c, "coverage", lambda server: stale)
    named = family_architectures()[covered]
    assert c.problems("vllm") == [
        f"{covered}: listed as uncovered (not-yet), but family {named} names it"
    ]


def test_every_kind_is_explained_and_used():
    used = {e.kind for s in TARGETS for e in coverage(s).uncovered.values()}
    assert used <= set(KINDS)
    assert {"not-yet", "draft", "transformers"} <= used


@pytest.mark.parametrize("server", sorted(TARGETS))
def test_a_refused_architecture_is_refused_by_its_server_on_every_backend(server):
    """An entry of kind `refused` is one the server's facts refuse, whatever a user's family
    file says of it: planned for that server, in bf16 on either backend, it gets one line."""
    refused = [a for a, e in coverage(server).uncovered.items() if e.kind == "refused"]
    assert refused
    for arch in refused:
        for backend in ("trtllm", "cutlass"):
            why = TARGETS[server].refuses_source("bf16", backend, None, [arch])
            assert why and "\n" not in why, (server, arch, backend)
    # (and the facts are what decide: an architecture they do not hold is not refused so)
    assert TARGETS[server].refuses_source("bf16", "cutlass", None, ["Qwen3MoeForCausalLM"]) is None


def test_the_docs_list_is_generated():
    r = subprocess.run(
        [sys.executable, "scripts/coverage_table.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _longcat_config_without_model_type(src: Path) -> None:
    """config.json as meituan-longcat/LongCat-Flash-Chat publishes it: `architectures`, no
    `model_type` (vLLM's transformers_utils/config.py maps the architecture to one itself)."""
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("model_type")
    cfg |= {
        "architectures": ["LongcatFlashForCausalLM"],
        "n_routed_experts": cfg.pop("num_experts"),
        "expert_ffn_hidden_size": cfg.pop("moe_intermediate_size"),
        "zero_expert_num": 2,
    }
    (src / "config.json").write_text(json.dumps(cfg))


def test_longcat_flash_without_model_type_gets_sglangs_fact(tmp_path):
    """LongCat-Flash's SGLang model declares no routing method, so its ModelOpt FP8 method runs
    Triton on flashinfer_trtllm: a ModelOpt FP8 LongCat-Flash whose config.json has no
    model_type is refused for SGLang on TRT-LLM in one line naming it (before, the fact was
    looked up by model_type and the output was planned), and converted on CUTLASS."""
    spec = Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=256, quant="fp8-tensor")
    src = write_checkpoint(tmp_path / "src", spec)
    _longcat_config_without_model_type(src)
    res = cli("convert", src, tmp_path / "o", "--server", "sglang", "--device", "cpu")
    assert res.exit_code == 1, res.stdout
    assert "SGLang 0.5.23's LongCat-Flash declares no routing method" in res.stderr
    assert "use --backend cutlass" in res.stderr and not (tmp_path / "o").exists()
    args = ["--server", "sglang", "--backend", "cutlass", "--device", "cpu"]
    res = cli("convert", src, tmp_path / "c", *args)
    assert res.exit_code == 0, res.stdout + res.stderr
    manifest = json.loads((tmp_path / "c" / "fi-convert-manifest.json").read_text())
    assert manifest["source"]["family"] == "longcat-flash"


def test_sglangs_facts_are_kept_by_architecture():
    """Every model class SGLang's facts name is an architecture of a family."""
    from fi_convert.servers.sglang import target as t

    named = family_architectures()
    assert set(t.NO_ROUTING_METHOD) | set(t.NO_FLASHINFER_MODEL) <= set(named)
