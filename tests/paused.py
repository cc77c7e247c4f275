"""`fi-convert` in a child process that stops at named points of its run until the test lets
it go on, so that a test puts a signal or a second run at a known point and then waits on
what the child says on a pipe, never on time.

Points: `lock` (before the out-dir's lock is taken), `started` (the first shard worker has
started, inside `Thread.start`), `write` (the first write of a shard), `abort` (a shard's
temporary file about to be removed), `cleanup` (the out-dir's cleanup after a failure, which
first says how many worker threads are still alive: `workers N`). Each stops once, saying
`at POINT`: until the test says `go(POINT)`, or, for a point given as `stop`, until the shard
workers are shut down (after they were told to stop). `committed` (the manifest written, the
state folder not yet removed) stops after its step, the others before theirs. Each signal
the child's handler takes is said (`signal N`); when CPython runs that handler is its own
affair, so tests wait on what the run does next, not on these.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

SAFETY_S = 300  # a hung child fails the test after this; no step waits on time

CHILD = r"""
import os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, even in a CI job
from fi_convert import cli, outdir, pipeline, st_io
from fi_convert.cli import _process

events = int(sys.argv[1])
points = dict(p.split("=") for p in sys.argv[2].split(",") if p)
wake_r, wake_w = os.pipe()
reached, guard, signals = set(), threading.Lock(), [0]
gates = {name: threading.Event() for name in points}


def listen():
    for line in sys.stdin:
        gates[line.split()[1]].set()


threading.Thread(target=listen, daemon=True).start()


def say(line):
    os.write(events, (line + "\n").encode())


def pause(name):
    with guard:
        if name not in points or name in reached:
            return
        reached.add(name)
    say("at " + name)
    if points[name] == "stop":
        os.read(wake_r, 1)
    else:
        gates[name].wait()


def on_signal(signum, frame, real=_process._on_signal):
    signals[0] += 1
    say(f"signal {signals[0]}")
    return real(signum, frame)


def before(cls, name, point):
    real = getattr(cls, name)

    def wrapped(*args, **kwargs):
        pause(point)
        return real(*args, **kwargs)

    setattr(cls, name, wrapped)


class Pool(pipeline.ThreadPoolExecutor):
    def shutdown(self, *args, **kwargs):
        if self._thread_name_prefix == "fi-convert-shard":
            os.write(wake_w, b"x")
        super().shutdown(*args, **kwargs)


def cleanup(od, real=outdir.OutDir._cleanup):
    names = ("fi-convert-shard_", "fi-convert-write_", "fi-convert-hash_")  # a pool's threads
    say(f"workers {sum(t.name.startswith(names) for t in threading.enumerate())}")
    pause("cleanup")
    real(od)


def after(cls, name, point):
    real = getattr(cls, name)

    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        pause(point)
        return out

    setattr(cls, name, wrapped)


_process._on_signal = on_signal
pipeline.ThreadPoolExecutor = Pool
outdir.OutDir._cleanup = cleanup
before(st_io.ShardWriter, "write_bytes", "write")
before(st_io.ShardWriter, "abort", "abort")
before(outdir.OutDir, "_lock", "lock")
after(outdir.OutDir, "commit", "committed")
real_start = threading.Thread.start


def start(thread):
    real_start(thread)
    if thread.name.startswith("fi-convert-shard_"):
        pause("started")


threading.Thread.start = start
sys.argv = ["fi-convert", *sys.argv[3:]]
cli.main()
"""


class Paused:
    """`fi-convert *args` in a child that stops at `points` ({point: "go" or "stop"})."""

    def __init__(self, args: list[str], points: dict[str, str]) -> None:
        r, w = os.pipe()
        spec = ",".join(f"{k}={v}" for k, v in points.items())
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(w), spec, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(w,),
        )
        os.close(w)
        self.r, self.buf, self.said = r, b"", []

    @property
    def pid(self) -> int:
        return self.p.pid

    def _line(self) -> str | None:
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.r], [], [], SAFETY_S)
            assert ready, f"the run said nothing for {SAFETY_S} s after {self.said}"
            got = os.read(self.r, 4096)
            if not got:
                return None
            self.buf += got
        line, _, self.buf = self.buf.partition(b"\n")
        self.said.append(line.decode())
        return self.said[-1]

    def wait_for(self, want: str) -> None:
        """Until the child says (or has said) `want`; it must, before it ends."""
        while want not in self.said:
            if self._line() is None:
                _, err = self.p.communicate(timeout=SAFETY_S)
                raise AssertionError(f"ended without saying {want!r} (said {self.said}): {err}")

    def go(self, point: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(f"go {point}\n")
        self.p.stdin.flush()

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        """Ctrl-C (or `sig`)."""
        self.p.send_signal(sig)

    def finish(self) -> tuple[int, str, str]:
        """The child's exit status, stdout and stderr, once it ends."""
        out, err = self.p.communicate(timeout=SAFETY_S)
        return self.p.returncode, out, err

    def __enter__(self) -> Paused:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.communicate()
        if self.r >= 0:
            os.close(self.r)
            self.r = -1
