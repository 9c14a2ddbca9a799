"""The per-call path of a CPU static unit: the sunk-scalar program compiled once, the sunk
buffer written through its memory, and (Inductor engine) one function from the unit's
arguments to Inductor's generated entry, with the deferred-error check, the version bumps and
the profiler label kept."""
from __future__ import annotations

import operator
import threading
import time

import pytest
import torch
import torch._dynamo

import torchair
from torchair.plan.sink import HostScalarProgram, StepRef
from torchair.runtime import unit_call, units
from torchair.runtime.input_layout import InputLayoutError
from torchair.runtime.staging import SunkScalars

# ------------------------------------------------------------------------ compiled programs

PROGRAMS = {
    # slots straight from the inputs (the decode step's lengths): one list comprehension
    "inputs": (HostScalarProgram(input_indices=(3, 1), steps=(), slots=(StepRef(1), StepRef(0))),
               lambda a: [a[1], a[3]]),
    "arith": (HostScalarProgram(
        input_indices=(0, 2),
        steps=((operator.add, (StepRef(0), 1), {}), (operator.mul, (StepRef(1), StepRef(2)), {}),
               (operator.sub, (StepRef(3), 3), {})),
        slots=(StepRef(2), StepRef(4), 7, StepRef(0))),
        lambda a: [a[0] + 1, a[2] * (a[0] + 1) - 3, 7, a[0]]),
    # a step reading a reference inside a nested argument, and keyword arguments
    "nested": (HostScalarProgram(
        input_indices=(0, 1),
        steps=((lambda pair, scale=1: (pair[0] - pair[1]) * scale,
                ((StepRef(0), StepRef(1)),), {"scale": StepRef(1)}),
               (max, (StepRef(2), 0), {})),
        slots=(StepRef(3), -2)),
        lambda a: [max((a[0] - a[1]) * a[1], 0), -2]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiled_program_equals_the_interpreter_and_the_formula(name):
    program, formula = PROGRAMS[name]
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        args = [int(v) for v in torch.randint(-50, 50, (4,), generator=gen)]
        got = program(args)
        assert got == program.reference(args) == formula(args), (name, args)
        assert all(type(v) is int for v in got)


def test_compiled_program_is_built_once_and_not_part_of_equality():
    program, _ = PROGRAMS["arith"]
    program([1, 2, 3])
    run = program._run
    program([4, 5, 6])
    assert program._run is run
    twin = HostScalarProgram(program.input_indices, program.steps, program.slots)
    assert twin == program and "_run" not in repr(program)


def test_sunk_buffer_is_written_in_place_and_refuses_what_int64_cannot_hold():
    program, _ = PROGRAMS["inputs"]
    sunk = SunkScalars(program, torch.device("cpu"))
    ptr = sunk.buffer.data_ptr()
    assert sunk.stage([None, 5, None, -9]).tolist() == [5, -9]
    assert sunk.stage([None, 2**62, None, 0]).tolist() == [2**62, 0]
    assert sunk.buffer.data_ptr() == ptr
    with pytest.raises(OverflowError):
        sunk.stage([None, 2**63, None, 0])


def test_a_program_that_only_copies_arguments_says_which():
    assert PROGRAMS["inputs"][0].copied_inputs() == (1, 3)
    assert PROGRAMS["arith"][0].copied_inputs() is None  # steps and a constant slot
    assert HostScalarProgram((0, 2), (), (StepRef(1), 4)).copied_inputs() is None  # a constant
    assert HostScalarProgram((5,), (), (StepRef(0), StepRef(0))).copied_inputs() == (5, 5)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("values", [(5, -9), (True, 0), (7.0, 2), (torch.tensor(3), 1),
                                    (torch.tensor(6.0), 4)],
                         ids=["ints", "bool", "float", "int-tensor", "float-tensor"])
def test_the_packed_buffer_holds_what_the_program_computes(name, values):
    """The copy-only program's buffer is packed in one call; a value that is not an int (a float,
    a float tensor) goes the general way, converted as the program converts it, and every
    program's buffer holds the program's values."""
    program, _ = PROGRAMS[name]
    sunk = SunkScalars(program, torch.device("cpu"))
    assert (sunk._pack is not None) == (name == "inputs")
    args = [values[0], values[1], values[1], values[0]]  # the copy-only program: [a1, a3]
    if name == "nested" and isinstance(args[0], torch.Tensor):
        args = [int(a) for a in args]  # its step subtracts pairs: numbers only
    assert sunk.stage(args).tolist() == program(args)


def test_the_packed_buffer_refuses_what_int64_cannot_hold_and_is_then_rewritten():
    program = HostScalarProgram((0, 1), (), (StepRef(0), StepRef(1)))
    sunk = SunkScalars(program, torch.device("cpu"))
    assert sunk._pack is not None
    assert sunk.stage([2**63 - 1, -(2**63)]).tolist() == [2**63 - 1, -(2**63)]
    for bad in ([2**63, 0], [0, -(2**63) - 1]):
        with pytest.raises(OverflowError):
            sunk.stage(bad)
    assert sunk.stage([-3, 4]).tolist() == [-3, 4]
    one = SunkScalars(HostScalarProgram((2,), (), (StepRef(0),)), torch.device("cpu"))
    assert one.stage([None, None, 41]).tolist() == [41]


def test_checks_on_the_values_keep_the_general_path():
    program, _ = PROGRAMS["inputs"]
    sunk = SunkScalars(program, torch.device("cpu"))
    seen = []
    sunk.checks = [seen.append]
    assert sunk.stage([None, 5, None, 6]).tolist() == [5, 6] and seen == [[5, 6]]


# ------------------------------------------------------------------------ fused unit call

IFA = torch.ops.npu.npu_incre_flash_attention


class _Decode(torch.nn.Module):
    def forward(self, q, k, v, cache, pos, lens):
        cache.index_copy_(0, pos, q[0, 0, :1])
        out = IFA(q, k, v, actual_seq_lengths=lens, num_heads=8, num_key_value_heads=2,
                  input_layout="BNSD", scale_value=0.125)
        return out * 2 + cache.sum()


def _other_thread_error(q, k, v, started, release, taken):
    """Leaves a deferred error in this thread until ``release``, then takes it."""
    from torchair.ops.attention.cpu import launch_fakes as _fakes, launch_library as _launch

    _fakes.ifa_decode()(q, k, v, torch.tensor([1, -7, 2]), None, None, 8, 2,
                        _launch.LAYOUTS["BNSD"], 0, 0.125, True)
    started.set()
    release.wait(30)
    taken.append(_launch.take())


@pytest.mark.inductor
def test_inductor_unit_fused_call(monkeypatch):
    """One Inductor build (the conftest resets Dynamo between tests): the fused call is
    installed after the first run and then serves every call: results and in-place writes as
    eager, another cache tensor, eager's ValueError and a right next step, another thread's
    deferred error left alone, version bumps when the unit is called by itself, and the
    compiled graph's profiler label."""
    from torchair.ops.attention.cpu import launch_library as _launch

    if not _launch.available():
        pytest.skip("needs the launch kernels (a C and a C++ compiler)")
    built, served, first_args = [], [], []
    real_fused, real_call = units.StaticUnit._fused, units.StaticUnit.__call__

    def spy_fused(self, *args):
        run = real_fused(self, *args)
        built.append((self, run))
        return run

    def spy_call(self, args):
        served.append("fused" if self._fast is not None else "layered")
        if not first_args:
            first_args.append(list(args))
        return real_call(self, args)

    monkeypatch.setattr(units.StaticUnit, "_fused", spy_fused)
    monkeypatch.setattr(units.StaticUnit, "__call__", spy_call)
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    compiled = torch.compile(_Decode(), backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=True, fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, n, s, 64, generator=gen) for n, s in ((8, 1), (2, 48), (2, 48)))
    cache, mirror = torch.zeros(4, 64), torch.zeros(4, 64)
    for t in (q, k, v, cache):
        torch._dynamo.mark_static(t)

    def call(lens, pos, cache_):
        with torch.no_grad():
            return compiled(q, k, v, cache_, torch.tensor([pos]), lens)

    def want(lens, pos, cache_):
        with torch.no_grad():
            return _Decode()(q, k, v, cache_, torch.tensor([pos]), lens)

    def step(lens, pos, cache_=cache, mirror_=mirror):
        before = cache_._version
        torch.testing.assert_close(call(lens, pos, cache_), want(lens, pos, mirror_),
                                   rtol=1e-5, atol=1e-5)
        assert torch.equal(cache_, mirror_) and cache_._version > before

    step([40, 3, 17], 0)  # builds the unit; this first run goes through the layered call
    assert len(built) == 1 and built[0][1] is not None, "no fused call for a CPU Inductor unit"
    unit = built[0][0]
    assert unit._fast is built[0][1] and served == ["layered"]
    for pos, lens in enumerate(([41, 4, 18], [48, 48, 1], [0, 2, 5]), start=1):
        step(lens, pos)
    other, other_mirror = torch.zeros(4, 64), torch.zeros(4, 64)
    torch._dynamo.mark_static(other)
    kept = cache.clone()
    step([40, 3, 17], 1, other, other_mirror)  # the call's cache gets the write, not the first
    assert torch.equal(cache, kept)

    with pytest.raises(ValueError, match=r"^npu_incre_flash_attention: actual_seq_lengths\[1\]="
                                         r"-2 must be >= 0$"):
        call([40, -2, 17], 2, cache)
    mirror.copy_(cache)
    step([40, 3, 17], 3)

    started, release, taken = threading.Event(), threading.Event(), []
    thread = threading.Thread(target=_other_thread_error,
                              args=(q, k, v, started, release, taken))
    thread.start()
    try:
        assert started.wait(30) and _launch.pending().value >= 1
        step([40, 3, 17], 2)  # not this thread's error: no raise here
    finally:
        release.set()
        thread.join(30)
    assert taken == ["npu_incre_flash_attention: actual_seq_lengths[1]=-7 must be >= 0"]
    assert _launch.pending().value == 0

    # the unit by itself (no backend around it) bumps the version of the input it writes
    args = first_args[0]
    written = [a for a in args if a is cache]
    assert len(written) == 1
    before = cache._version
    unit(list(args))
    assert cache._version > before
    # compiled without Inductor's per-input asserts, it checks its inputs itself, and calls the
    # compiled C++ without the entry's Python
    assert unit.layout is not None and unit._fast.parts is not None
    # and, where the C++ helper builds, from C++ (torchair.runtime.unit_call)
    assert (unit._fast.direct is not None) == (unit_call.module() is not None)
    strided = [torch.zeros(64, 4).t() if a is cache else a for a in args]
    with pytest.raises(InputLayoutError, match=r"launch unit input `.*` is float32\[4, 64\] "
                                               r"with strides \[1, 4\]"):
        unit(strided)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call([40, 3, 17], 1, cache)
    names = {e.name for e in prof.events()}
    assert any("CompiledFxGraph" in n for n in names), sorted(names)[:20]

    assert len(built) == 1, "a call compiled again"
    assert served[0] == "layered" and set(served[1:]) == {"fused"}, served


def test_a_thread_that_ends_holding_a_deferred_error_leaves_the_count():
    """The count of threads holding a deferred error goes back down when such a thread ends
    without taking it (else every later unit call in every thread would ask in vain)."""
    from torchair.ops.attention.cpu import launch_fakes as _fakes, launch_library as _launch

    if not _launch.available():
        pytest.skip("needs the launch kernels (a C and a C++ compiler)")
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, n, s, 64, generator=gen) for n, s in ((8, 1), (2, 16), (2, 16)))
    before = _launch.pending().value
    held = []

    def other():
        _fakes.ifa_decode()(q, k, v, torch.tensor([-3]), None, None, 8, 2,
                            _launch.LAYOUTS["BNSD"], 0, 0.125, True)
        held.append(_launch.pending().value)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(30)
    assert held == [before + 1]
    # join returns before the OS thread has run its thread-local destructors: wait a little
    deadline = time.monotonic() + 10
    while _launch.pending().value != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _launch.pending().value == before
    assert _launch.take() is None  # nothing of that thread's reaches this one


def test_tensor_memo_refuses_nested_tensors_and_stops_after_repeated_misses():
    from torchair.inference.guards import TensorMemo

    if TensorMemo._factory is None:
        pytest.skip("this PyTorch has no TensorGuards")
    nested = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])
    memo = TensorMemo([0])
    memo.remember([nested])  # would abort the process inside TensorGuards
    assert not memo.holds([nested])
    memo.remember([torch.randn(1)])
    for n in range(2, 2 + TensorMemo.MAX_MISSES):  # a size that changes on every call
        t = torch.randn(n)
        assert not memo.holds([t])
        memo.remember([t])
    # it stopped taking new sizes: the last one it took is the one before the last miss
    assert not memo.holds([torch.randn(1 + TensorMemo.MAX_MISSES)])
    assert memo.holds([torch.randn(TensorMemo.MAX_MISSES)])  # a hit: it takes sizes again
    memo.remember([torch.randn(3)])
    assert memo.holds([torch.randn(3)])
