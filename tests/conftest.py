from __future__ import annotations

import itertools
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

from fi_convert.testing.synthetic import Spec, write_checkpoint

from .hub_server import PROXIES, FakeHub, hf_env, loopback_only

# The escape sequences of colours and styles, for comparing what the CLI printed.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


_OWN_BASETEMP = pytest.StashKey[Path]()


def cli(*args: object, env: dict[str, str] | None = None) -> Result:
    """`fi-convert ARGS` run in-process through the typer app (`env`: variables set for the
    run): the click Result, stdout and stderr apart. An exception other than the command's
    exit is raised again, so that a test fails on it with its traceback."""
    from fi_convert.cli import app

    res = CliRunner().invoke(app, [str(a) for a in args], env=env)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res


# The servers fi-convert serves; a test that needs one installed is marked with its name
# (pytest.mark.vllm, pytest.mark.sglang), and every test of a module `test_<server>*.py` is.
SERVERS = ("vllm", "sglang")


def reader_threads() -> list[threading.Thread]:
    """A read's threads alive now: `BulkRead`'s readers (named fi-convert-read-K), or the
    thread that copies out of a child's ring (`child_read`, fi-convert-copy)."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("fi-convert-read-") or t.name == "fi-convert-copy"
    ]


def files_open(root: Path) -> list[str]:
    """The files under `root` this process holds open."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (the listing's own, closed since)
            continue
        if path.startswith(f"{root}/"):
            held.append(path)
    return held


def pytest_addoption(parser):
    parser.addoption(
        "--server",
        choices=SERVERS,
        default=None,
        help="run in a venv that holds this server alone (`make test-server`): the other "
        "server's modules are not collected and its marked tests are deselected",
    )
    parser.addoption(
        "--release",
        default=None,
        help="with --server: the release of it this venv holds, as the test authority "
        "(`make test-release`); the run stops before collecting if another is installed",
    )


def _check_release(config):
    """--release: the tests run against the installed server, so it must be that release."""
    release = config.getoption("--release")
    if release is None:
        return
    from importlib import metadata

    server = config.getoption("--server")
    if server is None:
        raise pytest.UsageError("--release needs --server (the server it is a release of)")
    try:
        got = metadata.version(server)
    except metadata.PackageNotFoundError:
        got = "not installed"
    if got != release:
        raise pytest.UsageError(f"--release {release}: this venv's {server} is {got}")


def _module_server(name: str) -> str | None:
    """The server a test module's name gives all its tests (test_vllm_plugin.py: vllm)."""
    return next((s for s in SERVERS if name.startswith(f"test_{s}")), None)


def _other(config) -> str | None:
    server = config.getoption("--server")
    return None if server is None else next(s for s in SERVERS if s != server)


def pytest_configure(config):
    """A temp root of this session's own: pytest's shared `pytest-of-USER` folder, with its
    `pytest-current` link that each session's cleanup removes, breaks a second session run
    beside this one (two clones' `make test` at once: FileNotFoundError at the end). And
    --release's check."""
    _check_release(config)
    if config.option.basetemp is None and "PYTEST_DEBUG_TEMPROOT" not in os.environ:
        config.option.basetemp = tempfile.mkdtemp(prefix="pytest-fi-convert-")
        config.stash[_OWN_BASETEMP] = Path(config.option.basetemp)


def pytest_sessionfinish(session, exitstatus):
    """This session's temp root goes when every test passed, as pytest's own would (the
    retention policy: a failed test's folder stays for a look)."""
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own is not None and exitstatus == 0:
        shutil.rmtree(own, ignore_errors=True)


def pytest_ignore_collect(collection_path, config):
    """Under --server, the other server's modules, which import it at their top."""
    other = _other(config)
    if other is not None and collection_path.suffix == ".py":
        return _module_server(collection_path.name) == other or None
    return None


def pytest_report_header(config):
    other = _other(config)
    if other is not None:
        lines = [
            f"--server {config.getoption('--server')}: test_{other}*.py not collected, tests "
            f"marked {other} deselected"
        ]
        if config.getoption("--release"):
            lines.append(
                f"the test authority: {config.getoption('--server')} "
                f"{config.getoption('--release')}"
            )
        return lines
    return []


def pytest_collection_modifyitems(config, items):
    for item in items:
        server = _module_server(item.path.name)
        if server is not None:
            item.add_marker(getattr(pytest.mark, server))
    other = _other(config)
    if other is not None:
        dropped = [i for i in items if i.get_closest_marker(other) is not None]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [i for i in items if i.get_closest_marker(other) is None]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


@pytest.fixture(autouse=True)
def _free_tmp_path(request):
    """A passed test's tmp_path goes at the test's end, not the session's: the suite writes
    about 18 GB of checkpoints and outputs, more than a small CI runner's disk holds. A failed
    test's stays for a look (and the retention policy in pyproject.toml keeps only those)."""
    yield
    path = request.node.funcargs.get("tmp_path")
    if path is not None and request.node.stash.get(_PASSED, False):
        shutil.rmtree(path, ignore_errors=True)


_PLAN_FOLDERS = itertools.count()


@pytest.fixture(autouse=True)
def _own_plan_cache(monkeypatch, tmp_path_factory):
    """Each test's loads keep the model's answers (format/plan_cache.py) in a folder of the
    test's own (made where one is kept): none comes from the user's cache or another test."""
    folder = tmp_path_factory.getbasetemp() / f"plans-{next(_PLAN_FOLDERS)}"
    monkeypatch.setenv("FI_CONVERT_PLAN_CACHE", str(folder))


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    """No test sees the FI_CONVERT_DEBUG of the shell that runs it (tracebacks on stderr)."""
    monkeypatch.delenv("FI_CONVERT_DEBUG", raising=False)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """A small DeepSeek-V3 checkpoint in three shards (a module may have a `src` of its own)."""
    spec = Spec("deepseek-v3", layers=3, experts=8, hidden=256, intermediate=512, shards=3)
    return write_checkpoint(tmp_path_factory.mktemp("src") / "ds", spec)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A fresh fake Hub, with this process's huggingface_hub pointed at it."""
    from huggingface_hub import constants

    loopback_only(monkeypatch.setattr)
    server = FakeHub().start()
    home = tmp_path / "hf"
    for k in list(os.environ):
        if k.startswith(("HF_", "HUGGING")) or k.lower() in PROXIES:
            monkeypatch.delenv(k)
    for k, v in hf_env(server, home).items():
        monkeypatch.setenv(k, v)
    # huggingface_hub read these from the environment when it was imported
    for name, value in {
        "ENDPOINT": server.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": server.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HUGGINGFACE_HUB_CACHE": str(home / "hub"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_XET_CACHE": str(home / "xet"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
    }.items():
        monkeypatch.setattr(constants, name, value)
    # shared HfApi objects take the endpoint when they are made: huggingface_hub's module-level
    # one (behind `list_repo_files`, `model_info`, ..., which SGLang calls) at its import, and
    # transformers' (`transformers.utils.hub.hf_api()`) at its first use, made again here
    from huggingface_hub import hf_api

    monkeypatch.setattr(hf_api.api, "endpoint", server.url)
    if "transformers.utils.hub" in sys.modules:
        monkeypatch.setattr(sys.modules["transformers.utils.hub"], "_hf_api", None)
    yield server
    server.stop()
