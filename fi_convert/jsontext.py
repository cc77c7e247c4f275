"""JSON from files fi-convert does not write (config.json, an index, a manifest, a journal).

Python's json parser recurses once per nesting level: a file of 100,000 `[` ends in
RecursionError, which no `except ValueError` catches. `loads` makes it the JSONDecodeError
(a ValueError) that any other malformed JSON is.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deep", text, 0) from None
