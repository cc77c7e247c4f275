"""fi_convert/st_io.py (header reader and shard writer), on corrupt safetensors headers: each
corruption the safetensors library refuses is refused too (exit 1, one `error:` line naming the
shard, no traceback, no manifest), headers it reads are read as it reads them, and no output
shard is one it would refuse."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fi_convert import OutputError, SourceError, st_io
from fi_convert.format.hashes import sha256_file
from fi_convert.st_io import OutEntry, ShardWriter, build_header, read_header
from fi_convert.testing.synthetic import write_checkpoint

from .conftest import cli
from .test_errors import (
    MANIFEST,
    MX,
    MX_L,
    convert,
    error_line,
    load_index,
    save_index,
    shard_of,
)

W1 = f"{MX_L}.0.w1.weight"


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A small Mixtral checkpoint (3 shards, each with experts)."""
    return write_checkpoint(tmp_path_factory.mktemp("pristine") / "mx", MX)


@pytest.fixture
def model(pristine, tmp_path) -> Path:
    """A fresh, writable copy of the pristine checkpoint."""
    dst = tmp_path / "model"
    shutil.copytree(pristine, dst)
    return dst


class Hang(BaseException):
    """Raised by `time_limit`: not an Exception (nor an OSError, as TimeoutError is), so no
    `except` of the code under test turns it into a clean error."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: SIGALRM interrupts a blocked read (a FIFO) or a slow parse."""

    def expired(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def split(path: Path) -> tuple[bytes, bytes]:
    """A shard's header bytes (no length prefix, padding kept) and its data bytes."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + n], raw[8 + n :]


def join(header: bytes | dict, data: bytes, pad: bool = True) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def edit(path: Path, change: Callable[[dict], object]) -> None:
    """Rewrite the header of `path` as `change` edits its JSON (in place, or returned as the
    new header: a dict or raw bytes); the data stays as it is."""
    head, data = split(path)
    meta = json.loads(head)
    new = change(meta)
    path.write_bytes(join(meta if new is None else new, data))  # type: ignore[arg-type]


def offsets(meta: dict, name: str) -> list[int]:
    return meta[name]["data_offsets"]


def by_offset(meta: dict) -> list[str]:
    return sorted((k for k in meta if k != "__metadata__"), key=lambda k: offsets(meta, k))


def refused(model: Path, tmp_path: Path, shard: Path, *needles: str) -> str:
    out = tmp_path / "out"
    with time_limit(60):
        res = convert(model, out, "--scheme", "bf16")
    line = error_line(res, shard.name, *needles, out=out)
    assert not out.exists() or not any(out.glob("*.safetensors"))
    return line


def output_files(out: Path) -> dict[str, bytes]:
    """Every output file's bytes; the manifest without the source fingerprint (a hash of the
    source headers' bytes, which a harmless header edit changes)."""
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}
    m = json.loads(files[MANIFEST])
    m["source"].pop("fingerprint")
    files[MANIFEST] = json.dumps(m, sort_keys=True).encode()
    return files


