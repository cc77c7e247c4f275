"""The Python code that runs while a model is asked where its tensors go (`plan_cache`): each
function's code object, with its module's file where the code was made at run time
(`dataclasses` writes a class's methods from its fields: their file is `<string>`).

On Python 3.12 and later through `sys.monitoring`: each function's start is reported once and
then switched off where it is (measured on vLLM's Qwen3-MoE class at 48 layers: no cost to the
asking that its spread shows). The code seen is kept for the process: a function seen by an
earlier asking is not reported again, so each asking is given every code object seen in any
(a superset of its own, which can only make an answer's files more, never fewer). Code that
other threads run meanwhile is in it too. Where no monitoring tool id is free, or before 3.12,
through `sys.settrace` on the asking's thread: each call of a Python function passes through a
callback (the asking about 2x as slow there), and a tracer set before (a coverage tool's, a
debugger's) goes on as it was."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_SEEN: dict[Any, str | None] = {}  # every code object reported, with its module's file
_LOCK = threading.Lock()  # (one monitoring at a time)


@contextmanager
def watching() -> Iterator[dict[Any, str | None]]:
    """The code objects that run inside (see above), each with its module's file (`__file__`
    of its globals, where its own file is not one: None where that has none either)."""
    mon: Any = getattr(sys, "monitoring", None)
    with _LOCK:
        tool = _free_tool(mon) if mon is not None else None
        if tool is None:
            seen: dict[Any, str | None] = {}
            with _traced(seen):
                yield seen
            return
        mon.register_callback(tool, mon.events.PY_START, _started)
        mon.set_events(tool, mon.events.PY_START)
        try:
            yield _SEEN
        finally:
            mon.set_events(tool, 0)
            mon.register_callback(tool, mon.events.PY_START, None)
            mon.free_tool_id(tool)


def _free_tool(mon: Any) -> int | None:
    for tool in (4, 3, 5):  # (0-2 are the debugger's, coverage's and profilers' by custom)
        if mon.get_tool(tool) is None:
            mon.use_tool_id(tool, "fi-convert")
            return tool
    return None


def _started(code: Any, offset: int) -> Any:
    if code not in _SEEN:
        module = None
        if code.co_filename.startswith("<"):  # (the started function's frame is the caller's)
            module = sys._getframe(1).f_globals.get("__file__")
        _SEEN[code] = module
    return sys.monitoring.DISABLE  # type: ignore[attr-defined]


@contextmanager
def _traced(seen: dict[Any, str | None]) -> Iterator[None]:
    before: Any = sys.gettrace()

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code not in seen:
            seen[frame.f_code] = frame.f_globals.get("__file__")
        return before(frame, event, arg) if before is not None else None

    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(before)
