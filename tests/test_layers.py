"""The project's layering: the library never imports typer or rich (only the CLI's modules
do), and the core never imports vllm (only the plugin does)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import fi_convert

CLI = {"fi_convert.__main__", "fi_convert.cli", "fi_convert.cli_progress", "fi_convert.cli_usage"}


def _library_modules() -> list[str]:
    names = [
        m.name
        for m in pkgutil.walk_packages(fi_convert.__path__, "fi_convert.")
        if m.name not in CLI and not m.name.startswith("fi_convert.vllm_plugin")
    ]
    assert "fi_convert.pipeline" in names and "fi_convert.hub.stream" in names
    return names


def test_the_library_imports_neither_the_cli_toolkit_nor_vllm():
    code = (
        "import importlib, sys\n"
        f"for name in {_library_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('typer', 'rich', 'click', 'vllm') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
