"""The generated per-call check (``guards.codegen``) serves exactly the calls the general check
serves: for valid calls it returns the same graph inputs (the same objects), for every call the
general check refuses it returns None, and it never compiles recorded text."""
from __future__ import annotations

import pytest
import torch

import torchair
from torchair.inference import cache_compile
from torchair.inference.guards import codegen as guard_codegen
from torchair.runtime import unit_call


class _Many(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 2.0))

    def step(self, x, lens: list, opts: dict, pair: tuple, k: int):
        y = self.l(x) * self.scale + lens[0] + len(lens)
        if opts["mode"] == "a":
            y = y * opts["alpha"]
        if k > 2:
            y = y + pair[0] - pair[1]
        return y.relu() + x.size(0)


def _config():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


def _calls():
    """(args, whether the general check should serve it) pairs around the traced call."""
    x = torch.randn(2, 8)
    a, b = torch.randn(2, 8), torch.randn(2, 8)
    good = (x, [3, 4], {"mode": "a", "alpha": 1.5}, (a, b), 5)
    return good, [
        (good, True),
        ((torch.randn(2, 8), [7, 4], {"mode": "a", "alpha": 2.5}, (a, b), 6), True),
        ((torch.randn(3, 8), [3, 4], {"mode": "a", "alpha": 1.5},
          (torch.randn(3, 8), torch.randn(3, 8)), 5), None),                # another batch
        ((x, [3, 4, 5], {"mode": "a", "alpha": 1.5}, (a, b), 5), False),   # list length
        ((x, [3.0, 4], {"mode": "a", "alpha": 1.5}, (a, b), 5), False),    # element type
        ((x, (3, 4), {"mode": "a", "alpha": 1.5}, (a, b), 5), False),      # list -> tuple
        ((x, [3, 4], {"mode": "b", "alpha": 1.5}, (a, b), 5), False),      # branch taken
        ((x, [3, 4], {"mode": "a", "alpha": 1.5}, (a, a), 5), False),      # aliasing
        ((x, [3, 4], {"mode": "a", "alpha": 1.5}, (a, b), 1), False),      # k > 2 no more
        ((x, [3, 4], {"mode": "a", "alpha": 1.5}, (a, b), 5.0), False),    # int -> float
        ((x.t().contiguous().t(), [3, 4], {"mode": "a", "alpha": 1.5}, (a, b), 5), None),
    ]


def _warm(tmp_path):
    """A cached _Many.step after three calls (cold, first served call with the full check, first
    per-call check), and the good call's arguments."""
    model = _Many().eval()
    cached = cache_compile(model.step, cache_dir=tmp_path / "c", config=_config())
    good, _ = _calls()
    with torch.no_grad():
        for _ in range(3):
            cached(*good)
    return cached, good


def test_generated_check_agrees_with_the_general_check(tmp_path):
    cached, _ = _warm(tmp_path)
    _, calls = _calls()
    guards = cached.runtime.guards
    program = guards.program
    assert program is not None, "the generator covers these guards"
    assert "per_call" in program.source and "L[" not in program.source
    helper = unit_call.state_watch()
    if helper is not None:  # the no-aliasing guard as one C call (the aliasing case below)
        assert any(v is helper.distinct for v in program.__globals__.values())
    served = 0
    for args, expected in calls:
        frame = cached.frame(args, {})
        # under no_grad, as cache_compile calls the checks (the program's process-state lines
        # compare PyTorch's snapshot, grad mode included, and leave any change to the general
        # form)
        with torch.no_grad():
            fast = program(frame, cached.frame.globals)
            guards.program = None  # the general form
            try:
                why, flat = guards.check_arguments(frame, cached.frame.globals)
            finally:
                guards.program = program
        if expected is not None:
            assert (why == "") == expected, (args, why)
        if fast is not None:
            served += 1
            assert why == "" and len(fast) == len(flat)
            assert all(a is b for a, b in zip(fast, flat)), "the same graph inputs"
        # the general check may serve a call the generated one leaves to it (a memo miss)
    assert served >= 2


