"""The Python code that runs while a model is asked where its tensors go (`plan_cache`): each
function's code object, with its module's file where the code was made at run time
(`dataclasses` writes a class's methods from its fields: their file is `<string>`).

On Python 3.12 and later, through `sys.monitoring`: each function's start is reported once and
then switched off where it is (`DISABLE`), so the asking runs at about its own speed; only the
watched thread's code is kept (another thread's is reported again until the watched one runs
it). Each watching first switches back on what earlier ones switched off (`restart_events`, for
every tool: one report more per function for a tool that had switched it off), so that it is
given its own asking's code, each function once. Proven on the GPU machine's 3.12 with torch
and vLLM (docs/speed.md, the fifteenth session). Its first version, which gave each asking
every code object any earlier one had seen, kept nothing there.

Before 3.12, where no monitoring tool id is free, or with `MONITORING` off: through
`sys.settrace` on the asking's thread. Each call of a Python function passes through a callback
(the asking about 2x as slow, at a first start only), and a tracer set before (a coverage
tool's, a debugger's) goes on as it was."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# sys.monitoring's path where Python has it (see above); off: the tracer (3.11 and 3.12 alike)
MONITORING = True
_LOCK = threading.Lock()  # (one monitoring at a time)


@contextmanager
def watching() -> Iterator[dict[Any, str | None]]:
    """The code objects that run inside (see above), each with its module's file (`__file__`
    of its globals, where its own file is not one: None where that has none either)."""
    mon: Any = getattr(sys, "monitoring", None) if MONITORING else None
    seen: dict[Any, str | None] = {}
    with _LOCK:
        tool = _free_tool(mon) if mon is not None else None
        if tool is None:
            with _traced(seen):
                yield seen
            return
        asking, disable = threading.get_ident(), mon.DISABLE

        def started(code: Any, offset: int) -> Any:
            if threading.get_ident() != asking:
                return None  # (another thread's: reported again, where the asking runs it)
            if code not in seen:
                module = None
                if code.co_filename.startswith("<"):  # (this frame's caller is the code's)
                    module = sys._getframe(1).f_globals.get("__file__")
                seen[code] = module
            return disable

        mon.register_callback(tool, mon.events.PY_START, started)
        mon.set_events(tool, mon.events.PY_START)
        mon.restart_events()  # (what an earlier watching switched off, on again)
        try:
            yield seen
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


class NotInFiles(Exception):
    """Code seen that is in no file that can be checked (named in the message)."""


def files(seen: dict[Any, str | None]) -> list[list]:
    """The files of the code `seen` (each with its module's file), each with its size and
    modification time. Code of the interpreter's own frozen modules is left out (its version
    is keyed), and so is code made at run time from text in no module of a file (the methods
    `collections.namedtuple` writes): what made it is code that ran, or the interpreter.
    NotInFiles names code whose file is not there (a module loaded without its source)."""
    names = set()
    for c, module in seen.items():
        name = c.co_filename
        if name.startswith("<frozen "):
            continue
        if name.startswith("<"):
            if not isinstance(module, str):
                continue
            name = module
        names.add(name)
    out = []
    for name in sorted(names):
        try:
            st = os.stat(name)
        except (OSError, ValueError):
            where = next((c for c in seen if c.co_filename == name), None)
            raise NotInFiles(f"{name}: {getattr(where, 'co_qualname', '?')}") from None
        out.append([name, st.st_mtime_ns, st.st_size])
    return out


def unchanged(files: list) -> bool:
    """Whether each of `files` (as `files` gave them) has the size and time it had."""
    for name, mtime, size in files:
        try:
            st = os.stat(name)
        except OSError:
            return False
        if st.st_mtime_ns != mtime or st.st_size != size:
            return False
    return True
