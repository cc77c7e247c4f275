"""An output's other tensors (attention, embeddings, dense MLPs, shared experts, norms): every
tensor that is not a converted MoE tensor, for a server's own weight loading.

They are read as a server's default loader reads them (safetensors, shard by shard, in the
loading thread). Measured on the H200 (docs/speed.md): reading them ahead in batches by
parallel threads into fresh host tensors was slower beside the experts' bulk read (a whole
small model 862 ms against 621 ms), so the simple path stays.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from safetensors import SafetensorError, safe_open

from ..bulk_read import ReadError
from .reader import OutputReader


class OtherTensors:
    """Iterate (name, host tensor) over the output's other tensors; `nbytes` counts the bytes
    delivered so far."""

    def __init__(self, reader: OutputReader) -> None:
        self.nbytes = 0
        self._reader = reader

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        reader = self._reader
        for shard in reader.shards():
            path = reader.root / shard
            try:
                with safe_open(path, framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        if not reader.is_expert_tensor(name):
                            t = f.get_tensor(name)
                            self.nbytes += t.numel() * t.element_size()
                            yield name, t
            except (SafetensorError, OSError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ReadError(
                    f"{path}: cannot be read ({first}): truncated or corrupt; restore the file "
                    "(convert or download it again), then load again"
                ) from None
