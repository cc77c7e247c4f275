"""fi-convert's release (pyproject.toml's `version`), a leaf any module may import."""

__version__ = "0.1.0"
