"""torch.cuda's Stream and Event as inert objects, for the model classes (vLLM's and SGLang's
Kimi K3) that make CUDA streams or events when built, none of which is used while weights
load, on this GPU-less machine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch


class _Inert:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


@contextlib.contextmanager
def inert_cuda_streams() -> Iterator[None]:
    with (
        mock.patch.object(torch.cuda, "Stream", _Inert),
        mock.patch.object(torch.cuda, "Event", _Inert),
    ):
        yield
