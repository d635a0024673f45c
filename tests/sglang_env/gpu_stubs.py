"""Stand-ins for GPU-only modules that SGLang's ``server_args`` imports, so its parser runs on a CPU
machine.

Installed by ``.ci/run`` into the SGLang test environment through a ``.pth`` line (``import
gpu_stubs``). Only the modules named in :data:`STUBBED` are replaced, and only when they are not
installed: every attribute of a stub is a :class:`Stub` that can be called, subclassed, indexed,
iterated (empty) and used as a decorator, which is all that importing SGLang's argument code asks of
them. Nothing here runs a kernel.

With a stand-in ``triton`` torch would believe Triton is installed and fail inside Inductor when
SGLang module-level ``@torch.compile`` decorators are applied, so ``torch.compile`` returns the
function unchanged here: nothing is compiled or run, only parsed and resolved.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STUBBED = (
    "triton",
    "IPython",
    "torchvision",
    "tvm_ffi",
    "sentencepiece",
    "compressed_tensors",
    "gguf",
)


def _no_gpu_target():
    """``triton.runtime.driver.active.get_current_target()`` on a machine without a GPU: Triton
    raises."""
    raise RuntimeError("0 active drivers (gpu_stubs: no GPU here)")


class Stub(type):
    """A class that stands for anything: attributes, calls, subscripts and decorators give more
    stubs."""

    def __getattr__(cls, name: str) -> Stub:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        # SGLang then picks its CPU path (fla/utils.py get_available_device)
        if name == "get_current_target":
            return _no_gpu_target
        return Stub(name, (), {})

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: keep the function
        return Stub("call", (), {})

    def __getitem__(cls, key) -> Stub:
        return Stub("item", (), {})

    def __iter__(cls):
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __or__(cls, other):
        return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub(name, (), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in STUBBED:
            return None
        if "." not in fullname and any(
            f.find_spec(fullname, path)
            for f in sys.meta_path
            if f is not self and hasattr(f, "find_spec")
        ):
            return None  # really installed: use it
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module) -> None:
        return None


def _no_compile(model=None, **kwargs):
    """``torch.compile`` for a machine with no compiler: the function itself (also as
    ``@torch.compile(...)``)."""
    return model if model is not None else (lambda fn: fn)


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
    import torch

    torch.compile = _no_compile
