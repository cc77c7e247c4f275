"""fi_convert/verify/ (output.py, flashinfer_reference.py), `fi-convert verify`: files, index,
manifest; bytes re-derived from the source (ours and FlashInfer's); clear failures."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from fi_convert import FiConvertError, Options, SchemeName, convert
from fi_convert.st_io import read_header
from fi_convert.testing.synthetic import Spec, write_checkpoint
from fi_convert.verify import verify

from .conftest import cli

MANIFEST = "fi-convert-manifest.json"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("v")
    src = write_checkpoint(
        root / "src", Spec("qwen3-moe", layers=2, experts=5, hidden=128, intermediate=192)
    )
    out = root / "out"
    convert(src, out, Options(SchemeName.MXFP8, tp_size=2), device="cpu")
    return src, out


def _copy(out, tmp_path):
    import shutil

    dst = tmp_path / "out"
    shutil.copytree(out, dst)
    return dst


def _tamper(out, name: str, rank: int = 0):
    """Flip the first byte of `name`'s rank slice and re-sign the file in the manifest, as a
    converter bug would leave it: checksums agree, bytes are wrong."""
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    shard = out / index[name]
    info = read_header(shard)[0][name]
    data = bytearray(shard.read_bytes())
    data[info.start + rank * (info.nbytes // info.shape[0])] ^= 0x5A
    shard.write_bytes(bytes(data))
    m = json.loads((out / MANIFEST).read_text())
    m["files"][shard.name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (out / MANIFEST).write_text(json.dumps(m))


@pytest.mark.parametrize("args", [[], ["--full"], ["--against-flashinfer"], ["--full", "--json"]])
def test_verify_with_source_ok(made, args):
    src, out = made
    r = cli("verify", out, "--source", src, "--device", "cpu", *args)
    assert r.exit_code == 0, r.output
    if "--json" in args:
        d = json.loads(r.stdout)
        assert d["ok"] and d["checked"]["experts_rederived"] == 5 * 2 * 2  # layers*ranks*experts
    else:
        assert r.stdout.startswith("ok:")


@pytest.mark.parametrize("flashinfer", [False, True])
@pytest.mark.parametrize("name,rank", [("w13_weight", 0), ("w2_weight_scale", 1)])
def test_source_check_finds_wrong_bytes_that_checksums_miss(made, tmp_path, name, rank, flashinfer):
    src, out = made
    out = _copy(out, tmp_path)
    _tamper(out, f"model.layers.1.mlp.experts.{name}", rank)
    assert verify(out).ok  # the checksums alone cannot see it
    rep = verify(out, source=src, against_flashinfer=flashinfer, device="cpu")
    assert not rep.ok
    assert f"model.layers.1.mlp.experts.{name} rank {rank} differs" in rep.problems[0]


def test_manifest_shape_disagreeing_with_shards(made, tmp_path):
    out = _copy(made[1], tmp_path)
    m = json.loads((out / MANIFEST).read_text())
    m["layers"]["model.layers.0.mlp.experts"]["tensors"]["w2_weight"]["shape_per_rank"][0] = 4
    (out / MANIFEST).write_text(json.dumps(m))
    rep = verify(out)
    assert any("model.layers.0.mlp.experts.w2_weight is F8_E4M3" in p for p in rep.problems)


def test_index_naming_a_missing_tensor(made, tmp_path):
    out = _copy(made[1], tmp_path)
    index = out / "model.safetensors.index.json"
    d = json.loads(index.read_text())
    d["weight_map"]["model.ghost.weight"] = next(iter(d["weight_map"].values()))
    index.write_text(json.dumps(d))
    m = json.loads((out / MANIFEST).read_text())
    data = index.read_bytes()
    m["files"][index.name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (out / MANIFEST).write_text(json.dumps(m))
    rep = verify(out)
    assert any("lists model.ghost.weight, which no shard holds" in p for p in rep.problems)


def test_other_source_is_reported(made, tmp_path):
    """Another checkpoint: by structure (the fingerprint covers shard names, sizes and
    headers), or, with the same structure and other data, by the bytes themselves."""
    shaped = Spec("qwen3-moe", layers=2, experts=5, hidden=128, intermediate=256)
    other = write_checkpoint(tmp_path / "other", shaped)
    problems = verify(made[1], source=other).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{made[1] / 'fi-convert-manifest.json'}: source.fingerprint is ")
    assert (
        f"{other} has " in problems[0]
        and "not the checkpoint this output was converted from" in problems[0]
    )
    same_shape = Spec("qwen3-moe", layers=2, experts=5, hidden=128, intermediate=192, seed=1)
    twin = write_checkpoint(tmp_path / "twin", same_shape)
    rep = verify(made[1], source=twin)
    assert rep.problems and all("differs from the source re-derived" in p for p in rep.problems)


def test_against_flashinfer_without_flashinfer(made, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.delitem(sys.modules, "fi_convert.verify.flashinfer_reference", raising=False)
    with pytest.raises(FiConvertError, match=r"`pip install flashinfer-python==0\.7\.2\.post1`"):
        verify(made[1], source=made[0], against_flashinfer=True)
    r = cli("verify", made[1], "--source", made[0], "--against-flashinfer")
    assert r.exit_code == 1 and "error: --against-flashinfer needs FlashInfer" in r.output


def test_every_bad_file_is_reported_in_manifest_order(made, tmp_path):
    """Files are hashed in parallel; each problem is still found, in the manifest's order."""
    from fi_convert import check_files, read_manifest

    out = _copy(made[1], tmp_path)
    m = read_manifest(out)
    names = [n for n in m["files"] if n.endswith(".safetensors")]
    assert len(names) >= 2
    (out / names[0]).unlink()
    with open(out / names[-1], "r+b") as f:  # one byte changed: same size, other SHA-256
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    (out / "config.json").write_text("{}")
    order = list(m["files"])
    want = {names[0]: "missing", names[-1]: "SHA-256 differs", "config.json": "bytes, manifest"}
    problems = check_files(out, m)
    assert len(problems) == 3
    got = sorted(want, key=order.index)
    for p, name in zip(problems, got, strict=True):
        assert name in p and want[name] in p


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 3 * 65536 + 7])
def test_file_hash_across_windows(tmp_path, size):
    from fi_convert.format.hashes import sha256_file

    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    p = tmp_path / "f"
    p.write_bytes(data)
    for window in (65536, 1 << 28):
        assert sha256_file(p, window=window) == hashlib.sha256(data).hexdigest()


