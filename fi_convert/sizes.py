"""Byte sizes written by people: `4GiB`, `500MB`, `1.5T`, `1073741824`."""

from __future__ import annotations

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_UNITS |= {f"{u}B": 1000**k for k, u in enumerate("KMGT", 1)}
_UNITS |= {f"{u}IB": 1024**k for k, u in enumerate("KMGT", 1)}

SIZE_HELP = "give bytes, or a number with a unit (e.g. 4GiB, 500MB, 5GB, 1.5T)"


def parse_size(text: str | int) -> int:
    """Bytes from `text`: a count of bytes, or a number with a unit (KB, MB, GB, TB are
    powers of 1000, as in Hugging Face's `max_shard_size`; KiB, MiB, GiB, TiB and K, M, G, T
    are powers of 1024). Raises ValueError("not a size: ...") for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):  # a default
        return text
    t = str(text).strip().replace(" ", "").replace("_", "")
    num = t.rstrip("bBkKmMgGtTiI")
    unit = t[len(num) :].upper()
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not 0 <= value < 2**63:
        raise ValueError(f"not a size: {SIZE_HELP}")
    return int(value * _UNITS[unit])
