"""Exception types. The library raises these; the CLI maps each to one line on stderr and exit 1.

Every message names the file or tensor at fault and says what to do about it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class FiConvertError(Exception):
    """Base class: a problem the user can fix, described in one line."""


class SourceError(FiConvertError):
    """The source checkpoint is missing, unreadable or malformed."""


class SchemeMismatchError(FiConvertError):
    """The requested scheme does not fit the checkpoint."""


class LayoutError(FiConvertError):
    """A shape cannot be laid out for the kernel (no padding rule applies)."""


class OutputError(FiConvertError):
    """The output folder cannot be written, or is not a finished conversion."""


class ManifestError(FiConvertError):
    """A manifest is missing, from another format version, or disagrees with the request."""


class HubError(FiConvertError):
    """A Hugging Face Hub download or upload failed or was refused; names the repo and the fix."""


@contextlib.contextmanager
def raised_as(error: Callable[[str], BaseException]) -> Iterator[None]:
    """A FiConvertError raised inside comes out as `error` of its one line, chain dropped (a
    server plugin's own error type, which the server shows as it shows its own)."""
    try:
        yield
    except FiConvertError as e:
        raise error(f"{e}") from None