def test_verify_full_reuses_its_staging_buffers(made, monkeypatch):
    """Re-deriving every expert stages source bytes expert by expert; the buffers are handed
    back after each, so the number held does not grow with the experts checked."""
    from fi_convert.schemes.base import Ctx

    held: list[int] = []
    real = Ctx.stage

    def stage(self, shape, dtype):
        t = real(self, shape, dtype)
        held.append(len(self._used) + len(self._free))
        return t

    monkeypatch.setattr(Ctx, "stage", stage)
    rep = verify(made[1], source=str(made[0]), full=True, device="cpu")
    assert rep.ok, rep.problems
    assert held and max(held) <= 4, max(held)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda m: m.update(files=[]), "'files' is missing or not a dict"),
        (lambda m: m.pop("layers"), "'layers' is missing or not a dict"),
        (lambda m: m.update(tp_size="2"), "'tp_size' is missing or not a positive integer"),
        (lambda m: next(iter(m["files"].values())).pop("sha256"), "has no sha256 and size"),
        (
            lambda m: next(iter(m["layers"].values())).update(padded_hidden_size=None),
            "'padded_hidden_size' is missing",
        ),
        (
            lambda m: next(iter(next(iter(m["layers"].values()))["tensors"].values())).update(
                shape_per_rank="[5, 2]"
            ),
            "has no dtype and shape_per_rank",
        ),
    ],
)
def test_a_damaged_manifest_is_one_line_not_a_traceback(made, tmp_path, edit, words):
    out = _copy(made[1], tmp_path)
    path = out / "fi-convert-manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))
    r = cli("verify", out)
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0] and "convert again" in lines[0], r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize("damage", ["missing", "not json", "no weight_map"])
def test_a_missing_or_garbled_index_is_a_mismatch_not_a_traceback(made, tmp_path, damage):
    out = _copy(made[1], tmp_path)
    index = out / "model.safetensors.index.json"
    if damage == "missing":
        index.unlink()
    else:
        index.write_text("{ nope" if damage == "not json" else '{"metadata": {}}')
    r = cli("verify", out)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "model.safetensors.index.json: " in r.stderr


def test_source_check_sees_a_side_file_and_a_carried_tensor_the_source_changed(made, tmp_path):
    """After converting, the source's tokenizer config and a non-expert tensor's data (same
    shape, so the fingerprint of headers is the same) change: --source names the side file,
    --full the tensor too."""
    import shutil

    src, out = made
    new = tmp_path / "src"
    shutil.copytree(src, new)
    (new / "tokenizer_config.json").write_text('{"changed": true}\n')
    index = json.loads((new / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.embed_tokens.weight"
    shard = new / index[name]
    header, _ = read_header(shard)
    info = header[name]
    with open(shard, "r+b") as f:  # flip one byte of its data
        f.seek(info.start)
        b = f.read(1)
        f.seek(info.start)
        f.write(bytes([b[0] ^ 0x01]))
    rep = verify(out, source=new, device="cpu")
    assert any(p.startswith("tokenizer_config.json: differs from the source") for p in rep.problems)
    assert not any(name in p for p in rep.problems)  # bytes of carried tensors: --full only
    rep = verify(out, source=new, full=True, device="cpu")
    assert any(f"{name} differs from the source" in p for p in rep.problems), rep.problems
    assert verify(out, source=src, full=True, device="cpu").ok
