"""The command line's progress display and result figures (part of the CLI: it uses rich; the
library reports through plain callbacks and never imports this).

Three modes, all on stderr:

- `bar`: a rich progress bar, when stderr is a terminal;
- `plain`: one line at a time, for CI logs (stderr not a terminal), e.g.
  `converting: 41% 2.31 GB/5.67 GB, 612 MB/s, ETA 0:05`. A line is printed when at least
  PLAIN_EVERY_PCT percent more is done AND at least PLAIN_MIN_SECONDS passed since the last
  one (whichever is rarer), and once at 100 %. FI_CONVERT_PROGRESS_SECONDS overrides the
  seconds (tests set 0);
- `off`: `--quiet` or `--json`.

The rate is this run's own bytes (reused ones are counted done, not as speed), and an ETA is
shown only once it means something: ETA_MIN_SECONDS into the run and ETA_MIN_FRACTION of the
run's own work done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)

if TYPE_CHECKING:
    from ..pipeline import Progress as LibProgress
    from ..pipeline import Result

PLAIN_EVERY_PCT = 5.0
PLAIN_MIN_SECONDS = 10.0
ETA_MIN_SECONDS = 2.0
ETA_MIN_FRACTION = 0.05
SECONDS_ENV = "FI_CONVERT_PROGRESS_SECONDS"

Clock = Callable[[], float]


def size(n: float) -> str:
    """Bytes in decimal units, as Hugging Face writes them: 612 B, 2.31 GB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n}"


def rate(bps: float) -> str:
    """A throughput: 612 MB/s (three significant figures at most)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if bps < 999.5 or unit == "TB":
            digits = 0 if bps >= 99.5 else 1 if bps >= 9.95 else 2
            return f"{bps:.{digits}f} {unit}/s"
        bps /= 1000
    return f"{bps}"


def duration(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour on."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_mode(console: Console, quiet: bool, as_json: bool) -> str:
    """`bar` on a terminal, `plain` elsewhere (CI logs), `off` with --quiet or --json."""
    if quiet or as_json:
        return "off"
    return "bar" if console.is_terminal else "plain"


def plain_seconds() -> float:
    """PLAIN_MIN_SECONDS, or FI_CONVERT_PROGRESS_SECONDS where it is set."""
    try:
        return float(os.environ.get(SECONDS_ENV, "") or PLAIN_MIN_SECONDS)
    except ValueError:
        return PLAIN_MIN_SECONDS


class Rate:
    """This run's throughput and ETA, from a clock (injected in tests). Bytes counted done
    without being made now (`skipped`: reused files) are left out of the rate."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.t0: float | None = None  # the first report's time
        self.done = self.total = self.skipped = 0

    def update(self, done: int, total: int, skipped: int = 0) -> None:
        if self.t0 is None:
            self.t0 = self.clock()
        self.done, self.total, self.skipped = done, total, skipped

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else self.clock() - self.t0

    def bps(self) -> float | None:
        t = self.elapsed()
        return (self.done - self.skipped) / t if t > 0 else None

    def eta(self) -> float | None:
        """Seconds left; None until ETA_MIN_SECONDS passed and ETA_MIN_FRACTION of this run's
        own bytes are done (an early rate is mostly start-up cost)."""
        own, work = self.done - self.skipped, self.total - self.skipped
        bps = self.bps()
        if self.elapsed() < ETA_MIN_SECONDS or work <= 0 or own < ETA_MIN_FRACTION * work:
            return None
        if not bps or self.done >= self.total:
            return None
        return (self.total - self.done) / bps