def test_type_guards_on_one_type_share_one_check(tmp_path):
    """The ints of ``lens`` and ``k`` are guarded on one type: the generated check tests them
    with one TypeIs (one object to read on a cold call), one per recorded type; a float where
    an int was traced is still refused (the agreement test above runs those calls)."""
    import re

    cached, good = _warm(tmp_path)
    program = cached.runtime.guards.program
    names = re.findall(r"is (t[0-9]+)\.last", program.source)
    wants = {name: program.__globals__[name].want for name in names}
    assert len(names) > len(wants), program.source  # several guards, fewer objects
    assert len(set(wants.values())) == len(wants)  # one object per recorded type
    assert ("builtins", "int") in wants.values()
    bad = (good[0], [3.0, 4]) + good[2:]
    with torch.no_grad():
        assert program(cached.frame(bad, {}), cached.frame.globals) is None
        assert program(cached.frame(good, {}), cached.frame.globals) is not None


class _Passthrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _deterministic():
    torch.use_deterministic_algorithms(True)
    return lambda: torch.use_deterministic_algorithms(False)


def _cudnn_tf32():
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = not before

    def undo():
        torch.backends.cudnn.allow_tf32 = before
    return undo


def _autocast():
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    ctx.__enter__()
    return lambda: ctx.__exit__(None, None, None)


def _stack_mode():
    mode = _Passthrough()
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


def _process_mode():
    from torchair.core import function_modes

    actives = function_modes.process_actives()
    active = _Passthrough  # any object: a registered process-wide mode that is active now
    actives.append(lambda: active)
    return lambda: actives.pop()


@pytest.mark.parametrize("change", [_deterministic, _cudnn_tf32, _autocast, _stack_mode,
                                    _process_mode], ids=lambda f: f.__name__.strip("_"))
def test_process_state_changes_pass_the_generated_check_to_the_general_one(tmp_path, change):
    """The generated function opens with the process state's common case: a call after any
    change of it (the snapshot's state, autocast, cuDNN TF32, a mode on the thread's stack, an
    active process-wide mode) gets None from it, and the general check refuses the call; once
    the change is undone the generated function serves again."""
    cached, good = _warm(tmp_path)
    with torch.no_grad():
        guards = cached.runtime.guards
        frame, globals_ = cached.frame(good, {}), cached.frame.globals
        assert guards.program(frame, globals_) is not None
        undo = change()
        try:
            assert guards.program(frame, globals_) is None
            why, _ = guards.check_arguments(frame, globals_)
        finally:
            undo()
        assert why, "the general check refuses the changed process state"
        assert guards.program(frame, globals_) is not None
        assert guards.check_arguments(frame, globals_)[0] == ""


def test_calls_served_through_the_generated_check_equal_eager(tmp_path, monkeypatch):
    model = _Many().eval()
    good, calls = _calls()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64):  # each refusal recompiles
        for codegen in ("1", "0"):
            monkeypatch.setenv("TORCHAIR_GUARD_CODEGEN", codegen)
            cached = cache_compile(model.step, cache_dir=tmp_path / codegen, config=_config())
            with torch.no_grad():
                cached(*good)
                assert (cached.runtime.guards.program is not None) == (codegen == "1")
                for args, _ in calls:
                    got, want = cached(*args), model.step(*args)
                    torch.testing.assert_close(got, want)
            torch._dynamo.reset()


def test_no_recorded_text_reaches_the_generated_code(tmp_path):
    """Keys and constants are bound by name: a dict key that looks like code stays data."""
    class Odd(torch.nn.Module):
        def step(self, x, opts: dict):
            return x * opts["a'] + __import__('os').getpid() + ['"] + 1

    cached = cache_compile(Odd().step, cache_dir=tmp_path / "c", config=_config())
    key = "a'] + __import__('os').getpid() + ['"
    with torch.no_grad():
        for _ in range(3):
            cached(torch.ones(2), {key: 2.0})
        program = cached.runtime.guards.program
        if program is not None:
            assert "__import__" not in program.source and "getpid" not in program.source
        assert torch.equal(cached(torch.ones(2), {key: 3.0}), torch.full((2,), 4.0))


