"""The server an output is for, looked up by name: the one place where the core reaches
`fi_convert.servers` (the registry of the servers' facts), when it is asked and never at import
(tests/test_layers.py). A server's facts import no server; its plugin is never looked up here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from .format.names import server_of
from .target import DEFAULT, ServerTarget


def resolve(name: str = DEFAULT) -> ServerTarget:
    """The registered server target called `name` (`fi_convert.servers.get`)."""
    servers = importlib.import_module("fi_convert.servers")
    target: ServerTarget = servers.get(name)
    return target


def names() -> list[str]:
    """Every registered server's name, the default first."""
    servers = importlib.import_module("fi_convert.servers")
    return list(servers.TARGETS)


def of_manifest(manifest: Mapping) -> ServerTarget:
    """The server an output is for: its manifest's `server` (a manifest without it: vLLM's).
    A name this fi-convert does not know is a FiConvertError that names the known ones."""
    return resolve(server_of(dict(manifest)))
