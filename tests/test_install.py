"""pyproject.toml and the Makefile's `make wheel`: the wheel a server image installs (fi-convert is
not on PyPI).

Built as the Makefile builds it and installed into a fresh venv with `--no-deps --no-index`
(nothing is downloaded: the test venv's packages stand in for the dependencies), it runs
`fi-convert --version`, and its metadata holds the vLLM plugin's entry point and the `vllm`
extra that `pip install "dist/fi_convert-<version>-py3-none-any.whl[vllm]"` installs, and the
SGLang plugin's entry point (found and loaded by SGLang's own discovery) and `sglang` extra.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import fi_convert

ROOT = Path(__file__).resolve().parents[1]
WHEEL_ARGS = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", "dist", "."]


def _env() -> dict[str, str]:
    """No PYTHONPATH: the fresh venv must find fi_convert in its own site-packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(cmd: list, cwd: Path | None = None, timeout: int = 300) -> str:
    """`cmd` run without the tests' PYTHONPATH (`_env`); its stdout, once it has succeeded."""
    r = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _build_wheel(tmp: Path) -> Path:
    # from a copy of the sources: a build writes build/ and *.egg-info beside them
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "fi_convert", src / "fi_convert", ignore=shutil.ignore_patterns("__pycache__")
    )
    _run([sys.executable, "-m", "pip", *WHEEL_ARGS], cwd=src)
    wheels = list((src / "dist").glob("*.whl"))
    assert [w.name for w in wheels] == [f"fi_convert-{fi_convert.__version__}-py3-none-any.whl"]
    return wheels[0]


def test_make_wheel_builds_as_this_test_does():
    recipe = (ROOT / "Makefile").read_text().split("\nwheel:", 1)[1].split("\n\n", 1)[0]
    assert "$(PIP) " + " ".join(WHEEL_ARGS) in recipe, recipe


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """The wheel, built as `make wheel` builds it, installed into a fresh venv whose
    dependencies are the test venv's: (the wheel, the venv)."""
    tmp = tmp_path_factory.mktemp("install")
    whl = _build_wheel(tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index",
          f"{whl}[vllm]"])  # fmt: skip
    # the dependencies (typer, rich, torch, ...) from the test venv, after the fresh venv's own
    # site-packages; a plain path, so the test venv's editable install of fi-convert stays out
    fresh = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    (Path(fresh) / "test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return whl, venv


def test_the_wheel_installs_into_a_fresh_venv_with_both_plugins_entry_points(installed, tmp_path):
    whl, venv = installed
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt")).rsplit("/", 1)[0]
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        metadata = z.read(f"{info}/METADATA").decode()
    assert "[vllm.general_plugins]\nfi_convert = fi_convert.servers.vllm:register" in entry_points
    assert "[console_scripts]\nfi-convert = fi_convert.cli:main" in entry_points
    assert "[sglang.srt.plugins]\nfi_convert = fi_convert.servers.sglang:register" in entry_points
    assert 'Requires-Dist: sglang<=0.5.23,>=0.5.20; extra == "sglang"' in metadata
    assert "fi_convert/servers/sglang/__init__.py" in names
    assert "Provides-Extra: vllm" in metadata
    # the releases the plugin is proven on (servers/vllm/releases.py)
    assert 'Requires-Dist: vllm<=0.34.0,>=0.30.0; extra == "vllm"' in metadata
    assert "fi_convert/families/deepseek_v3.json" in names
    assert "fi_convert/servers/vllm/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "docs/"))]

    assert fi_convert.__version__ in _run([venv / "bin" / "fi-convert", "--version"], tmp_path, 120)

    code = (
        "import importlib.metadata as md, fi_convert\n"
        "print(fi_convert.__file__)\n"
        "eps = md.entry_points(group='vllm.general_plugins')\n"
        "print([(e.name, e.value) for e in eps])\n"
    )
    where, eps = _run([venv / "bin" / "python", "-c", code], tmp_path).splitlines()
    assert Path(where).is_relative_to(venv), where  # the wheel's, not the checkout's
    assert "('fi_convert', 'fi_convert.servers.vllm:register')" in eps


@pytest.mark.sglang
def test_sglangs_own_discovery_loads_the_wheels_plugin(installed, tmp_path):
    """SGLang's own plugin discovery (its import needs the tests' stand-in for triton) finds
    and loads the wheel's register."""
    _, venv = installed
    code = (
        f"import sys; sys.path.append({str(ROOT)!r})\n"
        "from tests import sglang_stubs\n"
        "with sglang_stubs.installed():\n"
        "    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group\n"
        "    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)\n"
        "fn, dist = found['fi_convert']\n"
        "print(GENERAL_PLUGINS_GROUP, fn.__module__, fn.__name__, dist, fn.__code__.co_filename)\n"
    )
    out = _run([venv / "bin" / "python", "-c", code], tmp_path).splitlines()[-1].split()
    group, module, name, dist, where = out
    want = ["sglang.srt.plugins", "fi_convert.servers.sglang", "register", "fi-convert"]
    assert [group, module, name, dist] == want
    assert Path(where).is_relative_to(venv), where  # the wheel's


def _make_variable(name: str) -> str:
    """A `NAME := ...` variable of the Makefile, its continued lines joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"{name} :=")]
    return " ".join(line.split(":=", 1)[1].split())


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_each_name_of_cis_test_server_subset_selects_a_test(server):
    """`make test-server CI_SUBSET=1` selects by name (SERVER_CORE, SERVER_SMOKE_<server>): a
    name that no longer matches a test (renamed, removed) would leave CI's one-server leg
    without it, silently; each must match a test module or a test of the server's modules."""
    import re

    files = [ROOT / "tests" / f"test_{server}_plugin.py"]
    if server == "sglang":
        files += [ROOT / "tests" / "test_sglang_models.py", ROOT / "tests" / "test_sglang_ep.py"]
    tests = {m for f in files for m in re.findall(r"^def (test_\w+)", f.read_text(), re.M)}
    modules = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    for var in ("SERVER_CORE", f"SERVER_SMOKE_{server}"):
        names = [n.strip() for n in _make_variable(var).split(" or ")]
        assert names, var
        for name in names:
            assert name in modules or any(name in t for t in tests), f"{var}: {name!r}"