class Display:
    """The progress of one phase (`label`: converting, downloading) on `console`, fed by the
    library's callbacks: `on_progress` (a pipeline Progress) or `on_bytes` (done, total)."""

    def __init__(
        self,
        console: Console,
        how: str,
        label: str = "converting",
        *,
        clock: Clock = time.monotonic,
        every_pct: float = PLAIN_EVERY_PCT,
        min_seconds: float | None = None,
    ) -> None:
        self.console, self.how, self.label, self.clock = console, how, label, clock
        self.every_pct = every_pct
        self.min_seconds = plain_seconds() if min_seconds is None else min_seconds
        self.rate = Rate(clock)
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.last_pct = 0.0
        self.last_t = clock()
        self.said_resume = False
        self.printed_end = False
        self.tensors = ""

    @property
    def on(self) -> bool:
        return self.how != "off"

    def __enter__(self) -> Display:
        return self

    def _start_bar(self) -> None:
        """The bar, started with the first report (a phase that reports nothing shows none)."""
        if self.bar is None:
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                DownloadColumn(),
                TextColumn("{task.fields[speed]}"),
                TextColumn("{task.fields[eta]}"),
                TextColumn("{task.fields[tensors]}"),
                console=self.console,
                transient=False,
            )
            self.bar.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.bar is not None:
            self.bar.stop()

    def callback(self) -> Callable[[LibProgress], None] | None:
        """The pipeline's progress callback, or None when the display is off."""
        return self.on_progress if self.on else None

    def bytes_callback(self) -> Callable[[int, int], None] | None:
        return self.on_bytes if self.on else None

    def on_progress(self, p: LibProgress) -> None:
        if p.resume_files and not self.said_resume:
            self.said_resume = True
            self.say(f"resuming: {p.resume_files} files reused ({size(p.resume_bytes)})")
        if p.tensors_total:
            self.tensors = f"{p.tensors_done}/{p.tensors_total} tensors"
        self._show(p.bytes_done, p.bytes_total, p.bytes_reused)

    def on_bytes(self, done: int, total: int) -> None:
        self._show(done, total, 0)

    def say(self, text: str) -> None:
        """A line of its own (above the bar, when there is one)."""
        if self.on:
            self.console.print(text, markup=False, highlight=False)

    def _show(self, done: int, total: int, skipped: int) -> None:
        self.rate.update(done, total, skipped)
        if self.how == "bar":
            self._update_bar()
        elif self.how == "plain":
            pct = self._pct()
            now = self.clock()
            if pct >= 100 or (
                pct - self.last_pct >= self.every_pct and now - self.last_t >= self.min_seconds
            ):
                if pct >= 100 and self.printed_end:
                    return
                self._line()

    def _pct(self) -> float:
        r = self.rate
        return 100.0 * r.done / r.total if r.total else 0.0

    def _speed_eta(self) -> tuple[str, str]:
        bps, eta = self.rate.bps(), self.rate.eta()
        speed = rate(bps) if bps is not None and self.rate.elapsed() >= ETA_MIN_SECONDS else ""
        return speed, (f"ETA {duration(eta)}" if eta is not None else "")

    def line(self) -> str:
        """The plain progress line as of now."""
        r = self.rate
        speed, eta = self._speed_eta()
        parts = [f"{self.label}: {self._pct():.0f}% {size(r.done)}/{size(r.total)}"]
        parts += [x for x in (speed, eta) if x]
        return ", ".join(parts)

    def _line(self) -> None:
        self.last_pct, self.last_t = self._pct(), self.clock()
        self.printed_end = self.rate.done >= self.rate.total
        self.say(self.line())

    def _update_bar(self) -> None:
        self._start_bar()
        assert self.bar is not None
        r = self.rate
        speed, eta = self._speed_eta()
        if self.task is None:
            self.task = self.bar.add_task(self.label, total=r.total, speed="", eta="", tensors="")
        self.bar.update(
            self.task,
            total=r.total,
            completed=r.done,
            speed=speed,
            eta=eta,
            tensors=escape(self.tensors),
        )


class Stopwatch:
    """Elapsed time of a command, for its summary."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock, self.t0 = clock, clock()
        self.t1: float | None = None

    def stop(self) -> None:
        """The end of what is timed (the figures are of the time until now)."""
        self.t1 = self.clock()

    def figures(self, nbytes: int, key: str = "bytes") -> dict:
        """`elapsed_s`, `key` (bytes) and `throughput_bps` (None for an instant)."""
        t = (self.clock() if self.t1 is None else self.t1) - self.t0
        return {"elapsed_s": round(t, 3), key: nbytes, "throughput_bps": nbytes / t if t else None}


def figures_text(f: dict, verb: str = "") -> str:
    """`5.67 GB in 0:09 (612 MB/s)` (with `verb`: `5.67 GB checked in ...`) from figures."""
    bps = f.get("throughput_bps")
    speed = f" ({rate(bps)})" if bps else ""
    return f"{size(f['bytes'])}{' ' + verb if verb else ''} in {duration(f['elapsed_s'])}{speed}"


def output_bytes(out_dir: Path) -> int:
    """The size of the files a finished output's manifest lists (0 without a readable one)."""
    from ..format.manifest import read  # the library, once a command ran

    try:
        return sum(int(m["size"]) for m in read(out_dir)["files"].values())
    except Exception:  # noqa: BLE001 - a figure for the summary, never an error of its own
        return 0


def convert_figures(res: Result, watch: Stopwatch) -> dict:
    """A conversion's figures: `bytes` the output's size, `bytes_written` what this run made
    (the rest was reused), `throughput_bps` that over `elapsed_s`."""
    files = res.manifest["files"]
    total = sum(int(m["size"]) for m in files.values())
    kept = sum(int(files[n]["size"]) for n in res.reused_files if n in files)
    written = 0 if res.up_to_date else total - kept
    f = watch.figures(written)
    return {**f, "bytes": total, "bytes_written": written}


def convert_text(f: dict) -> str:
    """`5.67 GB in 0:09 (612 MB/s)`, or `5.67 GB (1.20 GB written) in ...` after a resume."""
    bps = f.get("throughput_bps")
    speed = f" ({rate(bps)})" if bps else ""
    part = f" ({size(f['bytes_written'])} written)" if f["bytes_written"] != f["bytes"] else ""
    return f"{size(f['bytes'])}{part} in {duration(f['elapsed_s'])}{speed}"
