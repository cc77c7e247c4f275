"""The process around a command: signals (the first Ctrl-C or SIGTERM stops the run), blocking
network calls on a thread of their own (so that Ctrl-C stops at once), and a quick exit."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """SIGTERM (docker stop, a cancelled CI job): stopped and cleaned up as Ctrl-C is."""


def _in_background(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, run on a daemon thread while this one waits, so that Ctrl-C
    stops at once: huggingface_hub's transfer threads would otherwise hold the interrupted
    main thread, and the exit, until their transfers end (minutes, or never on a stuck link).
    What such work leaves behind is whole or nothing on the Hub and resumable locally."""
    got: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            got["result"] = fn(*args, **kwargs)
        except BaseException as e:
            got["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="fi-convert-hub", daemon=True).start()
    while not done.wait(0.25):
        pass
    if "error" in got:
        raise got["error"]
    return got["result"]


_stopping = False


def _on_signal(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM stops the run; later ones are ignored, so that the cleanup
    they would cut short (temporary files, the lock) finishes and no traceback is shown."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def take_signals() -> None:
    """SIGTERM, and Ctrl-C unless it is ignored, go to `_on_signal`."""
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when ignored
        signal.signal(signal.SIGINT, _on_signal)


def exit_now_if_done(code: object, own_process: bool) -> None:
    """Leave at once after a command when the interpreter's teardown would only cost time:
    after a stop with threads still sending, or (`own_process`) once torch is loaded."""
    if code in (130, 143) and threading.active_count() > 1:
        # stopped, cleaned up and said so: threads still sending (huggingface_hub's, an
        # upload under way) would hold the exit until their transfer ends, minutes later
        # (the interpreter joins every thread pool's threads at exit, daemon or not)
        _leave_now(code, finish=False)
    if own_process and "torch" in sys.modules:
        # the process's own run (the console script, `python -m fi_convert`): all is
        # written, synced and said; the interpreter's teardown with torch loaded would
        # take another 0.9 s of a 2-core machine
        _leave_now(code)


def _leave_now(code: object, finish: bool = True) -> NoReturn:
    """Exit at once with `code` (as `SystemExit` would), with stdout and stderr flushed and
    (`finish`) the atexit handlers run, but without the interpreter's teardown."""
    if isinstance(code, str):  # SystemExit("message"): printed, exit status 1
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    if finish:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (`| head`)
            stream.flush()
    os._exit(status)
