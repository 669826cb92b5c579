"""Launching a Triton kernel again without Triton's per-launch binding: ``Launcher(kernel)[grid](*args, **kwargs)``
does what ``kernel[grid](*args, **kwargs)`` does, in about a third of the host time.

``JITFunction.run`` binds every argument, specializes each (in C++), builds a cache key string, checks the kernel's
globals and only then launches: for the attention kernels, which take ~50 arguments, that is several times the host
time of the compiled kernel's own runner (``CompiledKernel[grid](*args)``; ``benchmarks/bench_triton_launch.py``,
figures in docs/benchmarks.md, "GPU", "Host time per call"). With small batches a GPU waits for that time: four
launches per attention call, 24 per update of a base model.

The launcher keeps the compiled kernel of each specialization it has met under a key that holds everything Triton's
own key would distinguish: the device, each argument's type, each tensor's dtype and, unless the parameter opts out,
its 16-byte alignment; each integer's "== 1" and "divisible by 16" (Triton's specializations, unless
``do_not_specialize``) and that it fits int32; the constexprs and launch options. The first call of a key goes
through ``kernel[grid]`` (which compiles, or finds the variant in Triton's cache) and keeps what it returns; later
calls launch it directly. The calling convention is Triton >= 3.3's (constexprs among the launch arguments); an
older Triton, the interpreter, an integer beyond int32 or a call shape other than "non-constexpr arguments by
position, constexprs and options by name" all take ``kernel[grid]`` every time, and so does every launch after a
compiled kernel refused its first direct launch with a TypeError (a newer Triton whose compiled kernels take their
arguments otherwise: that launch goes through ``kernel[grid]`` too, with a warning, instead of stopping a training
run).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Launcher", "direct_launch_supported", "version_tuple"]

_INT32 = (-(2**31), 2**31 - 1)


def direct_launch_supported(triton_module: Any) -> bool:
    """Whether this Triton's compiled kernels take the launch arguments as ``Launcher`` passes them (3.3 and newer,
    outside the interpreter), and ``RPR_MT_TRITON_LAUNCH`` is not "jit" (which keeps every launch on
    ``kernel[grid]``)."""
    if triton_module is None or os.environ.get("RPR_MT_TRITON_LAUNCH") == "jit":
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return version_tuple(triton_module.__version__) >= (3, 3)


def version_tuple(text: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as "3.6.0" or "3.2.0+git1234"."""
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class Launcher:
    """``kernel[grid](...)`` with the compiled kernel looked up by a key computed here (see the module docstring).

    ``kernel`` is a ``triton.jit`` function whose constexpr parameters all come after its other parameters (the
    calls pass those by position and the constexprs by name); ``direct`` False (or an unsupported Triton) makes
    every launch a plain ``kernel[grid]`` call."""

    def __init__(self, kernel: Any, direct: bool = True):
        self.kernel = kernel
        params = getattr(kernel, "params", None)
        self.names: list[str] = [] if params is None else [p.name for p in params]
        plain = [i for i, p in enumerate(params or []) if not p.is_constexpr]
        # direct launches need the plain parameters first (positional) and the constexprs after (by name)
        self.direct = bool(direct and params and plain == list(range(len(plain))))
        self.positional = len(plain)
        self.constexprs = self.names[self.positional:]
        self.unspecialized = frozenset(i for i in plain if params[i].do_not_specialize)
        self.unaligned = frozenset(i for i in plain if params[i].do_not_specialize_on_alignment)
        self.compiled: dict[tuple, Any] = {}
        self.proven = False  # a direct launch has gone through: this Triton takes the arguments as passed
        self.cuda = torch.cuda.is_available()  # fixed for the process: not asked again on every launch

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return functools.partial(self.launch, grid)

    def key(self, args: tuple, kwargs: dict) -> tuple | None:
        """What tells apart the compiled variants Triton would choose for this call; None when this call must go
        through ``kernel[grid]`` (a call shape the launcher does not handle, or an integer beyond int32)."""
        if len(args) != self.positional:
            return None
        facts: list = [torch.cuda.current_device() if self.cuda else None]
        for index, arg in enumerate(args):
            kind = type(arg)
            if kind is int:
                if not _INT32[0] <= arg <= _INT32[1]:
                    return None
                facts.append(0 if index in self.unspecialized else (1 if arg == 1 else 2 + (arg % 16 == 0)))
            elif kind is float:
                facts.append(-1)
            elif isinstance(arg, torch.Tensor):
                aligned = index in self.unaligned or arg.data_ptr() % 16 == 0
                facts.append((arg.dtype, aligned))
            else:  # bool, None, a Triton dtype...: Triton's rules for these are not mirrored here
                return None
        facts.append(tuple(kwargs.items()))
        return tuple(facts)

    def launch(self, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
        key = self.key(args, kwargs) if self.direct else None
        compiled = None if key is None else self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if key is not None and compiled is not None and all(name in kwargs for name in self.constexprs):
                self.compiled[key] = compiled
            return
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        try:
            compiled[grid3](*args, *(kwargs[name] for name in self.constexprs))
        except TypeError as error:  # raised while the arguments are parsed, before anything is launched
            if self.proven:  # the calling convention works: the error is this call's own
                raise
            self.direct = False
            self.compiled.clear()
            warnings.warn(f"this Triton's compiled kernels refused a direct launch ({error}); launching every call "
                          "through kernel[grid]", RuntimeWarning, stacklevel=2)
            self.kernel[grid](*args, **kwargs)
            return
        self.proven = True