def test_an_uncovered_guard_keeps_the_general_check():
    from torchair.inference.guards import Sources
    from torchair.inference.guards.state import ProcessState

    class Fake:
        per_call = ([], [], [])
        untensored = [type("G", (), {"code": "device(type='cpu')", "type_of": None,
                                      "obj": None})()]
        memo = type("M", (), {"slots": ()})()
        inputs: list = []
        module_root = None
        process = ProcessState()

    Fake.sources = Sources()
    with pytest.raises(guard_codegen.NotGenerated):
        guard_codegen.per_call_program(Fake())


def _hand_made(code, frame_values):
    """A GuardSet of one guard on L['x'] (a hand-made record), after watch_arguments, and the
    generated and general answers for each value of x."""
    from torchair.inference.guards import GuardSet

    gs = GuardSet([{"kind": "EQUALS_MATCH", "code": [code], "source": "L['x']"}], ["L['x']"])
    gs.watch_arguments(["x"])
    answers = []
    for x in frame_values:
        gs.check({"x": x}, {})  # the first (full) check of each frame sets the epoch
        fast = gs.program({"x": x}, {})
        program, gs.program = gs.program, None
        why, _ = gs.check_arguments({"x": x}, {})
        gs.program = program
        answers.append((fast is not None, why == ""))
    return gs, answers


@pytest.mark.parametrize("code", [
    "(0 < 1 < L['x']) is not True",   # a chain compared by identity: True/False, not the tensor
    "(0 < 1 < L['x']) is True",
    "(L['x'] > 0) is not True",       # one comparison: its own result (a tensor here)
    "-0.0 == L['x'] or not L['x'] + 1 > 3",
    "(1 if L['x'] > 2 else 0) == 1",
])
def test_generated_expressions_equal_the_general_ones(code):
    gs, answers = _hand_made(code, [torch.tensor(5), torch.tensor(-1), 5, 0])
    assert gs.program is not None
    for fast, general in answers:
        assert not fast or general, (code, answers)  # never serves what the general refuses


def test_compiled_frames_that_assign_buffers_do_not_guard_on_the_module_epoch():
    """cache_compile watches module registrations with PyTorch's global hooks; Dynamo traced
    them inside any compiled forward that assigns a buffer and guarded on the epoch, so such a
    frame compiled again at every call (the Llama client hit the recompile limit after a
    cache_compile test in the same process)."""
    from torchair.inference.guards import epoch

    epoch.watch_modules()

    class Assigns(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.zeros(3))

        def forward(self, x):
            self.b = x * 2
            return x + 1

    module = Assigns()
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch._dynamo.utils.counters.clear()
    for _ in range(10):
        x = torch.randn(3)
        assert torch.equal(compiled(x), x + 1) and torch.equal(module.b, x * 2)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    before = epoch.module_epoch()
    module.register_buffer("c", torch.ones(1))  # outside compiled code: bumped
    assert epoch.module_epoch() == before + 1


def test_each_call_is_traced_at_debug_with_its_tier_rate_limited(torchair_log, monkeypatch):
    """check_arguments traces at DEBUG which tier decided a call: each of the first calls, then
    only every so many calls and whenever the tier changes."""
    from torchair.inference.guards import guard_set

    monkeypatch.setattr(guard_set, "_TRACE_EVERY", 5)
    gs = guard_set.GuardSet([{"kind": "EQUALS_MATCH", "code": ["L['x'] == 3"],
                              "source": "L['x']"}], ["L['x']"])
    gs.watch_arguments(["x"])
    assert gs.program is not None

    def traced():
        return [r.getMessage() for r in torchair_log if "guard check of call" in r.getMessage()]

    assert gs.check_arguments({"x": 3}, {})[0] == ""  # the first call: a full check
    for _ in range(guard_set._TRACE_FIRST + 10):
        assert gs.check_arguments({"x": 3}, {})[0] == ""
    lines = traced()
    assert "call 1 served by the full check" in lines[0]
    assert all("served by the generated program" in m for m in lines[1:])
    # every call up to _TRACE_FIRST, then every 5th
    assert len(lines) == guard_set._TRACE_FIRST + 2, lines
    assert gs.check_arguments({"x": 4}, {})[0] != ""  # another tier: traced at once
    last = traced()[-1]
    assert "refused by the per-call guards" in last and "L['x'] == 3" in last
