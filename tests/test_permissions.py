"""fi_convert/paths.py, source.py, outdir.py and the command's error mapping (fi_convert/cli/):
paths this user may not read or write, as an unprivileged user meets them, each one `error:`
line naming the path (and the folder in the way) and the fix, exit 1, no traceback.

CI runs as root, and root reads everything: these run the CLI in a subprocess as uid 65534
(`setpriv`), on folders made for it and owned by it, that it is then denied by their modes. Not
root, the tests run as the user they run as, which is unprivileged already.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fi_convert
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import ANSI_RE

NOBODY = 65534
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
# root without the capabilities that let it read and search anything (the last resort)
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
PYTHON = [sys.executable, "-m", "fi_convert"]
# what the subprocess needs to reach: the interpreter's installation, the venv, fi_convert
NEEDED = sorted(
    {
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        Path(fi_convert.__file__).resolve().parent.parent,
    }
)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FI_CONVERT_DEBUG"}
    path = os.pathsep.join(filter(None, [str(NEEDED[-1]), env.get("PYTHONPATH", "")]))
    return env | {"HOME": str(home), "TMPDIR": str(home), "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


def _works(prefix: list[str], home: Path) -> bool:
    """Whether `prefix` runs this Python, with fi_convert (not, say, a half of it that found
    the system's libpython and standard library where its own are out of reach)."""
    probe = [*prefix, sys.executable, "-c", "import sys, fi_convert; print(sys.version)"]
    r = subprocess.run(probe, env=_env(home), capture_output=True, text=True, timeout=120)
    return r.returncode == 0 and r.stdout.strip() == sys.version


def _in_the_way(path: Path) -> Path | None:
    """The first folder on the way to `path` that others may not search (enter)."""
    return next((a for a in reversed(path.parents) if not a.stat().st_mode & 0o001), None)


def _namespace(home: Path) -> list[str]:
    """Run as uid 65534 where this Python, or this clone, is out of its reach (pyenv under
    /root, a clone in a `mktemp -d` folder: mode 700): in a private mount namespace where each
    folder in the way is a tmpfs that holds only what the run needs, bound back to where it
    was."""
    tops = sorted({str(t) for t in map(_in_the_way, NEEDED) if t is not None})
    under = [t for t in tops if str(home.resolve()).startswith(t + "/")]
    if not tops or under:  # a tmpfs there would hide the test's own folders
        return []
    inside = [n for n in NEEDED if any(str(n).startswith(t + "/") for t in tops)]
    needs = [shlex.quote(str(n)) for n in inside]
    hold = [shlex.quote(str(home / "hold" / str(k))) for k in range(len(needs))]
    script = ["set -e"]
    for n, h in zip(needs, hold, strict=True):
        script += [f"mkdir -p {h}", f"mount --bind {n} {h}"]
    script += [f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(t)}" for t in tops]
    for n, h in zip(needs, hold, strict=True):
        script += [f"mkdir -p {n}", f"mount --bind {h} {n}"]
    script.append(f'exec {shlex.join(SETPRIV)} "$@"')
    return ["unshare", "--mount", "sh", "-c", "\n".join(script), "sh"]


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A folder for these tests that the user they run as may use (owned by it)."""
    path = Path(tempfile.mkdtemp(prefix="fi-convert-perm-"))
    path.chmod(0o755)
    yield path
    for p in [path, *path.rglob("*")]:  # modes the tests left: rmtree must see inside
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def unprivileged(base) -> list[str]:
    """The command prefix that runs a command as an unprivileged user: uid 65534 (straight, or
    in a mount namespace that lets it reach this Python), else root without the capabilities
    to read anything; nothing when the tests do not run as root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing: cannot run as an unprivileged user")
    home = base / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    for prefix in (SETPRIV, _namespace(home)):
        if prefix and _works(prefix, home):
            return prefix
    assert _works(NO_DAC, home), "neither uid 65534 nor root without capabilities runs here"
    return NO_DAC


@pytest.fixture(scope="module")
def pristine(base) -> Path:
    """A small checkpoint, and its conversion (`out`) made by the user the tests run as."""
    spec = Spec(family="mixtral", layers=2, experts=4, hidden=128, intermediate=128)
    model = write_checkpoint(base / "pristine" / "model", spec)
    (model / "extra").mkdir()
    (model / "extra" / "notes.md").write_text("carried")
    r = subprocess.run([*PYTHON, model, model.parent / "out", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return model.parent


@pytest.fixture
def folder(base, pristine, unprivileged, request) -> Path:
    """This test's folder, owned by the user the CLI runs as (uid 65534, or root without its
    capabilities, whom the modes deny as they deny any owner): `model` and its output `out`;
    `ro` and `od`, empty; `locked`, with a copy of `model`."""
    path = base / re.sub(r"[^\w.-]+", "_", request.node.name)
    shutil.copytree(pristine, path)
    shutil.copytree(path / "model", path / "locked" / "model")
    for name in ("home", "ro", "od"):
        (path / name).mkdir()
    if os.geteuid() == 0 and unprivileged != NO_DAC:
        for p in [path, *path.rglob("*")]:
            os.chown(p, NOBODY, NOBODY, follow_symlinks=False)
    return path


def run(unprivileged: list[str], folder: Path, *args: str | Path) -> subprocess.CompletedProcess:
    cmd = [*unprivileged, *PYTHON, *map(str, args)]
    return subprocess.run(
        cmd, env=_env(folder / "home"), capture_output=True, text=True, timeout=300
    )


def one_error(r: subprocess.CompletedProcess, *needles: str | Path) -> str:
    lines = [ln for ln in ANSI_RE.sub("", r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error:") and "Traceback" not in r.stderr, lines
    for n in needles:
        assert str(n) in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def test_the_unprivileged_user_converts_and_verifies(unprivileged, folder):
    """The control: that user converts and verifies in the folders made for it, so each
    refusal below is one of the permission it is then denied."""
    who = [*unprivileged, sys.executable, "-c", "import os; print(os.geteuid())"]
    uid = subprocess.run(who, env=_env(folder / "home"), capture_output=True, text=True).stdout
    assert int(uid) == (NOBODY if unprivileged not in ([], NO_DAC) else os.geteuid())
    r = run(unprivileged, folder, folder / "model", folder / "new", "--quiet")
    assert r.returncode == 0, r.stderr
    r = run(unprivileged, folder, "verify", folder / "new", "--source", folder / "model")
    assert r.returncode == 0, r.stderr
    assert (folder / "new" / "extra" / "notes.md").read_text() == "carried"


MODEL = "run as a user who may read the model folder"
OUT = "choose an out-dir this user may write"
OUTPUT = "run as a user who may read the output"


def _deny(path: Path, mode: int = 0) -> Path:
    path.chmod(mode)
    return path


# what is denied: (the command, the needles of its one error line), in this test's folder,
# whose `locked` folder may not be searched
CASES: dict[str, Callable[[Path], tuple[list, list]]] = {
    "model folder unreadable": lambda f: (
        [_deny(f / "model"), f / "new", "-q"],
        [f / "model" / "config.json", "Permission denied", f"may not search {f / 'model'}", MODEL],
    ),
    "model folder in a folder it may not search": lambda f: (
        [f / "locked" / "model", f / "new", "-q"],
        [f / "locked" / "model", f"may not search {f / 'locked'}", MODEL],
    ),
    "config.json unreadable": lambda f: (
        [_deny(f / "model" / "config.json").parent, f / "new", "-q"],
        [f / "model" / "config.json", "Permission denied", MODEL],
    ),
    "index unreadable": lambda f: (
        [_deny(f / "model" / "model.safetensors.index.json").parent, f / "new", "-q"],
        ["model.safetensors.index.json: Permission denied", MODEL],
    ),
    "a shard unreadable": lambda f: (
        [_deny(f / "model" / "model-00002-of-00003.safetensors").parent, f / "new", "-q"],
        ["model-00002-of-00003.safetensors", "Permission denied"],
    ),
    "a subfolder unreadable": lambda f: (
        [_deny(f / "model" / "extra").parent, f / "new", "-q"],
        [f"{f / 'model' / 'extra'}: Permission denied", MODEL],
    ),
    "a side file unreadable": lambda f: (
        [_deny(f / "model" / "tokenizer.json").parent, f / "new", "-q"],
        ["tokenizer.json", "Permission denied"],
    ),
    "out-dir in a folder it may not write": lambda f: (
        [f / "model", _deny(f / "ro", 0o555) / "new", "-q"],
        [f / "ro" / "new", "Permission denied", "out-dir's permissions"],
    ),
    "out-dir in a folder it may not search": lambda f: (
        [f / "model", f / "locked" / "new", "-q"],
        [f / "locked" / "new", f"may not search {f / 'locked'}", OUT],
    ),
    "out-dir unreadable": lambda f: (
        [f / "model", _deny(f / "od"), "-q"],
        [f / "od", "Permission denied", "out-dir's permissions"],
    ),
    "out-dir read-only": lambda f: (
        [f / "model", _deny(f / "od", 0o555), "-q"],
        [f / "od", "Permission denied", "out-dir's permissions"],
    ),
    "inspect, model folder in a folder it may not search": lambda f: (
        ["inspect", f / "locked" / "model"],
        [f / "locked" / "model", f"may not search {f / 'locked'}", MODEL],
    ),
    "verify, output in a folder it may not search": lambda f: (
        ["verify", f / "locked" / "model"],
        [f / "locked" / "model", f"may not search {f / 'locked'}", OUTPUT],
    ),
    "verify --source, source in a folder it may not search": lambda f: (
        ["verify", f / "out", "--source", f / "locked" / "model"],
        [f / "locked" / "model", f"may not search {f / 'locked'}", MODEL],
    ),
    "push, output unreadable": lambda f: (
        ["push", _deny(f / "out"), "org/name"],
        [f / "out" / "fi-convert-manifest.json", "Permission denied", OUTPUT],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_path_this_user_may_not_use_is_one_line(unprivileged, folder, case):
    _deny(folder / "locked")
    args, needles = CASES[case](folder)
    one_error(run(unprivileged, folder, *args), *needles)


def test_a_permission_error_no_command_says_better_is_one_line(monkeypatch, tmp_path):
    """The last resort: a PermissionError from anywhere is one line naming its path, not a
    traceback (and with --debug, the traceback)."""
    from typer.testing import CliRunner

    from fi_convert import plan
    from fi_convert.cli import app

    where = tmp_path / "deep" / "file"

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(where))

    monkeypatch.setattr(plan, "make_plan", refuse)
    res = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    one_error(
        subprocess.CompletedProcess([], res.exit_code, res.stdout, res.stderr),
        f"{where}: Permission denied",
        "change their permissions",
    )
    res = CliRunner().invoke(app, ["inspect", str(tmp_path), "--debug"])
    assert isinstance(res.exception, PermissionError)
