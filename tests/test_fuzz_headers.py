"""fi_convert/st_io.py (the safetensors header reader), under seeded random corruptions of a real
shard's header: the reader answers each with a one-line FiConvertError naming the file, or reads
exactly what the safetensors library reads; never a traceback, a hang, or tensors other than the
library's. A few conversions through the CLI end in one error line or in exactly the clean run's
bytes.

`make test` runs a few hundred cases; `make fuzz` (FI_CONVERT_FUZZ=5000) a few thousand.
FI_CONVERT_FUZZ_SEED shifts the seeds; a failure names its case's seed and mutations.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open

from fi_convert import FiConvertError, dtypes
from fi_convert.st_io import MAX_HEADER, read_header
from fi_convert.testing.synthetic import write_checkpoint

from .test_errors import MX, convert, error_line, shard_of
from .test_headers import W1, Hang, join, output_files, split, time_limit

CASES = int(os.environ.get("FI_CONVERT_FUZZ", "0") or 0) or 600
CLI_CASES = max(12, CASES // 25)
SEED = int(os.environ.get("FI_CONVERT_FUZZ_SEED", "0") or 0)
CASE_SECONDS = 10  # the hang guard: far above any case (a few ms), far below a stuck run

Reading = dict[str, tuple[str, tuple[int, ...], bytes]]
Mutator = Callable[[random.Random, bytes, bytes], tuple[bytes, bytes]]


# --------------------------------------------------------------------------- mutations

# JSON text that json.dumps cannot write, put in place of a placeholder string
RAW = "\u0001RAW\u0001"
BAD_VALUES: list[object] = [
    -1, 0.0, 2.5, True, False, None, "7", [], {}, [1], {"a": 1},
    2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -(2**63),
]  # fmt: skip
BAD_TEXT = ["-0", "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1E2", "0x10", "01", "+1"]
DTYPES = [*dtypes.ITEMSIZE, "F4", "F6_E2M3", "C64", "F33", "bf16", "", "U8 "]
NAMES = ["", "__metadata__", "\u0000", "a\nb", "é", "\ud800", "\udc00x", "\U0001f600", "x" * 300]


def _dumps(meta: object, raw: list[str]) -> bytes:
    """`meta` as JSON, each RAW placeholder replaced in turn by the next text of `raw`."""
    text = json.dumps(meta)
    for r in raw:
        text = text.replace(json.dumps(RAW), r, 1)
    return text.encode("utf-8", "surrogatepass")


def _value(rng: random.Random, raw: list[str]) -> object:
    """A value that is wrong where a size or a string belongs."""
    if rng.random() < 0.35:
        raw.append(rng.choice(BAD_TEXT))
        return RAW
    return rng.choice(BAD_VALUES)


def _deep(rng: random.Random) -> str:
    depth = rng.choice([2, 64, 127, 128, 129, 200, 1000, 5000, 100_000])
    o, c = rng.choice([("[", "]"), ('{"k":', "}")])
    return o * depth + ("1" if o == "[" else "1") + c * depth


def _tensors(meta: dict) -> list[str]:
    return [k for k in meta if k != "__metadata__" and isinstance(meta[k], dict)]


def json_edit(fn: Callable[[random.Random, dict, list[str]], object]) -> Mutator:
    """A mutator that edits the parsed header (a byte flip where it no longer parses)."""

    def mutate(rng: random.Random, head: bytes, data: bytes) -> tuple[bytes, bytes]:
        try:
            meta = json.loads(head)
            assert isinstance(meta, dict) and _tensors(meta)
        except (ValueError, AssertionError, RecursionError):
            return flip(rng, head, data)
        raw: list[str] = []
        new = fn(rng, meta, raw)
        return (new if isinstance(new, bytes) else _dumps(meta, raw)), data

    mutate.__name__ = fn.__name__
    return mutate


def flip(rng: random.Random, head: bytes, data: bytes) -> tuple[bytes, bytes]:
    b = bytearray(head)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b), data


def flip_syntax(rng: random.Random, head: bytes, data: bytes) -> tuple[bytes, bytes]:
    b = bytearray(head)
    for _ in range(rng.randint(1, 3)):
        if b:
            b[rng.randrange(len(b))] = rng.choice(b'{}[],:"0123456789-.eE\\ \n')
    return bytes(b), data


def splice(rng: random.Random, head: bytes, data: bytes) -> tuple[bytes, bytes]:
    """Bytes cut out of the header or put in (the length prefix follows)."""
    i = rng.randrange(len(head) + 1)
    if rng.random() < 0.5:
        return head[:i] + head[i + rng.randint(1, 16) :], data
    return head[:i] + rng.randbytes(rng.randint(1, 8)) + head[i:], data


@json_edit
def offset(rng: random.Random, meta: dict, raw: list[str]) -> None:
    names = _tensors(meta)
    t = meta[rng.choice(names)]
    offs = t.get("data_offsets")
    if not isinstance(offs, list) or len(offs) != 2:
        t["data_offsets"] = [0, 0]
        return
    k = rng.randrange(2)
    other = meta[rng.choice(names)].get("data_offsets")
    choice = rng.randrange(6)
    if choice == 0 and isinstance(offs[k], int):
        offs[k] += rng.choice([-1, 1, -2, 2, -8, 8, 4096])
    elif choice == 1 and isinstance(other, list):
        t["data_offsets"] = list(other)  # another tensor's bytes
    elif choice == 2 and isinstance(offs[0], int) and isinstance(offs[1], int):
        d = rng.choice([-8, 8, 2, (offs[1] - offs[0]) // 2])
        t["data_offsets"] = [offs[0] + d, offs[1] + d]
    elif choice == 3:
        t["data_offsets"] = rng.choice([[], [0], offs + [offs[-1]], offs[::-1], "0,8", None])
    else:
        offs[k] = _value(rng, raw)


@json_edit
def swap_offsets(rng: random.Random, meta: dict, raw: list[str]) -> None:
    a, b = (meta[n] for n in rng.sample(_tensors(meta), 2))
    a["data_offsets"], b["data_offsets"] = b.get("data_offsets"), a.get("data_offsets")


@json_edit
def shape(rng: random.Random, meta: dict, raw: list[str]) -> None:
    t = meta[rng.choice(_tensors(meta))]
    s = t.get("shape")
    if not isinstance(s, list) or not s:
        t["shape"] = [_value(rng, raw)]
        return
    k = rng.randrange(len(s))
    choice = rng.randrange(7)
    if choice == 0 and isinstance(s[k], int):
        s[k] += rng.choice([-1, 1])
    elif choice == 1:
        s.insert(rng.randrange(len(s) + 1), 1)  # the same bytes, another shape
    elif choice == 2 and len(s) > 1 and all(isinstance(d, int) and d % 2 == 0 for d in s):
        s[0], s[-1] = s[0] // 2, s[-1] * 2
    elif choice == 3:
        s.reverse()
    elif choice == 4:
        s.pop(k)
    elif choice == 5:
        s[k] = 0
    else:
        s[k] = _value(rng, raw)


@json_edit
def dtype(rng: random.Random, meta: dict, raw: list[str]) -> None:
    t = meta[rng.choice(_tensors(meta))]
    t["dtype"] = rng.choice(DTYPES) if rng.random() < 0.85 else _value(rng, raw)


@json_edit
def duplicate(rng: random.Random, meta: dict, raw: list[str]) -> bytes:
    """A key twice: a tensor (with its own or another's entry), a field, __metadata__."""
    text = json.dumps(meta)
    names = _tensors(meta)
    which = rng.randrange(3)
    if which == 0:
        entry = json.dumps(meta[rng.choice(names)])
        add = f"{json.dumps(rng.choice(names))}: {entry}"
        return (text[:-1] + ", " + add + "}").encode()
    if which == 1:
        name = rng.choice(names)
        entry = json.dumps(meta[name])
        field = rng.choice(['"dtype": "F16"', '"shape": [1]', '"data_offsets": [0, 0]'])
        field = rng.choice([field, entry[1:-1].split(", ")[0]])
        return text.replace(entry, entry[:-1] + ", " + field + "}", 1).encode()
    return (text[:-1] + ', "__metadata__": {"format": "pt"}}').encode()


@json_edit
def rename(rng: random.Random, meta: dict, raw: list[str]) -> None:
    old = rng.choice(_tensors(meta))
    new = rng.choice([*NAMES, old + ".x", rng.choice(_tensors(meta))])
    meta[new] = meta.pop(old)


@json_edit
def delete(rng: random.Random, meta: dict, raw: list[str]) -> None:
    name = rng.choice(_tensors(meta))
    if rng.random() < 0.5:
        del meta[name]
    else:
        meta[name].pop(rng.choice(["dtype", "shape", "data_offsets"]), None)


@json_edit
def add_tensor(rng: random.Random, meta: dict, raw: list[str]) -> None:
    ends = [
        o for n in _tensors(meta) for o in (meta[n].get("data_offsets") or []) if isinstance(o, int)
    ]
    at = rng.choice([0, max(ends, default=0), rng.choice(ends or [0]) + 2])
    dims = rng.choice([[0], [2**64, 0], [2**63, 0], [2**32, 2**32, 0], [0, 2**32, 2**32], [1]])
    name = rng.choice(["extra.empty", *NAMES])
    meta[name] = {"dtype": rng.choice(["BF16", "U8"]), "shape": dims, "data_offsets": [at, at]}


@json_edit
def extra_field(rng: random.Random, meta: dict, raw: list[str]) -> None:
    """A field readers ignore: harmless, unless its value is not JSON or nests too deep."""
    t = meta[rng.choice(_tensors(meta))]
    choice = rng.randrange(4)
    if choice == 0:
        t["note"] = {"any": [1, 2.5, None, True, "é"]}
    elif choice == 1:
        raw.append(_deep(rng))
        t["note"] = RAW
    else:
        t["note"] = _value(rng, raw)


@json_edit
def metadata(rng: random.Random, meta: dict, raw: list[str]) -> None:
    choice = rng.randrange(6)
    if choice == 0:
        meta.pop("__metadata__", None)
    elif choice == 1:  # harmless: odd but valid strings
        meta["__metadata__"] = {
            rng.choice(NAMES[:5]): rng.choice(["", "pt", "\u2028\u0000", "é" * 100])
        }
    elif choice == 2:
        meta["__metadata__"] = None
    elif choice == 3:
        raw.append(_deep(rng))
        meta["__metadata__"] = RAW
    elif choice == 4:
        meta["__metadata__"] = {"format": _value(rng, raw)}
    else:
        meta["__metadata__"] = _value(rng, raw)


@json_edit
def reformat(rng: random.Random, meta: dict, raw: list[str]) -> bytes:
    """Harmless: other whitespace, another key order."""
    items = list(meta.items())
    rng.shuffle(items)
    text = json.dumps(dict(items), indent=rng.choice([None, 0, 1, 4]))
    return (rng.choice(["", " ", "\n", "\t\r\n "]) + text + rng.choice(["", " ", "\n"])).encode()


def encoding(rng: random.Random, head: bytes, data: bytes) -> tuple[bytes, bytes]:
    choice = rng.randrange(4)
    if choice == 0:
        text = head.decode("utf-8", "replace")
        return text.encode(rng.choice(["utf-16-le", "utf-16", "utf-32"]), "surrogatepass"), data
    if choice == 1:
        return b"\xef\xbb\xbf" + head, data
    if choice == 2:
        return head.replace(b'"dtype"', b'"dt\xc3ype"', 1), data
    return head.replace(b'"dtype"', rng.choice([b'"dtype\\ud800"', b'"\\ud83d\\ude00"']), 1), data


def tail(rng: random.Random, head: bytes, data: bytes) -> tuple[bytes, bytes]:
    """Data bytes added or missing at the end, or garbage after the JSON."""
    choice = rng.randrange(3)
    if choice == 0:
        return head, data + rng.randbytes(rng.choice([1, 7, 8, 4096]))
    if choice == 1:
        return head, data[: -rng.choice([1, 8, len(data) // 2 or 1])]
    return head.rstrip() + rng.choice([b"x", b"\0", b"}", b",", b"//", b" {}"]), data


MUTATORS: list[tuple[Mutator, int]] = [
    (flip, 3), (flip_syntax, 3), (splice, 2), (offset, 5), (swap_offsets, 1), (shape, 5),
    (dtype, 3), (duplicate, 3), (rename, 2), (delete, 2), (add_tensor, 3), (extra_field, 3),
    (metadata, 3), (reformat, 2), (encoding, 2), (tail, 3),
]  # fmt: skip


@json_edit
def benign(rng: random.Random, meta: dict, raw: list[str]) -> bytes:
    """Edits the library reads as the same tensors: odd but valid metadata, a field readers
    ignore, other whitespace and key order."""
    if rng.random() < 0.5:
        meta["__metadata__"] = rng.choice(
            [None, {}, {"format": "pt"}, {"": "\u2028\u0000", "é": "é" * 100}]
        )
    if rng.random() < 0.5:
        meta[rng.choice(_tensors(meta))]["note"] = {"any": [1, 2.5, None, True, "é", [[[]]]]}
    return reformat(rng, _dumps(meta, raw), b"")[0]


HARMLESS: list[Mutator] = [benign]


def file_level(rng: random.Random, blob: bytes) -> tuple[bytes, str]:
    """A damaged length prefix, or the file cut short."""
    (n,) = struct.unpack("<Q", blob[:8])
    if rng.random() < 0.5:
        new = rng.choice(
            [
                0,
                1,
                n - 1,
                n + 1,
                n + 8,
                len(blob),
                MAX_HEADER + 1,
                2**63,
                2**64 - 1,
                rng.getrandbits(64),
            ]
        )
        return struct.pack("<Q", max(0, min(new, 2**64 - 1))) + blob[8:], f"length={new}"
    cut = rng.randrange(len(blob))
    return blob[:cut], f"cut={cut}"


def mutate(
    rng: random.Random, head: bytes, data: bytes, harmless: bool = False
) -> tuple[bytes, str]:
    """A corrupted file of the shard `head`/`data`, and a description of what was done."""
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if harmless:
            m = rng.choice(HARMLESS)
        else:
            m = rng.choices([m for m, _ in MUTATORS], [w for _, w in MUTATORS])[0]
        head, data = m(rng, head, data)
        done.append(m.__name__)
    blob = join(head, data, pad=rng.random() < 0.8)
    if not harmless and rng.random() < 0.1:
        blob, what = file_level(rng, blob)
        done.append(what)
    return blob, "+".join(done)


# ------------------------------------------------------------------------------ oracles


def library_reading(path: Path) -> Reading | None:
    """What the safetensors library reads from `path` (every tensor's dtype, shape and
    bytes), or None where it refuses the file."""
    try:
        with safe_open(path, framework="pt") as f:
            out = {}
            for k in f.keys():  # noqa: SIM118 (a safe_open is no dict)
                t = f.get_tensor(k)
                raw = (
                    t.reshape(-1).view(dtypes.to_torch("U8")).numpy().tobytes()
                    if t.numel()
                    else b""
                )
                out[k] = (dtypes.to_name(t.dtype), tuple(t.shape), raw)
            return out
    except Exception:
        return None


def check_reader(path: Path) -> str:
    """One case: a one-line FiConvertError naming the file, or what the library reads.
    Returns how it ended ("refused", "accepted"); raises AssertionError otherwise."""
    try:
        with time_limit(CASE_SECONDS):
            infos, _ = read_header(path)
    except FiConvertError as e:
        msg = str(e)
        assert "\n" not in msg and "\r" not in msg, f"not one line: {msg!r}"
        assert msg.startswith(f"{path}: "), f"does not name the file: {msg!r}"
        return "refused"
    theirs = library_reading(path)
    assert theirs is not None, "accepted a file the library refuses"
    blob = path.read_bytes()
    ours = {n: (i.dtype, i.shape, blob[i.start : i.start + i.nbytes]) for n, i in infos.items()}
    assert ours == theirs, "read other tensors than the library"
    return "accepted"


# ------------------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("fuzz") / "mx", MX)


@pytest.fixture(scope="module")
def clean(source, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("fuzz-clean") / "out"
    assert convert(source, out, "--scheme", "bf16").exit_code == 0
    return output_files(out)


def test_random_header_corruptions_at_the_reader(source, tmp_path):
    shard = shard_of(source, W1)
    head, data = split(shard)
    path = tmp_path / shard.name
    seen: dict[str, int] = {}
    failures = []
    start = time.monotonic()
    for case in range(CASES):
        seed = SEED * 1_000_003 + case
        blob, what = mutate(random.Random(seed), head, data)
        path.write_bytes(blob)
        try:
            end = check_reader(path)
        except (AssertionError, Exception, Hang) as e:
            failures.append(f"seed {seed} ({what}): {type(e).__name__}: {str(e)[:300]}")
            continue
        seen[end] = seen.get(end, 0) + 1
    took = time.monotonic() - start
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures[:10])
    # not degenerate: corruptions both refused and (where harmless) read as the library reads
    assert seen.get("refused", 0) > CASES // 2 and seen.get("accepted", 0) > 0, seen
    print(f"{CASES} cases in {took:.1f} s: {seen}")


def test_random_header_corruptions_through_the_cli(source, clean, tmp_path):
    """Each mutated checkpoint converts to one error line or to the clean run's exact bytes.
    Drawn again until the library refuses the shard or reads the same tensors from it (an
    edit that the library reads as other weights is a different checkpoint, not damage)."""
    shard = shard_of(source, W1)
    head, data = split(shard)
    want = library_reading(shard)
    ends = {"refused": 0, "clean bytes": 0}
    for case in range(CLI_CASES):
        seed = SEED * 1_000_003 + 10**6 + case
        rng = random.Random(seed)
        model = tmp_path / f"case-{case}"
        shutil.copytree(source, model)
        target = model / shard.name
        for _ in range(100):
            blob, what = mutate(rng, head, data, harmless=rng.random() < 0.35)
            target.write_bytes(blob)
            reading = library_reading(target)
            if reading is None or reading == want:
                break
        out = tmp_path / f"out-{case}"
        with time_limit(60):
            res = convert(model, out, "--scheme", "bf16")
        try:
            if res.exit_code == 0:
                assert reading is not None, "converted a shard the library refuses"
                assert output_files(out) == clean, "converted to other bytes"
                ends["clean bytes"] += 1
            else:
                error_line(res, shard.name, out=out)
                ends["refused"] += 1
        except AssertionError as e:
            raise AssertionError(f"seed {seed} ({what}): {e}") from None
        shutil.rmtree(model)
        shutil.rmtree(out, ignore_errors=True)
    assert ends["refused"] and ends["clean bytes"], ends
    print(f"{CLI_CASES} conversions: {ends}")
