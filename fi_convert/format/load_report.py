"""The one line a server's rank logs at the end of its load of an output: the whole load's
time and speed, and how it splits (asking the model where the non-expert bytes go, the read of
the experts' and those bytes at once, the model's `load_weights` then, with the tensors it takes
with their data, kernel setup)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .whole_read import WholeRead


@dataclass
class LoadReport:
    who: str  # e.g. "TP rank 0/8"
    root: Path
    layers: int  # MoE layers loaded
    read: WholeRead
    started: float  # perf_counter() at the load's start

    @property
    def nbytes(self) -> int:
        return self.read.stats.bytes + self.read.dense.rest_bytes

    @property
    def prepared_s(self) -> float:
        """The time before the read less the asking's, where the model was asked before it
        (under it, the asking is part of the read's time)."""
        r = self.read
        asked = 0.0 if r.asked_in_read else r.dense.probe_s
        return r.read_started - self.started - asked

    def line(self, ended: float, setup: str = "kernel setup") -> str:
        """The line, with `ended` the end of the load (kernel setup, or the server's post-load
        processing, named `setup`, included)."""
        r = self.read
        d, st = r.dense, r.stats
        whole = ended - self.started
        return (
            f"fi-convert: {self.who} loaded {_gb(self.nbytes)} in {whole:.3f} s "
            f"({self.nbytes / whole / 1e9 if whole > 0 else 0:.1f} GB/s): prepared in "
            f"{self.prepared_s:.3f} s (the experts' parameters, "
            f"the read's plan), the experts of {self.layers} MoE layers ({_gb(r.moe_bytes)}) "
            f"and non-expert tensors ({_gb(d.direct_bytes)}) read at once in "
            f"{r.read_ended - r.read_started:.3f} s ({st.threads} "
            f"thread{'s' if st.threads != 1 else ''}, "
            f"{(st.pinned_peak + d.pinned_bytes) / 2**20:.0f} MiB pinned), then the model's "
            f"load_weights in {d.rest_s:.3f} s (non-expert {_gb(d.rest_bytes)} with their data, "
            f"{len(d.rest)} tensors); {_asking(d.plan, d.probe_s)}, {setup} "
            f"{ended - r.read_ended - d.rest_s:.3f} s; from {self.root}"
        )


def _asking(plan: str, seconds: float) -> str:
    """Where the non-expert bytes go: asked of the model (its answer kept for the next load, or
    why not), or its answer to an earlier load (`DenseLoad.plan`)."""
    if plan == "remembered":
        return f"where they go taken from the model's answer to an earlier load in {seconds:.3f} s"
    kept = plan.removeprefix("asked").removeprefix(", ")
    return f"the model asked where in {seconds:.3f} s" + (f" ({kept})" if kept else "")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
