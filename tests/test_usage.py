"""fi_convert/cli/ (`main`, `_usage`, `_options`): usage errors of the `fi-convert` command, each
is one line on stderr (`error: ...`, with a did-you-mean where a name is close), exit code 2,
nothing on stdout and no traceback; plus `--version`, the help's examples and metavars, and the
reader's device errors.

Most run `fi_convert.cli.main` (the console script's entry point, which also inserts the
default `convert` command) in-process; one runs the installed script."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch

import fi_convert
from fi_convert import ManifestError, load_moe_layer
from fi_convert.cli import main
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import ANSI_RE, cli
from .test_cli import FI_CONVERT

MX = Spec(family="mixtral", layers=2, experts=4, hidden=128, intermediate=128)
SCHEMES = "auto, bf16, fp8-tensor, fp8-block, mxfp8, nvfp4, mxfp4"
CONVERT_USAGE = "fi-convert convert [OPTIONS] MODEL_DIR OUT_DIR"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("usage") / "mx", MX)


@pytest.fixture(scope="module")
def output(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("usage-out") / "out"
    res = cli("convert", model, out, "--device", "cpu")
    assert res.exit_code == 0, res.output
    return out


def run(capsys, *argv) -> tuple[int, str, str]:
    """`fi-convert ARGV` through the entry point: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    cap = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 0), ANSI_RE.sub("", cap.out), cap.err


def one_line(capsys, *argv, code: int = 2) -> str:
    """Assert `fi-convert ARGV` fails with `code`, one stderr line and no stdout; the line."""
    rc, out, err = run(capsys, *argv)
    assert rc == code, (rc, out, err)
    assert out == "" and "Traceback" not in err, (out, err)
    lines = ANSI_RE.sub("", err).splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ------------------------------------------------------------------ bad values and names


@pytest.mark.parametrize(
    ("device", "line"),
    [
        ("gpu", "error: --device gpu: unknown device; did you mean cuda? (use auto, cpu, "
         "cuda or cuda:N)"),
        ("tpu", "error: --device tpu: unknown device; did you mean cpu? (use auto, cpu, "
         "cuda or cuda:N)"),
        ("cpu:1", "error: --device cpu:1: unknown device; did you mean cpu? (use auto, cpu, "
         "cuda or cuda:N)"),
        ("xla", "error: --device xla: unknown device (use auto, cpu, cuda or cuda:N)"),
    ],
)  # fmt: skip
def test_an_unknown_device_name_is_a_one_line_usage_error(capsys, model, tmp_path, device, line):
    out = tmp_path / "out"
    assert one_line(capsys, model, out, "--device", device) == line
    assert not out.exists()


def test_an_unknown_device_name_in_verify_is_a_usage_error(capsys, output):
    assert one_line(capsys, "verify", output, "--device", "GPU") == (
        "error: --device GPU: unknown device; did you mean cuda? (use auto, cpu, cuda or cuda:N)"
    )


def test_a_cuda_device_this_machine_lacks_is_one_line(capsys, model, tmp_path, monkeypatch):
    """A well-formed name of a device that is not here: the library's error, exit code 1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert one_line(capsys, model, out, "--device", "cuda:9", code=1) == (
        "error: --device cuda:9: no CUDA device is available here; use --device cpu"
    )
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--full", "--against-flashinfer"])
def test_a_deep_verify_without_a_source_is_a_usage_error(capsys, output, flag):
    assert one_line(capsys, "verify", output, flag) == (
        f"error: {flag} needs --source MODEL_DIR (the source to re-derive the experts from)"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--scheme", "mxfp9"],
         f"error: --scheme mxfp9: unknown scheme; did you mean mxfp8? (choices: {SCHEMES})"),
        (["-s", "fp8block"],
         f"error: --scheme fp8block: unknown scheme; did you mean fp8-block? (choices: {SCHEMES})"),
        (["--scheme=int4"], f"error: --scheme int4: unknown scheme (choices: {SCHEMES})"),
        (["--backend", "cutlas"],
         "error: --backend cutlas: unknown backend; did you mean cutlass? (choices: trtllm, "
         "cutlass)"),
        (["--devic", "cpu"], "error: no such option --devic; did you mean --device?"),
        (["--max-shard", "1GB"],
         "error: no such option --max-shard; did you mean --max-shard-size?"),
        (["--xyz"],
         "error: no such option --xyz (fi-convert convert --help lists them)"),
        (["-tp", "0"], "error: --tp-size 0: must be greater than or equal to 1"),
        (["--max-memory", "4Gx"],
         "error: --max-memory 4Gx: not a size: give bytes, or a number with a unit (e.g. 4GiB, "
         "500MB, 5GB, 1.5T)"),
        (["--scheme"], "error: --scheme needs a value"),
        (["--dry-run=yes"], "error: --dry-run takes no value"),
        (["extra"], f"error: unexpected extra argument extra (usage: {CONVERT_USAGE})"),
        (["--private"], "error: --private and --base-model go with --push-to"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_with_a_suggestion(capsys, model, tmp_path, args, line):
    out = tmp_path / "out"
    assert one_line(capsys, model, out, *args) == line
    assert not out.exists()


def test_a_missing_argument_is_one_line_with_the_usage(capsys, model):
    assert one_line(capsys, model) == f"error: missing OUT_DIR (usage: {CONVERT_USAGE})"
    assert one_line(capsys, "push", "out") == (
        "error: missing ORG/NAME (usage: fi-convert push [OPTIONS] OUT_DIR ORG/NAME)"
    )


def test_a_mistyped_command_is_not_taken_for_a_model_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert one_line(capsys, "verfy", "out") == (
        "error: no such command or folder 'verfy'; did you mean verify?"
    )
    assert one_line(capsys, "inpsect", "model") == (
        "error: no such command or folder 'inpsect'; did you mean inspect?"
    )
    # a folder of that name is a model folder, converted as before (here: not a model)
    (tmp_path / "verfy").mkdir()
    assert one_line(capsys, "verfy", "out", code=1).startswith("error: verfy")


def test_the_app_itself_names_an_unknown_command_in_one_line():
    """Without the entry point's default command (the app as tests and `python -m` drive it)."""
    res = cli("pusj", "out", "org/name")
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr == "error: no such command 'pusj'; did you mean push?\n"


