"""Shared test setup: the repository root on sys.path, and Triton's CPU interpreter where there is no
GPU (it must be chosen before triton is first imported, so it is set here, before any test module).

The interpreter computes tl.fma(x, y, z) as x * y + z, rounded twice. The kernels' fast exact division
needs a fused multiply-add, so on the interpreter the kernels would take the IEEE division and the
GPU's path would go untested. Here the interpreter's fp32 FMA is made exact (fused_fma_f32) and the
kernels are told they may take the fast path there too: the CPU tests then run the GPU's arithmetic.
Tests marked `full` (exhaustive sweeps, checks of compiled code) run only with --full."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

# One thread per test process: the suite's tensors are small, and pytest-xdist runs a process per
# core, so more threads than cores only contend and slow every small op down. Subprocesses
# (torchrun, sweeps) inherit it. Set before torch is imported; an explicit setting is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fused_fma_f32(x, y, z):
    """RN(x * y + z) in fp32 for fp32 arrays, with one rounding. In fp64 the product is exact and the
    sum s is rounded once, with its error e exact (TwoSum); rounding s to fp32 is then right unless s
    lies exactly halfway between two floats while e != 0, where the true value is on e's side."""
    p = x.astype(np.float64) * y.astype(np.float64)
    z = z.astype(np.float64)
    s = p + z
    b = s - p
    e = (p - (s - b)) + (z - b)
    with np.errstate(over="ignore", invalid="ignore"):
        r = s.astype(np.float32)
        other = np.where(r.astype(np.float64) < s, np.nextafter(r, np.float32(np.inf)),
                         np.nextafter(r, np.float32(-np.inf)))
        tie = (2 * s == r.astype(np.float64) + other.astype(np.float64)) & (e != 0) & np.isfinite(s)
        up = np.maximum(r, other)
        down = np.minimum(r, other)
    return np.where(tie, np.where(e > 0, up, down), r).astype(np.float32)


if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from triton.runtime import interpreter as _interp

    _plain_fma = _interp.InterpreterBuilder.create_fma

    def _create_fma(self, x, y, z):
        if x.data.dtype == y.data.dtype == z.data.dtype == np.float32:
            return _interp.TensorHandle(fused_fma_f32(x.data, y.data, z.data), z.dtype.scalar)
        return _plain_fma(self, x, y, z)

    _interp.InterpreterBuilder.create_fma = _create_fma
    import kernels  # noqa: E402

    kernels.INTERPRET_FAST_DIV = True


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the tests marked full: exhaustive sweeps and checks of compiled code")


def pytest_collection_modifyitems(config, items):
    """Without --full, the tests marked full are deselected (the default suite stays in minutes)."""
    if config.getoption("--full"):
        return
    full = [item for item in items if item.get_closest_marker("full")]
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = [item for item in items if not item.get_closest_marker("full")]


ParameterSet = type(pytest.param())


def full_unless(default, cases):
    """`cases` for pytest.mark.parametrize, those not in `default` marked full: an exhaustive sweep
    keeps a few representative cases in the default suite and runs all of them with --full."""
    def values(case):
        return case.values if isinstance(case, ParameterSet) else case if isinstance(case, tuple) else (case,)

    def key(case):
        v = values(case)
        return v if len(v) > 1 else v[0]

    out = []
    for case in cases:
        if key(case) in default:
            out.append(case)
        else:
            marks = list(case.marks) if isinstance(case, ParameterSet) else []
            out.append(pytest.param(*values(case), marks=marks + [pytest.mark.full],
                                    id=case.id if isinstance(case, ParameterSet) else None))
    return out
