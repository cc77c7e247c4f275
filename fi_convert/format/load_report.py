"""The one line a server's rank logs at the end of its load of an output: the whole load's
time and speed, and how it splits (asking the model where the non-expert bytes go, the read of
the experts' and those bytes at once, the model's `load_weights` then, with the tensors it takes
with their data, kernel setup)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..bulk_read import ReadStats
from .dense import DenseLoad


@dataclass
class LoadReport:
    who: str  # e.g. "TP rank 0/8"
    root: Path
    layers: int  # MoE layers loaded
    moe_bytes: int
    stats: ReadStats
    dense: DenseLoad
    started: float  # perf_counter() at the load's start, and when the bulk read started
    read_started: float
    read_ended: float

    @property
    def nbytes(self) -> int:
        return self.stats.bytes + self.dense.rest_bytes

    def line(self, ended: float, setup: str = "kernel setup") -> str:
        """The line, with `ended` the end of the load (kernel setup, or the server's post-load
        processing, named `setup`, included)."""
        d, st = self.dense, self.stats
        whole = ended - self.started
        return (
            f"fi-convert: {self.who} loaded {_gb(self.nbytes)} in {whole:.2f} s "
            f"({self.nbytes / whole / 1e9 if whole > 0 else 0:.1f} GB/s): prepared in "
            f"{self.read_started - self.started - d.probe_s:.2f} s (the experts' parameters, "
            "the read's plan), the experts of "
            f"{self.layers} MoE layers ({_gb(self.moe_bytes)}) and non-expert tensors "
            f"({_gb(d.direct_bytes)}) read at once in {self.read_ended - self.read_started:.2f} s "
            f"({st.threads} thread{'s' if st.threads != 1 else ''}, "
            f"{(st.pinned_peak + d.pinned_bytes) / 2**20:.0f} MiB pinned), then the model's "
            "load_weights in "
            f"{d.rest_s:.2f} s (non-expert {_gb(d.rest_bytes)} with their data, {len(d.rest)} "
            f"tensors); the model asked where in {d.probe_s:.2f} s, {setup} "
            f"{ended - self.read_ended - d.rest_s:.2f} s; from {self.root}"
        )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