@pytest.fixture(scope="module")
def clean_output(pristine, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("clean") / "out"
    assert convert(pristine, out, "--scheme", "bf16").exit_code == 0
    return output_files(out)


# ------------------------------------------------------- data offsets: overlap, gap, size


def test_a_tensor_pointing_at_another_tensors_bytes(model, tmp_path):
    """Expert 1's w1 made to read expert 0's w1 (the same size): before, it converted and
    expert 1 silently got expert 0's weights."""
    shard = shard_of(model, W1)
    edit(shard, lambda m: m[f"{MX_L}.1.w1.weight"].update(data_offsets=offsets(m, W1)))
    refused(model, tmp_path, shard, "overlaps", "corrupt")


def test_a_tensor_overlapping_half_of_the_next(model, tmp_path):
    shard = shard_of(model, W1)

    def shift(m: dict) -> None:
        names = by_offset(m)
        a, b = offsets(m, names[0]), offsets(m, names[1])
        half = (a[1] - a[0]) // 2
        m[names[0]]["data_offsets"] = [a[0] + half, a[1] + half]
        assert a[1] + half <= b[1]

    edit(shard, shift)
    refused(model, tmp_path, shard, "corrupt")


def test_a_gap_before_a_tensor(model, tmp_path):
    """The last tensor moved 8 bytes on, the file grown by 8: it read shifted bytes."""
    shard = shard_of(model, W1)
    head, data = split(shard)
    meta = json.loads(head)
    last = by_offset(meta)[-1]
    meta[last]["data_offsets"] = [o + 8 for o in offsets(meta, last)]
    shard.write_bytes(join(meta, data + bytes(8)))
    refused(model, tmp_path, shard, "gap", "corrupt")


def test_a_gap_at_the_start_of_the_data(model, tmp_path):
    shard = shard_of(model, W1)
    head, data = split(shard)
    meta = json.loads(head)
    for name in by_offset(meta):
        meta[name]["data_offsets"] = [o + 8 for o in offsets(meta, name)]
    shard.write_bytes(join(meta, bytes(8) + data))
    refused(model, tmp_path, shard, "gap", "corrupt")


def test_trailing_bytes_after_the_last_tensor(model, tmp_path):
    shard = shard_of(model, W1)
    with open(shard, "ab") as f:
        f.write(b"\0" * 16)
    refused(model, tmp_path, shard, "corrupt")


def test_reversed_data_offsets(model, tmp_path):
    shard = shard_of(model, W1)
    edit(shard, lambda m: m[W1].update(data_offsets=offsets(m, W1)[::-1]))
    refused(model, tmp_path, shard, repr(W1))


def test_an_empty_tensor_inside_another_tensors_bytes(model, tmp_path):
    shard = shard_of(model, W1)
    a, b = json.loads(split(shard)[0])[W1]["data_offsets"]
    empty = {"dtype": "BF16", "shape": [0], "data_offsets": [a + 2, a + 2]}
    edit(shard, lambda m: m.update({"extra.empty": empty}))
    refused(model, tmp_path, shard, "'extra.empty'", "overlaps")


def test_negative_zero_offset(model, tmp_path):
    """`-0` is a float to the library (it refuses it as an offset), 0 to Python's json."""
    shard = shard_of(model, W1)
    head, data = split(shard)
    meta = json.loads(head)
    first = by_offset(meta)[0]
    text = json.dumps(meta).replace(
        json.dumps({first: meta[first]})[1:-1],
        json.dumps(
            {first: {**meta[first], "data_offsets": ["NEGZERO", meta[first]["data_offsets"][1]]}}
        )[1:-1],
    )
    assert "NEGZERO" in text
    shard.write_bytes(join(text.replace('"NEGZERO"', "-0").encode(), data))
    refused(model, tmp_path, shard, "corrupt")


# ------------------------------------------------------------------- duplicate keys


def _with_duplicate(meta: dict, name: str, value: dict) -> bytes:
    """The header's JSON text with a second entry for `name` at its end."""
    text = json.dumps(meta)
    return (text[:-1] + ", " + json.dumps(name) + ": " + json.dumps(value) + "}").encode()


def test_a_tensor_name_twice(model, tmp_path):
    """Expert 0's w1 a second time, pointing at expert 1's bytes: Python's json took the
    second, another reader the first."""
    shard = shard_of(model, W1)
    edit(shard, lambda m: _with_duplicate(m, W1, m[f"{MX_L}.1.w1.weight"]))
    refused(model, tmp_path, shard, "twice", repr(W1))


def test_a_tensor_name_twice_with_the_same_entry(model, tmp_path):
    """The library takes this (the last wins and nothing else changes); we refuse it too:
    a header with a key twice is not one that any writer produced."""
    shard = shard_of(model, W1)
    edit(shard, lambda m: _with_duplicate(m, W1, m[W1]))
    refused(model, tmp_path, shard, "twice")


def test_a_field_twice_in_a_tensor_entry(model, tmp_path):
    shard = shard_of(model, W1)

    def twice(m: dict) -> bytes:
        text = json.dumps(m)
        entry = json.dumps(m[W1])
        return text.replace(entry, entry[:-1] + ', "dtype": "F16"}').encode()

    edit(shard, twice)
    refused(model, tmp_path, shard, "twice", "'dtype'")


def test_metadata_twice(model, tmp_path):
    shard = shard_of(model, W1)
    edit(shard, lambda m: _with_duplicate(m, "__metadata__", {"format": "np"}))
    refused(model, tmp_path, shard, "twice", "__metadata__")


# ------------------------------------------------------------------------ __metadata__


@pytest.mark.parametrize(
    "metadata",
    [b'["pt"]', b'"pt"', b"7", b'{"format": 1}', b'{"format": null}', b'{"format": NaN}'],
    ids=["list", "string", "number", "int-value", "null-value", "nan-value"],
)
def test_metadata_that_is_not_a_map_of_strings(model, tmp_path, metadata):
    shard = shard_of(model, W1)

    def replace(m: dict) -> bytes:
        m["__metadata__"] = "METADATA"
        return json.dumps(m).replace('"METADATA"', metadata.decode()).encode()

    edit(shard, replace)
    refused(model, tmp_path, shard, "corrupt")


def test_source_metadata_never_reaches_the_output(model, tmp_path, clean_output):
    """Odd but valid `__metadata__` strings (control characters, non-ASCII, a long value,
    a key that looks like a tensor) are read, and the output's metadata is ours alone."""
    shard = shard_of(model, W1)
    odd = {"format": "pt\n\u0000\u2028", "ü": "é" * 5000, W1: "{}", "": ""}
    edit(shard, lambda m: m.update({"__metadata__": odd}))
    out = tmp_path / "out"
    assert convert(model, out, "--scheme", "bf16").exit_code == 0
    assert output_files(out) == clean_output
    for p in out.glob("*.safetensors"):
        with safe_open(p, framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}


# ------------------------------------------------------------------------- shapes


def _norm(model: Path) -> tuple[Path, str]:
    """A 1-D tensor (a norm weight) and its shard."""
    wm = load_index(model)["weight_map"]
    name = next(n for n in wm if n.endswith("norm.weight"))
    return model / wm[name], name


def test_a_boolean_dimension(model, tmp_path):
    """[H] written as [true, H]: Python's json gives an int-like True, which was carried
    into the output header as `true` (a shard the library cannot open)."""
    shard, name = _norm(model)
    edit(shard, lambda m: m[name].update(shape=[True, *m[name]["shape"]]))
    refused(model, tmp_path, shard, repr(name), "malformed")


@pytest.mark.parametrize("dim", [2.0, "2", -2, None], ids=["float", "string", "negative", "null"])
def test_a_dimension_that_is_not_a_size(model, tmp_path, dim):
    shard, name = _norm(model)
    edit(shard, lambda m: m[name].update(shape=[dim, m[name]["shape"][0] // 2]))
    refused(model, tmp_path, shard, repr(name), "malformed")


@pytest.mark.parametrize(
    "shape",
    [[2**64, 0], [2**63, 0], [2**32, 2**32, 0], [10**30, 0]],
    ids=["u64-overflow", "over-int64", "product-overflow", "huge"],
)
def test_a_huge_dimension_of_an_empty_tensor(model, tmp_path, shape):
    """An extra empty tensor of a huge shape where the data ends: zero bytes, so a size
    check alone passes; it was carried into the output with that shape."""
    shard = shard_of(model, W1)
    end = max(
        offsets(json.loads(split(shard)[0]), n)[1] for n in by_offset(json.loads(split(shard)[0]))
    )
    empty = {"dtype": "BF16", "shape": shape, "data_offsets": [end, end]}
    edit(shard, lambda m: m.update({"model.extra.empty": empty}))
    refused(model, tmp_path, shard, "'model.extra.empty'")


def test_a_shape_that_needs_other_bytes(model, tmp_path):
    shard = shard_of(model, W1)
    edit(shard, lambda m: m[W1].update(shape=[m[W1]["shape"][0] - 1, m[W1]["shape"][1]]))
    refused(model, tmp_path, shard, repr(W1), "bytes")


# -------------------------------------------------------------------- dtypes and names


@pytest.mark.parametrize("dtype", ["F33", "bf16", "F4", 16])
def test_a_dtype_we_do_not_know(model, tmp_path, dtype):
    """Unknown to the library, or (F4) known to it but not to fi-convert: refused."""
    shard = shard_of(model, W1)
    edit(shard, lambda m: m[W1].update(dtype=dtype))
    refused(model, tmp_path, shard, repr(W1), "malformed")


def test_a_tensor_name_that_is_not_unicode(model, tmp_path):
    """A lone surrogate escape in a name (index and shard agree): Python's json took it and
    wrote it into the output header, which the library cannot open."""
    shard, name = _norm(model)
    bad = name + "\ud800"
    edit(shard, lambda m: m.update({bad: m.pop(name)}))
    index = load_index(model)
    index["weight_map"][bad] = index["weight_map"].pop(name)
    save_index(model, index)
    refused(model, tmp_path, shard, "corrupt")


def test_a_header_that_is_not_utf8(model, tmp_path):
    shard = shard_of(model, W1)
    edit(shard, lambda m: json.dumps(m).encode().replace(b'"format"', b'"f\xffrmat"'))
    refused(model, tmp_path, shard, "UTF-8")


def test_a_header_in_utf16(model, tmp_path):
    """Python's json.loads of bytes guesses UTF-16; the library reads UTF-8 only."""
    shard = shard_of(model, W1)
    head, data = split(shard)
    shard.write_bytes(join(head.decode().encode("utf-16-le"), data, pad=False))
    refused(model, tmp_path, shard, "corrupt")


# ------------------------------------------------------------------ JSON and lengths


def test_a_header_nested_very_deep(model, tmp_path):
    """A RecursionError traceback before."""
    shard = shard_of(model, W1)
    deep = b"[" * 200_000 + b"]" * 200_000
    edit(shard, lambda m: json.dumps(m).encode()[:-1] + b', "x": ' + deep + b"}")
    refused(model, tmp_path, shard, "corrupt")


def test_a_header_nested_deeper_than_the_library_reads(model, tmp_path):
    """Python's json reads 300 levels (in a field readers ignore); the library (serde_json)
    stops at 128."""
    shard = shard_of(model, W1)

    def deepen(m: dict) -> bytes:
        m[W1]["note"] = "DEEP"
        return json.dumps(m).replace('"DEEP"', "[" * 300 + "]" * 300).encode()

    edit(shard, deepen)
    refused(model, tmp_path, shard, "recursion limit")


@pytest.mark.parametrize("text", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_numbers_that_are_not_json(model, tmp_path, text):
    """Python's json reads NaN and Infinity (and 1e400 as inf) in an extra field; the
    library refuses them."""
    shard = shard_of(model, W1)

    def add(m: dict) -> bytes:
        m[W1]["note"] = "NUMBER"
        return json.dumps(m).replace('"NUMBER"', text.decode()).encode()

    edit(shard, add)
    refused(model, tmp_path, shard, "corrupt")


@pytest.mark.parametrize("tail", [b"x", b"\0\0\0", b"//", b",", b"{}"])
def test_garbage_after_the_json(model, tmp_path, tail):
    shard = shard_of(model, W1)
    head, data = split(shard)
    shard.write_bytes(join(head.rstrip() + tail, data))
    refused(model, tmp_path, shard, "corrupt")


def test_a_header_over_the_librarys_size_limit(tmp_path):
    """The library's limit is 100,000,000 bytes (we had 100 MiB): refused before reading."""
    p = tmp_path / "big.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", st_io.MAX_HEADER + 1) + b"{}")
        f.truncate(8 + st_io.MAX_HEADER + 8)  # sparse: no disk used
    with pytest.raises(SourceError, match="over the safetensors limit") as e:
        read_header(p)
    assert str(p) in str(e.value)
    with pytest.raises(Exception, match="too large"):
        safe_open(p, framework="numpy")


def test_a_fifo_as_a_shard_is_refused_not_read(model, tmp_path):
    shard = shard_of(model, W1)
    shard.unlink()
    os.mkfifo(shard)
    refused(model, tmp_path, shard, "not a regular file")


# --------------------------------------------------------- what the library reads, we read


@pytest.mark.parametrize(
    "variant",
    ["unpadded", "leading-space", "newline-padding", "extra-field", "null-metadata", "reorder"],
)
def test_headers_the_library_reads_convert_to_the_same_bytes(
    model, tmp_path, clean_output, variant
):
    """Harmless variations that the library accepts are accepted, with the same output."""
    shard = shard_of(model, W1)
    head, data = split(shard)
    meta = json.loads(head)
    if variant == "unpadded":
        new = join(json.dumps(meta).encode(), data, pad=False)
    elif variant == "leading-space":
        new = join(b" \n\t" + json.dumps(meta).encode(), data)
    elif variant == "newline-padding":
        new = join(json.dumps(meta, indent=1).encode() + b"\n\r\n", data)
    elif variant == "extra-field":
        meta[W1]["comment"] = {"any": [1, 2.5, None, True]}
        new = join(meta, data)
    elif variant == "null-metadata":
        meta["__metadata__"] = None
        new = join(meta, data)
    else:
        new = join(dict(reversed(list(meta.items()))), data)
    shard.write_bytes(new)
    with safe_open(shard, framework="numpy"):
        pass  # the library reads it
    out = tmp_path / "out"
    assert convert(model, out, "--scheme", "bf16").exit_code == 0
    assert output_files(out) == clean_output


# ------------------------------------------------------------------------ the writer


def test_verify_refuses_a_shard_the_library_cannot_open(pristine, tmp_path):
    """An output shard rewritten with a `true` dimension, its SHA-256 put in the manifest:
    `verify` passed before (Python sees True == 1); the library cannot open the file."""
    out = tmp_path / "out"
    assert convert(pristine, out, "--scheme", "bf16").exit_code == 0
    index = load_index(out)
    name = next(n for n in index["weight_map"] if n.endswith("norm.weight"))
    shard = out / index["weight_map"][name]
    edit(shard, lambda m: m[name].update(shape=[True, *m[name]["shape"]]))
    m = json.loads((out / MANIFEST).read_text())
    m["files"][shard.name] = {"sha256": sha256_file(shard), "size": shard.stat().st_size}
    (out / MANIFEST).write_text(json.dumps(m, indent=2))
    res = cli("verify", out)
    assert res.exit_code != 0
    assert "ok" not in res.stdout
    assert "Traceback" not in res.output
    assert shard.name in res.output


def test_the_plugins_reader_goes_without_the_librarys_parse(pristine, tmp_path, monkeypatch):
    """The plugins' loads read every byte by fi-convert's own strict parse (`OutputReader(...,
    library_check=False)`): the safetensors library is not asked (it cost ~20 ms a shard on
    the H200, 0.17 s of a 0.3 s load); the reader of `load_moe_layer` and `verify` asks it."""
    from fi_convert.format.reader import OutputReader

    out = tmp_path / "out"
    assert convert(pristine, out, "--scheme", "bf16").exit_code == 0
    asked: list[Path] = []
    monkeypatch.setattr(st_io, "_library_check", lambda path, names: asked.append(path))
    for check, want in ((False, 0), (True, 1)):
        asked.clear()
        with OutputReader(out, library_check=check) as reader:
            reader.header(reader.shards()[0])
        assert len(asked) == want


@pytest.mark.parametrize(
    "entries",
    [
        [OutEntry("a", "BF16", (2,)), OutEntry("a", "BF16", (2,))],
        [OutEntry("__metadata__", "BF16", (2,))],
        [OutEntry("a\ud800", "BF16", (2,))],
        [OutEntry("a", "F4", (2,))],
        [OutEntry("a", "BF16", (2**64, 0))],
        [OutEntry("a", "BF16", (True, 2))],  # type: ignore[arg-type]
        [OutEntry("a", "BF16", (2.0,))],  # type: ignore[arg-type]
    ],
    ids=["twice", "metadata-name", "surrogate", "unknown-dtype", "huge", "bool", "float"],
)
def test_the_writer_refuses_a_header_the_library_would(tmp_path, entries):
    with pytest.raises(ValueError):
        build_header(entries)
    path = tmp_path / "x.safetensors"
    with pytest.raises(OutputError, match="x.safetensors"):
        ShardWriter(path, entries)
    assert list(tmp_path.iterdir()) == []


def test_the_writer_has_the_library_open_each_finished_shard(tmp_path, monkeypatch):
    """A header that build_header got wrong (here: made to leave a gap) never reaches the
    final name: finish() has the library open the file first."""
    good = build_header
    monkeypatch.setattr(
        st_io, "build_header", lambda entries: good([*entries, OutEntry("z", "U8", (8,))])
    )
    path = tmp_path / "x.safetensors"
    w = ShardWriter(path, [OutEntry("a", "BF16", (4,))])
    # the bytes of "z" are never written: the entries given hold only "a"
    w.write(torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(OutputError, match="safetensors library refuses"):
        w.finish()
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_file_deleted_under_the_writer_is_named(tmp_path):
    """Another program deleting the temporary file: finish() says so (the library's own
    error has no strerror, once shown as "cannot finish (None)")."""
    path = tmp_path / "x.safetensors"
    w = ShardWriter(path, [OutEntry("a", "BF16", (4,))])
    w.write(torch.zeros(4, dtype=torch.bfloat16))
    w.tmp.unlink()
    with pytest.raises(OutputError) as e:
        w.finish()
    assert str(e.value) == (
        f"{path}: cannot finish: x.safetensors.fi-convert-tmp was deleted while it was "
        "written; make sure no other program writes into the out-dir, then run the same "
        "command again to resume"
    )
    assert list(tmp_path.iterdir()) == []


def test_written_shards_open_in_the_library(tmp_path):
    t = {"a": torch.arange(6, dtype=torch.int32).reshape(2, 3), "b": torch.zeros(0, 4)}
    entries = [OutEntry(n, "I32" if n == "a" else "F32", tuple(v.shape)) for n, v in t.items()]
    path = tmp_path / "x.safetensors"
    w = ShardWriter(path, entries)
    for v in t.values():
        w.write(v)
    w.finish()
    with safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_tensor("a"), t["a"])
        assert f.get_tensor("b").shape == (0, 4)
    infos, _ = read_header(path)
    assert [i.name for i in sorted(infos.values(), key=lambda i: i.start)] == ["a", "b"]
    save_file(t, tmp_path / "ref.safetensors")  # the library's own layout of the same data
    assert {
        n: (i.dtype, i.shape) for n, i in read_header(tmp_path / "ref.safetensors")[0].items()
    } == {n: (i.dtype, i.shape) for n, i in infos.items()}
