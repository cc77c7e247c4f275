"""Stand-ins for the three modules SGLang 0.5.23 imports that cannot live in a CPU venv, for
SGLang's own MoE layers run on CPU (`moe_layer.py`: the load-time proof, which runs in a
process of its own, and the tests); the plugin never imports this.

- `triton`: imported at the top of `sglang/srt/utils/common.py` and by many kernels' modules;
  the real package is 1 GB and has no CPU backend. No Triton kernel runs in these tests:
  only weight loading and post-load processing, which are plain PyTorch.
- `IPython`: imported by `sglang/utils.py` (notebook helpers).
- `torchvision`: reached through SGLang's multimodal configs; PyPI's build fails to import
  beside this torch (`torchvision::nms`).

- `vllm`, only where it is not installed (`make test-server SERVER=sglang`'s venv): on a
  platform that is neither CUDA nor CPU (this machine, to SGLang) a whole model's rotary
  embedding takes `vllm._custom_ops.rotary_embedding` as its fallback kernel; loading stores
  it and never calls it. Where vLLM is installed, SGLang gets the real one.
- `uvicorn`, only where it is not installed (the CPU venv the tests run in): SGLang's HTTP
  server, imported at the top of `sglang/srt/distributed/gated_launch.py`, which SGLang's
  hybrid linear-attention backend reaches through its model runner's distributed bootstrap
  (Granite 4.0 hybrid's and Nemotron-H's modules import it). Only the import: no server is
  started while weights load (0.51: the least SGLang 0.5.23 requires).

Only imports made by SGLang's modules get a stand-in (torch probes for Triton as well, and
must keep finding none). A stand-in is a permissive module: any attribute is another
permissive object, which can be called, used as a decorator, subscripted, compared and
iterated (empty). One attribute answers as real Triton's does on a machine without a GPU:
`triton.runtime.driver.active` raises (Triton's DriverConfig.active finds no active driver:
"0 active drivers ([]). There should only be one."), so that SGLang's code that asks Triton for
the device takes its own CPU fallback (kernels/ops/attention/fla/utils.py, imported by
Qwen3.5's and Nemotron-H's modules, answers "cpu"). The hook is live only
inside `installed()`; on leaving it the stand-ins leave `sys.modules` again, so that code that
probes for Triton afterwards (vLLM's tests in the same pytest process) sees none, while the
SGLang modules imported inside keep the references they took.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator

STUBBED: tuple[str, ...] = ("triton", "IPython", "torchvision")
VERSIONS = {
    "triton": "3.5.0",
    "IPython": "9.0.0",
    "torchvision": "0.28.0",
    "vllm": "0.33.0",
    "uvicorn": "0.51.0",
}
STUBBED += tuple(name for name in ("vllm", "uvicorn") if importlib.util.find_spec(name) is None)


# real Triton's answer, without a GPU, to `triton.runtime.driver.active` (its DriverConfig
# creates the driver on first use and finds none active)
NO_DRIVER = "0 active drivers ([]). There should only be one."


def _attribute(owner: str, attr: str) -> _Anything:
    if attr.startswith("__") and attr.endswith("__"):
        raise AttributeError(attr)
    if (owner, attr) == ("triton.runtime.driver", "active"):
        raise RuntimeError(NO_DRIVER)
    return _Anything(f"{owner}.{attr}")


class _Anything:
    """An object that stands for any attribute, call or decorator of a stubbed module."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Anything:
        return _attribute(self._name, attr)

    def __call__(self, *args, **kwargs):
        # used as a bare decorator (`@triton.jit`): hand the function back
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Anything(f"{self._name}()")

    def __getitem__(self, key) -> _Anything:
        return _Anything(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str):
        return _attribute(self.__name__, attr)


def _importer() -> str:
    """The module whose code runs the import being resolved (the first frame outside
    importlib's machinery)."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")):
            return name
        frame = frame.f_back
    return ""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in STUBBED:
            return None
        # only SGLang's own imports get a stand-in: torch probes for Triton too, and must
        # keep finding none; a submodule of a stand-in is one too, whoever imports it
        # (SGLang 0.5.20's configs import transformers' AutoProcessor after SGLang took the
        # torchvision stand-in, and transformers then imports torchvision.transforms)
        top = sys.modules.get(fullname.split(".")[0])
        if not (_importer().startswith(("sglang", *STUBBED)) or isinstance(top, _StubModule)):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = VERSIONS[spec.name.split(".")[0]]
        return module

    def exec_module(self, module) -> None:
        pass


_FINDER = _Finder()


def _is_stub(name: str) -> bool:
    return name.split(".")[0] in STUBBED


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Imports of triton, IPython and torchvision get stand-ins inside; re-entrant."""
    if _FINDER in sys.meta_path:
        yield
        return
    # torch probes for Triton on first import of these (and caches the answer): they must
    # find none, before a stand-in lies in sys.modules
    import functorch.compile  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch._dynamo.testing  # noqa: F401
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.runtime.triton_compat  # noqa: F401
    import torch._inductor.utils  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    kept = {n: m for n, m in sys.modules.items() if _is_stub(n)}
    for name in kept:
        del sys.modules[name]
    sys.meta_path.insert(0, _FINDER)
    try:
        yield
    finally:
        sys.meta_path.remove(_FINDER)
        for name in [n for n in sys.modules if _is_stub(n)]:
            del sys.modules[name]
        sys.modules.update(kept)
