"""The names and defaults the command line needs before any work: importing these does not
import torch, so `fi-convert --help` and a mistyped option answer at once."""

from __future__ import annotations

import enum


class SchemeName(str, enum.Enum):
    AUTO = "auto"
    BF16 = "bf16"
    FP8_TENSOR = "fp8-tensor"
    FP8_BLOCK = "fp8-block"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"


class Backend(str, enum.Enum):
    TRTLLM = "trtllm"
    CUTLASS = "cutlass"


DEFAULT_SHARD_BYTES = 0  # output shards as large as the source's largest shard
DEFAULT_MAX_MEMORY = 4 * 2**30
