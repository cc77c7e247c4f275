"""The one way a command speaks: results (and `--json`) on stdout; warnings, hints, errors and
progress on stderr. `quiet` (--quiet) leaves only errors and the result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


class Output:
    """A command's output in one of three modes: human, `as_json`, `quiet`."""

    def __init__(self, *, as_json: bool = False, quiet: bool = False) -> None:
        self.as_json, self.quiet = as_json, quiet

    def result(self, text: str) -> None:
        """A line of the result (rich markup; values are escaped by the caller)."""
        out.print(text)

    def json(self, data: dict) -> None:
        out.print_json(json.dumps(data))

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        t = Table(box=None, pad_edge=False)
        for col in columns:
            t.add_column(col)
        for row in rows:
            t.add_row(*row)
        out.print(t)

    def warning(self, text: str) -> None:
        if not self.quiet:
            err.print(f"[yellow]warning:[/yellow] {escape(text)}")

    def warnings(self, notes: Iterable[str]) -> None:
        """Each once (the library says per-layer ones once, with the number of layers)."""
        for note in dict.fromkeys(notes):
            self.warning(note)

    def hint(self, text: str) -> None:
        """A line about the run on stderr (rich markup)."""
        err.print(text)

    def problem(self, label: str, text: str) -> None:
        """A red `label:` line on stderr (`mismatch`, `error`, `interrupted`)."""
        err.print(f"[red]{label}:[/red] {text}")
