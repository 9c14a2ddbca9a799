"""torch.compile's compiled function is torchair's launch unit itself, without AOT autograd's
runtime wrapper, only where that wrapper would pass the arguments through; with outputs aliasing
inputs, under autocast, with the switch off, the wrapper runs. Results, in-place updates,
version counters and grad mode are the same either way."""
from __future__ import annotations

import torch
import torch._dynamo

import torchair
from torchair.core import backend as _backend
from torchair.runtime import engines


def _compiled(fn, spy):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True  # FX engine: fast builds, results bit-exact with eager
    inner = torchair.get_npu_backend(compiler_config=config)

    def backend(gm, example_inputs):
        out = inner(gm, example_inputs)
        spy.append(getattr(out, "direct", False))
        return out

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)


def _static(*tensors):
    for t in tensors:
        torch._dynamo.mark_static(t)
    return tensors


class Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8), requires_grad=False)

    def forward(self, x, cache, pos):
        cache.index_copy_(0, pos, x[:1])
        return (x @ self.w).relu() + cache.sum(0)


def test_plain_step_is_called_directly_same_results_and_in_place_update():
    spy = []
    step = Step()
    compiled = _compiled(step, spy)
    mine, want = torch.zeros(6, 8), torch.zeros(6, 8)
    x = torch.randn(2, 8)
    _static(x, mine)
    with torch.no_grad():
        for i in range(3):
            x, pos = _static(torch.randn(2, 8))[0], torch.tensor([i])
            before = (mine._version, want._version)
            got, expected = compiled(x, mine, pos), step(x, want, pos)
            assert torch.equal(got, expected) and torch.equal(mine, want)
            assert mine._version - before[0] >= 1  # the in-place write is visible to autograd
    assert spy == [True]


def test_grad_mode_on_at_call_gives_no_graph_and_same_result():
    spy = []
    step = Step()
    compiled = _compiled(step, spy)
    cache = torch.zeros(6, 8)
    x = torch.randn(2, 8)
    _static(x, cache)
    with torch.enable_grad():
        got = compiled(x, cache, torch.tensor([0]))
        assert torch.is_grad_enabled()  # restored after the call
    assert not got.requires_grad and got.grad_fn is None
    assert torch.equal(got, step(x, torch.zeros(6, 8), torch.tensor([0])))
    assert spy == [True]


def _marks(t):
    return {name: getattr(t, name) for name in dir(t) if name.startswith("_dynamo_")
            and name.endswith("_indices")}


def test_dynamic_outputs_are_marked_as_the_wrapper_marks_them(monkeypatch):
    """A shape-generic graph's outputs get their symbolic dims marked (so that they stay dynamic
    when fed back, e.g. the next step's tokens): by the direct call with PyTorch's own marking
    function where this PyTorch has it, else by the wrapper; the same marks either way, and a
    fed-back output compiles nothing new."""
    def step(x):
        return x * 2 + 1, x.sum()  # a symbolic dim, and none (marked with an empty set)

    marks, counts = {}, {}
    for direct in ("1", "0"):
        monkeypatch.setenv(engines.ENV_DIRECT, direct)
        spy = []
        compiled = _compiled(step, spy)
        x = torch.randn(3)
        out, total = compiled(x)
        assert torch.equal(out, x * 2 + 1) and torch.equal(total, x.sum())
        marks[direct] = (_marks(out), _marks(total))
        again = compiled(out)[0]  # fed back: symbolic dims stay symbolic
        assert torch.equal(again, out * 2 + 1)
        y = torch.randn(5)
        assert torch.equal(compiled(y)[0], y * 2 + 1)
        counts[direct] = len(spy)
        assert spy[0] == (direct == "1" and engines.dynamic_output_marks(_meta(step)) is not None)
    assert marks["1"] == marks["0"] and marks["0"][0] and marks["0"][1], marks
    assert counts == {"1": 1, "0": 1}


