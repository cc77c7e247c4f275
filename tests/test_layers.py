"""fi_convert/ as a whole, by its imports, the project's layering: the library never imports typer
or rich (only the CLI's modules do), and the core never imports vllm or a server's package (only
`fi_convert.servers.*` does): it names a server, whose facts `fi_convert.server_lookup.resolve`
looks up when asked."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import fi_convert
from fi_convert.format import manifest as mf
from fi_convert.testing.synthetic import Spec, write_checkpoint


def _is_cli(name: str) -> bool:
    """The command line: `python -m fi_convert` and the `fi_convert.cli` package."""
    return (
        name == "fi_convert.__main__"
        or name == "fi_convert.cli"
        or name.startswith("fi_convert.cli.")
    )


def _library_modules() -> list[str]:
    names = [
        m.name
        for m in pkgutil.walk_packages(fi_convert.__path__, "fi_convert.")
        if not _is_cli(m.name) and not m.name.startswith("fi_convert.servers")
    ]
    assert "fi_convert.pipeline" in names and "fi_convert.hub.stream" in names
    assert "fi_convert.hub.convert" in names and not any(
        n.startswith("fi_convert.cli") for n in names
    )
    return names


def _loaded_after_importing(modules: list[str]) -> set[str]:
    """The names in sys.modules of a fresh interpreter once it has imported `modules`."""
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return set(eval(r.stdout.strip().splitlines()[-1]))  # noqa: S307 (our subprocess's list)


def test_the_library_imports_neither_the_cli_toolkit_nor_vllm():
    loaded = _loaded_after_importing(_library_modules())
    assert {"typer", "rich", "click", "vllm", "sglang"} & loaded == set()
    servers = sorted(m for m in loaded if m.startswith("fi_convert.servers"))
    assert servers == [], f"the core imports a server's package: {servers}"


def test_the_servers_facts_import_no_server():
    """The registry of servers and each server's facts module (what the converter asks of a
    server, through `fi_convert.server_lookup`) import no server, no CLI toolkit and no torch;
    only a server's plugin modules import the server, at run time."""
    from fi_convert import servers

    facts = ["fi_convert.servers", *(f"fi_convert.servers.{n}.target" for n in servers.TARGETS)]
    loaded = _loaded_after_importing(facts)
    assert {"typer", "rich", "click", "vllm", "sglang", "torch"} & loaded == set()
    plugin = {"checks", "experts", "loader"}
    assert not [
        m for m in loaded if m.startswith("fi_convert.servers.") and m.split(".")[-1] in plugin
    ]


# What the output format's package may import: itself, and the small shared modules below it
# (errors, paths, JSON, sizes, dtypes, the safetensors header reader, the bulk read, its CUDA
# driver calls and its child-process form). A server
# that reads an output (the vLLM plugin, a reader of its own) loads none of the converter.
FORMAT_MAY_IMPORT = {
    "fi_convert",
    "fi_convert.errors",
    "fi_convert.paths",
    "fi_convert.jsontext",
    "fi_convert.sizes",
    "fi_convert.dtypes",
    "fi_convert.st_io",
    "fi_convert.bulk_read",
    "fi_convert.cuda_driver",
    "fi_convert.child_read",
    "fi_convert._read_child",  # (its child's script, the standard library alone)
    "fi_convert.names",
    "fi_convert.version",
    "fi_convert.cache",  # (its folder, and whole-or-nothing writes: the standard library alone)
}


def test_the_format_imports_no_converter_code():
    formats = sorted(
        m.name
        for m in pkgutil.walk_packages(fi_convert.__path__, "fi_convert.")
        if m.name.startswith("fi_convert.format")
    )
    assert {"fi_convert.format.manifest", "fi_convert.format.reader"} <= set(formats)
    loaded = {m for m in _loaded_after_importing(formats) if m.startswith("fi_convert")}
    extra = {m for m in loaded if not m.startswith("fi_convert.format")} - FORMAT_MAY_IMPORT
    assert extra == set(), f"fi_convert.format imports converter modules: {sorted(extra)}"


# A fresh interpreter in which the named server cannot be imported (a meta-path finder that
# refuses it, as if it were not installed), then fi-convert's command line with the arguments.
WITHOUT = (
    "import sys\n"
    "class Without:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == {server!r}:\n"
    "            raise ModuleNotFoundError(f'No module named {{name!r}} (hidden by the test)')\n"
    "sys.meta_path.insert(0, Without())\n"
    "from fi_convert.cli import main\n"
    "main()\n"
)


def _without(server: str, *args: object) -> subprocess.CompletedProcess:
    code = WITHOUT.format(server=server)
    cmd = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("server", "other"), [("sglang", "vllm"), ("vllm", "sglang")])
def test_the_cli_converts_for_one_server_with_the_other_not_installed(server, other, tmp_path):
    """What a user with only one server's extra installed runs: inspect, convert and verify
    for that server, with the other server unimportable in the process."""
    spec = Spec("qwen3-moe", layers=1, experts=4, hidden=128, intermediate=256)
    src, out = write_checkpoint(tmp_path / "src", spec), tmp_path / "out"
    for args in (
        ("inspect", src, "--server", server),
        (src, out, "--server", server, "--scheme", "bf16", "--device", "cpu"),
        ("verify", out, "--source", src),
    ):
        r = _without(other, *args)
        assert r.returncode == 0, (args, r.stderr)
    assert mf.read(out)["server"] == server
    # the control: the finder does hide the server (its plugin's loader cannot be imported)
    r = _without(other, "--version")
    assert r.returncode == 0, r.stderr
    code = WITHOUT.format(server=other).replace(
        "from fi_convert.cli import main\nmain()\n", f"import fi_convert.servers.{other}.loader\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and f"No module named '{other}' (hidden by the test)" in r.stderr
