"""The launcher that relaunches compiled Triton kernels without Triton's per-launch binding: which calls reuse a
compiled kernel, which go back to ``kernel[grid]`` (and so to Triton's own specialization), and how the arguments
reach the compiled kernel. A fake kernel stands in for ``triton.jit`` functions (no GPU here); the GPU tests run
the real kernels through it (``test_gpu.py``)."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest
import torch

from rpr_mt.model.kernels.triton_launch import Launcher, direct_launch_supported


@dataclass
class Param:
    name: str
    is_constexpr: bool = False
    do_not_specialize: bool = False
    do_not_specialize_on_alignment: bool = False


class Compiled:
    """What ``kernel[grid](...)`` returns: a compiled kernel whose ``[grid](*args)`` launches it."""

    def __init__(self, log: list, variant: int):
        self.log, self.variant = log, variant

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("direct", self.variant, grid, args))


class Kernel:
    """A jit function X (pointer), n (int, specialized), seed (int, not specialized), p (float), BM (constexpr)."""

    params = [Param("X"), Param("n"), Param("seed", do_not_specialize=True), Param("p"), Param("BM", True)]

    def __init__(self):
        self.log: list = []
        self.variants = 0

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.variants += 1
            self.log.append(("jit", self.variants, grid, args, kwargs))
            return Compiled(self.log, self.variants)

        return run


def kinds(kernel: Kernel) -> list[str]:
    return [entry[0] for entry in kernel.log]


def test_a_repeated_call_launches_the_compiled_kernel_with_every_argument_by_position():
    kernel = Kernel()
    launcher = Launcher(kernel)
    x = torch.zeros(64)
    launcher[(4,)](x, 32, 5, 0.5, BM=64, num_warps=4)
    launcher[(8, 2)](x, 32, 5, 0.5, BM=64, num_warps=4)
    assert kinds(kernel) == ["jit", "direct"]
    assert kernel.log[1] == ("direct", 1, (8, 2, 1), (x, 32, 5, 0.5, 64))


@pytest.mark.parametrize(
    "changed, new_variant",
    [
        (dict(seed=6), False),  # not specialized
        (dict(n=48), False),  # still a multiple of 16
        (dict(n=33), True),  # no longer a multiple of 16
        (dict(n=1), True),  # Triton makes a 1 a constant
        (dict(p=0.25), False),  # floats are not specialized
        (dict(x=torch.zeros(64, dtype=torch.float64)), True),  # another dtype
        (dict(x=torch.zeros(65)[1:]), True),  # not 16-byte aligned
        (dict(BM=32), True),  # another constexpr
        (dict(num_warps=8), True),  # another launch option
    ],
)
def test_what_needs_another_compiled_variant(changed: dict, new_variant: bool):
    kernel = Kernel()
    launcher = Launcher(kernel)
    base = dict(x=torch.zeros(64), n=32, seed=5, p=0.5, BM=64, num_warps=4)
    call = {**base, **changed}
    launcher[(1,)](base["x"], base["n"], base["seed"], base["p"], BM=base["BM"], num_warps=base["num_warps"])
    launcher[(1,)](call["x"], call["n"], call["seed"], call["p"], BM=call["BM"], num_warps=call["num_warps"])
    assert kinds(kernel) == (["jit", "jit"] if new_variant else ["jit", "direct"])
    launcher[(1,)](call["x"], call["n"], call["seed"], call["p"], BM=call["BM"], num_warps=call["num_warps"])
    assert kinds(kernel)[-1] == "direct"  # and the new variant is kept too


def test_a_kernel_that_ignores_alignment_reuses_its_variant_for_a_misaligned_tensor():
    kernel = Kernel()
    kernel.params = [Param("X", do_not_specialize_on_alignment=True), *Kernel.params[1:]]
    launcher = Launcher(kernel)
    launcher[(1,)](torch.zeros(64), 32, 5, 0.5, BM=64)
    launcher[(1,)](torch.zeros(65)[1:], 32, 5, 0.5, BM=64)
    assert kinds(kernel) == ["jit", "direct"]


@pytest.mark.parametrize("n", [2**31, -(2**31) - 1])
def test_integers_beyond_int32_always_go_through_triton(n: int):
    kernel = Kernel()
    launcher = Launcher(kernel)
    for _ in range(2):
        launcher[(1,)](torch.zeros(4), n, 5, 0.5, BM=64)
    assert kinds(kernel) == ["jit", "jit"]


def test_calls_the_launcher_does_not_model_always_go_through_triton():
    kernel = Kernel()
    launcher = Launcher(kernel)
    for _ in range(2):  # a constexpr by position
        launcher[(1,)](torch.zeros(4), 32, 5, 0.5, 64)
    for _ in range(2):  # a bool where Triton has rules of its own
        launcher[(1,)](torch.zeros(4), True, 5, 0.5, BM=64)
    for _ in range(2):  # a missing constexpr (Triton's default or its error)
        launcher[(1,)](torch.zeros(4), 32, 5, 0.5)
    assert kinds(kernel) == ["jit"] * 6


def test_without_direct_launches_every_call_goes_through_triton():
    kernel = Kernel()
    launcher = Launcher(kernel, direct=False)
    for _ in range(3):
        launcher[(1,)](torch.zeros(4), 32, 5, 0.5, BM=64)
    assert kinds(kernel) == ["jit"] * 3


def test_a_kernel_with_constexprs_before_its_other_parameters_is_not_launched_directly():
    kernel = Kernel()
    kernel.params = [Param("BM", True), Param("X"), Param("n")]
    launcher = Launcher(kernel)
    assert not launcher.direct
    launcher[(1,)](torch.zeros(4), 32, BM=64)
    launcher[(1,)](torch.zeros(4), 32, BM=64)
    assert kinds(kernel) == ["jit", "jit"]


@pytest.mark.parametrize(
    "version, env, supported",
    [
        ("3.2.0", {}, False),  # launchers took only the non-constexpr arguments
        ("3.3.1", {}, True),
        ("3.6.0+git1234", {}, True),
        ("3.6.0", {"RPR_MT_TRITON_LAUNCH": "jit"}, False),
        ("3.6.0", {"TRITON_INTERPRET": "1"}, False),
    ],
)
def test_direct_launches_need_triton_3_3_outside_the_interpreter(monkeypatch, version, env, supported):
    monkeypatch.delenv("RPR_MT_TRITON_LAUNCH", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert direct_launch_supported(types.SimpleNamespace(__version__=version)) is supported
    assert direct_launch_supported(None) is False


class Refusing(Compiled):
    """A compiled kernel of a Triton that takes its launch arguments otherwise: the runner refuses them."""

    def __getitem__(self, grid):
        def run(*args):
            raise TypeError(f"function takes exactly 4 arguments ({len(args)} given)")

        return run


class RefusingKernel(Kernel):
    def __getitem__(self, grid):
        run = super().__getitem__(grid)

        def compile_and_run(*args, **kwargs):
            run(*args, **kwargs)
            return Refusing(self.log, self.variants)

        return compile_and_run


def test_a_triton_whose_compiled_kernels_refuse_the_arguments_falls_back_to_kernel_grid_for_good():
    """The direct calling convention is Triton 3.3-3.6's; a newer one that parses the arguments otherwise must not
    stop a training run at the second launch: that launch and every later one go through kernel[grid]."""
    kernel = RefusingKernel()
    launcher = Launcher(kernel)
    x = torch.zeros(64)
    with pytest.warns(RuntimeWarning, match="refused a direct launch"):
        for _ in range(2):
            launcher[(1,)](x, 32, 5, 0.5, BM=64)
    launcher[(1,)](x, 32, 5, 0.5, BM=64)
    assert kinds(kernel) == ["jit"] * 3 and not launcher.direct


def test_a_type_error_after_direct_launches_have_worked_is_the_calls_own():
    kernel = Kernel()
    launcher = Launcher(kernel)
    x = torch.zeros(64)
    for _ in range(2):
        launcher[(1,)](x, 32, 5, 0.5, BM=64)
    key = next(iter(launcher.compiled))
    launcher.compiled[key] = Refusing(kernel.log, 1)
    with pytest.raises(TypeError, match="exactly 4 arguments"):
        launcher[(1,)](x, 32, 5, 0.5, BM=64)
    assert launcher.direct and kinds(kernel) == ["jit", "direct"]
