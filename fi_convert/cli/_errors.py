"""The one mapping of what a command's library call raises: a `FiConvertError` is one red
line on stderr and exit code 1 (`--debug`, or FI_CONVERT_DEBUG=1, shows the traceback first);
a Ctrl-C is one line saying what the run left, exit code 130, a SIGTERM the same with 143.
(Usage errors, exit code 2, are `_usage`'s.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from rich.markup import escape

from ..errors import FiConvertError
from ._output import Output, err
from ._process import Terminated


@contextmanager
def handled(debug: bool, stopped: str | Callable[[], str] | None = None) -> Iterator[None]:
    """Errors of the block as above; `stopped`: what a stop leaves (escaped rich markup), or
    a function that says it at the time (None: a stop is not this command's to say)."""
    try:
        yield
    except FiConvertError as e:
        if debug:
            err.print_exception()
        Output().problem("error", escape(str(e)))
        raise typer.Exit(1) from None
    except KeyboardInterrupt as e:
        if stopped is None:
            raise
        state = stopped if isinstance(stopped, str) else stopped()
        term = isinstance(e, Terminated)
        Output().problem("terminated" if term else "interrupted", state)
        raise typer.Exit(143 if term else 130) from None
