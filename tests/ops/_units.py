"""Test helpers for static units on CPU: compile a module as path 4 (mark_static, sunk lengths),
list the torchair operators one call runs, compare a unit's error with eager's."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchair


def compile_static(module, tensors, run_eagerly):
    """``torch.compile(module)`` through torchair as path 4: every tensor in ``tensors``
    mark_static, ``tiling_schedule_optimize`` on (host lengths sunk into the unit's buffer); the
    FX engine when ``run_eagerly``, else Inductor."""
    torch._dynamo.reset()
    for t in tensors:
        if t is not None:
            torch._dynamo.mark_static(t)
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    config.experimental_config.tiling_schedule_optimize = True
    return torch.compile(module, backend=torchair.get_npu_backend(compiler_config=config),
                         dynamic=True, fullgraph=True)


def op_calls(fn, *args):
    """The ``npu::`` and ``torchair_native::`` operators one call ``fn(*args)`` runs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return {e.name for e in prof.events() if e.name.startswith(("npu::", "torchair_native::"))}


def same_error(eager, compiled, *args) -> str:
    """Both ``eager(*args)`` and ``compiled(*args)`` raise ValueError, with the same text
    (returned)."""
    with pytest.raises(ValueError) as want:
        eager(*args)
    with pytest.raises(ValueError) as got:
        compiled(*args)
    assert str(got.value) == str(want.value)
    return str(got.value)