# ------------------------------------------------------------------ version and help


def test_version_flag_and_command_print_the_version(capsys):
    assert run(capsys, "--version") == (0, f"{fi_convert.__version__}\n", "")
    assert run(capsys, "version") == (0, f"{fi_convert.__version__}\n", "")


def test_the_installed_script_gives_one_usage_line_and_the_version():
    r = subprocess.run([*FI_CONVERT, "m", "o", "-s", "mxfp9"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        f"error: --scheme mxfp9: unknown scheme; did you mean mxfp8? (choices: {SCHEMES})\n"
    )
    r = subprocess.run([*FI_CONVERT, "--version"], capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, f"{fi_convert.__version__}\n")


@pytest.mark.parametrize("command", ["convert", "inspect", "verify", "push", "version"])
def test_each_help_has_examples_and_readable_metavars(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "120")
    rc, out, err = run(capsys, command, "--help")
    assert (rc, err) == (0, "")
    lines = [ln.strip(" │") for ln in out.splitlines()]
    examples = lines[lines.index("Examples:") + 1 :]
    shown = [ln for ln in examples if ln.startswith(f"fi-convert {command}")]
    assert shown or command == "convert", examples
    assert all(ln.startswith("fi-convert ") for ln in examples if ln), examples
    for bad in ("<bool>", "<str>", "<path>", "{", "}"):
        assert bad not in out, (bad, out)
    usage = next(ln for ln in lines if ln.startswith("Usage:"))
    want = {
        "convert": f"Usage: {CONVERT_USAGE}",
        "inspect": "Usage: fi-convert inspect [OPTIONS] MODEL_DIR",
        "verify": "Usage: fi-convert verify [OPTIONS] OUT_DIR",
        "push": "Usage: fi-convert push [OPTIONS] OUT_DIR ORG/NAME",
        "version": "Usage: fi-convert version [OPTIONS]",
    }[command]
    assert usage == want


def test_convert_help_names_every_scheme_whole_at_120_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    rc, out, _ = run(capsys, "convert", "--help")
    assert rc == 0 and max(len(ln) for ln in out.splitlines()) <= 120
    words = set(re.split(r"[\s,()│]+", out))
    assert set(SCHEMES.split(", ")) <= words, sorted(words)
    row = next(ln for ln in out.splitlines() if "--scheme" in ln)
    assert " SCHEME " in row and " SIZE " in next(
        ln for ln in out.splitlines() if "--max-memory" in ln
    )
    assert " K/N " in next(ln for ln in out.splitlines() if "--part" in ln)
    assert " DEVICE " in next(ln for ln in out.splitlines() if "--device" in ln)
    assert " <bool> " not in next(ln for ln in out.splitlines() if "--dry-run" in ln)


def test_no_arguments_prints_the_help(capsys):
    rc, out, err = run(capsys)
    assert rc == 2 and err == ""
    assert "Usage: fi-convert [OPTIONS] COMMAND [ARGS]..." in out and "--version" in out


# ------------------------------------------------------------------ the reader's device


def test_load_moe_layer_on_a_missing_cuda_device_is_a_manifest_error(output, monkeypatch):
    """This machine has no GPU (the test makes sure): a ManifestError, not torch's bare
    AssertionError; and a CUDA index beyond the machine's devices the same way."""
    prefix = next(iter(json.loads((output / "fi-convert-manifest.json").read_text())["layers"]))
    t = load_moe_layer(output, prefix, device="cpu")
    assert set(t) == {"w13_weight", "w2_weight"} and t["w13_weight"].device.type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ManifestError) as e:
        load_moe_layer(output, prefix, device="cuda")
    assert str(e.value) == (
        "device 'cuda' is not available here (torch.cuda.is_available() is False); load on 'cpu'"
    )
    with pytest.raises(ManifestError) as e:
        load_moe_layer(output, prefix, device=torch.device("cuda", 0))
    assert str(e.value).startswith("device 'cuda:0' is not available here")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ManifestError) as e:
        load_moe_layer(output, prefix, device="cuda:2")
    assert str(e.value) == (
        "device 'cuda:2' is not available here (this machine has 2 CUDA devices: cuda:0 to "
        "cuda:1); load on one of them"
    )
    with pytest.raises(ManifestError) as e:
        load_moe_layer(output, prefix, device="gpu")
    assert str(e.value) == "device 'gpu': not a device name; pass 'cpu' or 'cuda[:N]'"
    with pytest.raises(ManifestError) as e:
        load_moe_layer(output, prefix, device="meta")
    assert str(e.value) == "device 'meta': the reader loads to 'cpu' or 'cuda[:N]'"
