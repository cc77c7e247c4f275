"""The output format: what a server or a person needs to read an fi-convert output, and
nothing of the converter (tests/test_layers.py keeps it so).

- `names`: the files of an output folder and the format's version;
- `manifest`: read a manifest and check its form, and the files it lists;
- `reader`: one rank's kernel-ready MoE tensors, read straight into a caller's buffers;
- `hashes`: SHA-256 of a file from the page cache.

docs/FORMAT.md documents the format for server authors.
"""
