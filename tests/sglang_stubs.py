"""The stand-ins for triton, IPython and torchvision that SGLang's MoE code runs with on CPU:
library code (`fi_convert.servers.sglang.stand_ins`); the tests' name for it."""

from fi_convert.servers.sglang.stand_ins import STUBBED, VERSIONS, installed  # noqa: F401
