"""`fi-convert verify` (`output`: an output folder against its manifest, and its source), and
the per-expert FlashInfer reference of `--against-flashinfer` (`flashinfer_reference`, which
needs FlashInfer and is imported only then)."""

from __future__ import annotations

from .output import Report, check_index, check_manifest, check_source, verify

__all__ = ["Report", "check_index", "check_manifest", "check_source", "verify"]