def _meta(fn):
    """AOT's forward metadata of ``fn`` compiled with dynamic shapes (for the marks check)."""
    seen = {}

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def fw(g, inputs):
            seen["meta"] = torch._guards.TracingContext.try_get().fw_metadata
            return g

        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=True)(torch.randn(3))
    torch._dynamo.reset()
    return seen["meta"]


def test_output_aliasing_an_input_keeps_the_wrapper():
    spy = []

    def view(x):
        return x.view(-1)[:3], x * 2

    compiled = _compiled(view, spy)
    x = torch.randn(2, 4)
    _static(x)
    got = compiled(x)
    assert spy == [False]
    x.view(-1)[0] = 42.0  # the output is a view of the input, as in eager
    assert got[0][0].item() == 42.0


def test_autocast_at_build_keeps_the_wrapper():
    spy = []
    compiled = _compiled(lambda x, w: x @ w, spy)
    x, w = _static(torch.randn(4, 8), torch.randn(8, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(x, w)
    assert spy == [False] and got.dtype == torch.bfloat16


def test_switch_off_keeps_the_wrapper(monkeypatch):
    monkeypatch.setenv(engines.ENV_DIRECT, "0")
    spy = []
    compiled = _compiled(lambda x: x * 2 + 1, spy)
    x = _static(torch.randn(3))[0]
    assert torch.equal(compiled(x), x * 2 + 1)
    assert spy == [False]


def test_plain_aot_call_refuses_what_the_wrapper_must_do():
    class Meta:
        mutated_inp_runtime_indices = []
        tokens = {}
        output_info = []
        num_intermediate_bases = 0
        subclass_inp_meta = ()
        subclass_fw_graph_out_meta = ()
        is_rng_op_functionalized = False
        dynamic_outputs = False
        grad_enabled_mutation = None

    assert engines.plain_aot_call(Meta(), 2, 2, False) == ()
    assert engines.plain_aot_call(Meta(), 2, 3, False) is None  # deduplicated inputs
    assert engines.plain_aot_call(Meta(), 2, 2, True) is None  # autocast at build
    for field, value in (("mutated_inp_runtime_indices", [0]), ("dynamic_outputs", True),
                         ("grad_enabled_mutation", True), ("is_rng_op_functionalized", True),
                         ("num_intermediate_bases", 1)):
        meta = Meta()
        setattr(meta, field, value)
        assert engines.plain_aot_call(meta, 2, 2, False) is None, field
    assert engines.plain_aot_call(None, 2, 2, False) is None
    assert _backend._direct_call({}, []) is None


def test_training_graph_keeps_the_wrapper_and_autograd():
    """Inputs that require grad under grad mode: AOT compiles a training forward (it returns the
    tensors saved for backward too) and its wrapper builds the autograd node: never direct."""
    spy = []
    lin = torch.nn.Linear(4, 3)
    compiled = _compiled(lambda x: lin(x).relu().sum(), spy)
    x = _static(torch.randn(2, 4))[0]
    out = compiled(x)
    assert spy == [False]
    assert out.grad_fn is not None
    out.backward()
    want = torch.zeros_like(lin.weight)
    lin_ref = torch.nn.Linear(4, 3)
    lin_ref.load_state_dict(lin.state_dict())
    lin_ref(x).relu().sum().backward()
    assert torch.allclose(lin.weight.grad, lin_ref.weight.grad) and not torch.equal(
        lin.weight.grad, want)


def test_captured_tensor_requiring_grad_after_a_no_grad_call():
    """The same function first compiled under no_grad (inference, direct), then called with
    grad on: the recompiled training graph keeps the wrapper and its result has a grad_fn."""
    spy = []
    w = torch.randn(3, requires_grad=True)
    compiled = _compiled(lambda x: x * w, spy)
    x = _static(torch.randn(3))[0]
    with torch.no_grad():
        compiled(x)
    out = compiled(x)
    assert spy == [True, False]
    assert out.requires_grad and out.grad_fn is not None
