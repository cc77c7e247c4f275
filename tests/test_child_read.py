"""The read whose readers run in a child process (fi_convert/child_read.py), on the CPU: the
same bytes as the files hold, every fault one line naming the file, and nothing left running
or open after it, however it ends."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
import torch

from fi_convert import child_read
from fi_convert.bulk_read import ReadError
from fi_convert.child_read import ChildRing, ProcessRead

MIB = 1 << 20
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, int, torch.Tensor]:
    data = random.Random(7).randbytes(24 * MIB)
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield path, fd, torch.frombuffer(bytearray(data), dtype=torch.uint8)
    os.close(fd)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _requests(
    read: ProcessRead, path: Path, fd: int, ref: torch.Tensor, seed: int, device: str = "cpu"
) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(30):
        n = rng.randrange(1, 3 * MIB)
        off = rng.randrange(0, ref.numel() - n)
        dst = torch.zeros(n, dtype=torch.uint8, device=device)
        read.add(path, fd, off, dst)
        out.append((dst, ref[off : off + n]))
    rows = (50, 1000, 4096)  # a column slice: rows of 1000 bytes, 4096 apart
    dst = torch.zeros(50 * 1000, dtype=torch.uint8, device=device)
    read.add_rows(path, fd, 12345, rows, dst)
    out.append((dst, ref[12345:].as_strided((50, 1000), (4096, 1)).reshape(-1)))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("given", [False, True])
def test_reads_the_files_bytes(data_file, threads, given, device) -> None:
    """Ranges and a column slice's rows, into host memory or a GPU (the ring pinned, the
    driver's copies): the files' bytes."""
    path, fd, ref = data_file
    before = _open_fds()
    ring = ChildRing(device, 4 * MIB, MIB, threads) if given else None
    for seed in range(2):  # (a given ring serves one read after another)
        read = ProcessRead(device, ring=ring, threads=threads, chunk=MIB)
        wanted = _requests(read, path, fd, ref, seed, device)
        stats = read.run()
        assert all(torch.equal(got.cpu(), want) for got, want in wanted)
        assert stats.bytes == sum(w.numel() for _, w in wanted)
    if ring is not None:
        ring.close()
    assert _open_fds() == before  # the ring's memory, the socket, the wake pipe: all closed


@pytest.mark.parametrize("device", DEVICES)
def test_copies_held_then_released(data_file, device) -> None:
    """Requests joining a started read, the copies held while they come (the ring takes the
    read): every byte in place once released."""
    path, fd, ref = data_file
    read = ProcessRead(device, threads=2, chunk=MIB)
    read.start(more=True)
    with read.copies_held():
        wanted = _requests(read, path, fd, ref, 3, device)
        read.more()
    read.wait()
    assert all(torch.equal(got.cpu(), want) for got, want in wanted)


def test_a_short_read_names_the_file(data_file, monkeypatch) -> None:
    """A file shorter than the child is asked to read (truncated after it was planned: the
    size check is left out here) ends the read with one line naming it."""
    path, fd, ref = data_file
    monkeypatch.setattr(ProcessRead, "_check_sizes", lambda self, jobs: None)
    read = ProcessRead("cpu", threads=2, chunk=MIB)
    read.add(path, fd, ref.numel() - 100, torch.zeros(1000, dtype=torch.uint8))
    with pytest.raises(ReadError) as e:
        read.run()
    text = str(e.value)
    assert str(path) in text and "ends at byte" in text and "\n" not in text


def test_the_child_killed_mid_read_is_one_line(data_file) -> None:
    """More jobs than the ring holds, the copies held: the child stops at a full ring, is
    killed there, and the read ends with one line, nothing left open."""
    path, fd, ref = data_file
    before = _open_fds()
    read = ProcessRead("cpu", threads=2, chunk=MIB)
    monkey_ring = ChildRing("cpu", 4 * MIB, MIB, 2)  # 4 slots, 24 jobs
    read._ring, read._own = monkey_ring, True
    read.start(more=True)
    with read.copies_held():
        dst = torch.zeros(ref.numel(), dtype=torch.uint8)
        read.add(path, fd, 0, dst)
        read.more()
        assert monkey_ring.proc is not None
        os.kill(monkey_ring.proc.pid, signal.SIGKILL)
        monkey_ring.proc.wait()
    with pytest.raises(ReadError, match="child process ended"):
        read.wait()
    assert _open_fds() == before


def test_ctrl_c_at_the_terminal_leaves_the_child_to_the_parent(data_file) -> None:
    """SIGINT reaches the child too (the terminal's process group): it says nothing and reads
    on; the parent's read ends it."""
    path, fd, ref = data_file
    ring = ChildRing("cpu", 8 * MIB, MIB, 2)
    assert ring.proc is not None
    ring.ready()  # (set up: a signal before would find it starting)
    os.kill(ring.proc.pid, signal.SIGINT)
    read = ProcessRead("cpu", ring=ring)
    dst = torch.zeros(ref.numel(), dtype=torch.uint8)
    read.add(path, fd, 0, dst)
    read.run()
    assert torch.equal(dst, ref)
    proc = ring.proc
    ring.close()
    assert proc.returncode == 0  # (ended by its socket's close, not by the signal)


def test_abort_mid_read_ends_the_child(data_file) -> None:
    path, fd, ref = data_file
    before = _open_fds()
    read = ProcessRead("cpu", threads=2, chunk=MIB)
    read.start(more=True)
    ring = read._ring
    assert ring is not None and ring.proc is not None
    proc = ring.proc
    with read.copies_held():
        read.add(path, fd, 0, torch.zeros(ref.numel(), dtype=torch.uint8))
        read.more()
        read.abort()
    assert proc.poll() is not None  # the child is gone, and reaped
    assert _open_fds() == before


def test_the_child_imports_no_torch() -> None:
    """The child starts in milliseconds: the standard library only."""
    text = child_read.CHILD.read_text()
    imports = [ln for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert imports and all(
        ln.split()[1] in {"mmap", "os", "queue", "signal", "socket", "struct", "sys", "threading"}
        for ln in imports
    )


def test_the_ring_keeps_within_the_host_memory_budget(monkeypatch) -> None:
    monkeypatch.setenv("FI_CONVERT_HOST_MEMORY", "16MiB")
    assert child_read.ring_bytes() == 16 * MIB
    monkeypatch.setenv("FI_CONVERT_HOST_MEMORY", "4GiB")
    assert child_read.ring_bytes() == child_read.RING


def test_a_child_started_for_a_model_that_never_loads_ends(monkeypatch) -> None:
    """The read started while the server builds the model (`whole_read.Ahead`, the child's
    read set): a build that fails closes it, the child gone and nothing left open."""
    from fi_convert.format import whole_read

    monkeypatch.setattr(child_read, "PROCESS", True)
    before = _open_fds()
    ahead = whole_read.Ahead("cpu")
    ring = ahead.ring
    assert ring is not None and ring.proc is not None
    proc = ring.proc
    ahead.close()
    assert proc.poll() is not None and ahead.ring is None
    assert _open_fds() == before
