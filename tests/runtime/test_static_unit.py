"""Static launch units with captured replay, on CPU through ``capture_mode("emulate")``.

The emulation runs the same staging and capture code as a CUDA graph (fixed input buffers, a
warm-up whose mutations are undone, static outputs refreshed by each replay), so these tests cover
the CUDA path's logic without a GPU. Also unit tests of InputStager, SunkScalars and the
HostScalarProgram that scalar sinking produces.
"""
from __future__ import annotations

import operator

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch._functorch.aot_autograd import aot_module_simplified

import torchair
from torchair.plan.analysis import analyze
from torchair.plan.inputs import describe_inputs
from torchair.plan.sink import SUNK_INPUT_NAME, HostScalarProgram, StepRef, sink_scalars
from torchair.runtime import units
from torchair.runtime.staging import InputStager, SunkScalars
from torchair.runtime.units import capture_mode, default_capture

B, S, H, HEADS = 2, 16, 32, 4
OP = "npu_incre_flash_attention"
EMULATED = "captured replay (CPU emulation)"


class Accumulate(torch.nn.Module):
    """A decode step whose cache updates are NOT idempotent: running it twice is visible."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H, H)
        self.k = torch.nn.Linear(H, H)

    def forward(self, x, pos, lens, kc, vc):
        kc.index_add_(1, pos, self.k(x))
        vc[:, :1].add_(x)  # a slice of the cache, updated in place
        attn = torch.ops.npu.npu_incre_flash_attention(
            self.q(x), kc, vc, actual_seq_lengths=lens, num_heads=HEADS, input_layout="BSH",
            scale_value=0.35355339059327373)
        return attn * 2 + x


def _config(*, tiling=True, frozen=False):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.frozen_parameter = frozen
    config.experimental_config.tiling_schedule_optimize = tiling
    return config


def _mark(*tensors):
    for t in tensors:
        torch._dynamo.mark_static(t)


def _models(seed=0):
    torch.manual_seed(seed)
    model = Accumulate().eval()
    twin = Accumulate().eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


def _caches(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, S, H, generator=g), torch.randn(B, S, H, generator=g)


def _steps(n, seed=5):
    g = torch.Generator().manual_seed(seed)
    steps = [([5, 7], 0)]
    for i in range(1, n):
        lens = torch.randint(0, S + 1, (2,), generator=g).tolist()
        steps.append((lens, i % S))
    return steps


def _compile(model, config=None, counter=True):
    backend = torchair.get_npu_backend(compiler_config=config or _config())
    if counter:
        backend = CompileCounterWithBackend(backend)
    return torch.compile(model, backend=backend, dynamic=True, fullgraph=True), backend


# ------------------------------------------------------------------------ end to end (emulated)

def test_emulated_path4_equals_eager_over_many_length_changes():
    model, twin = _models()
    compiled, counter = _compile(model)
    kc, vc = _caches()
    ref_kc, ref_vc = kc.clone(), vc.clone()
    before = len(torchair.graph_reports())
    with capture_mode("emulate"), torch.no_grad():
        for step, (lens, pos) in enumerate(_steps(30)):
            x, p = torch.randn(B, 1, H), torch.tensor([pos])
            _mark(x, p, kc, vc)
            out = compiled(x, p, lens, kc, vc)
            ref = twin(x, p, lens, ref_kc, ref_vc)
            torch.testing.assert_close(out, ref, msg=lambda m: f"step {step} {lens}: {m}")
            # exactly one mutation per call (the warm-up run's mutation was undone)
            torch.testing.assert_close(kc, ref_kc, rtol=0, atol=1e-6)
            torch.testing.assert_close(vc, ref_vc, rtol=0, atol=1e-6)
    assert counter.frame_count == 1
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    report = reports[0]
    assert report.path == 4 and report.build_static, str(report)
    assert report.launch == f"one launch unit: {EMULATED}", report.launch
    assert report.sunk_inputs == ["L_lens_0_", "L_lens_1_"]
    assert report.build_seconds is not None


def test_first_call_mutates_exactly_once():
    model, _ = _models()
    compiled, _ = _compile(model)
    kc, vc = torch.zeros(B, S, H), torch.zeros(B, S, H)
    x, p = torch.ones(B, 1, H), torch.tensor([3])
    _mark(x, p, kc, vc)
    with capture_mode("emulate"), torch.no_grad():
        compiled(x, p, [5, 7], kc, vc)
        k = model.k(x)
    torch.testing.assert_close(kc[:, 3:4], k)  # not 2 * k (warm-up + launch)
    assert torch.count_nonzero(kc[:, :3]) == 0 and torch.count_nonzero(kc[:, 4:]) == 0
    torch.testing.assert_close(vc[:, :1], x)
    assert torch.count_nonzero(vc[:, 1:]) == 0


def test_outputs_are_fresh_tensors():
    model, twin = _models()
    compiled, _ = _compile(model)
    kc, vc = _caches()
    ref_kc, ref_vc = kc.clone(), vc.clone()
    outs, refs = [], []
    with capture_mode("emulate"), torch.no_grad():
        for lens, pos in _steps(5):
            x, p = torch.randn(B, 1, H), torch.tensor([pos])
            _mark(x, p, kc, vc)
            outs.append(compiled(x, p, lens, kc, vc))
            refs.append(twin(x, p, lens, ref_kc, ref_vc))
    # a later replay did not overwrite an earlier returned output
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref)
    assert len({o.data_ptr() for o in outs}) == len(outs)


def test_another_kv_cache_is_copied_in_and_written_back():
    model, twin = _models()
    compiled, counter = _compile(model)
    kc1, vc1 = _caches(1)
    kc2, vc2 = _caches(2)
    ref_kc2, ref_vc2 = kc2.clone(), vc2.clone()
    with capture_mode("emulate"), torch.no_grad():
        x, p = torch.randn(B, 1, H), torch.tensor([0])
        _mark(x, p, kc1, vc1, kc2, vc2)
        compiled(x, p, [5, 7], kc1, vc1)
        x, p = torch.randn(B, 1, H), torch.tensor([4])
        _mark(x, p)
        out = compiled(x, p, [6, 9], kc2, vc2)
        ref = twin(x, p, [6, 9], ref_kc2, ref_vc2)
    assert counter.frame_count == 1
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(kc2, ref_kc2, rtol=0, atol=1e-6)  # the caller's tensor holds it
    torch.testing.assert_close(vc2, ref_vc2, rtol=0, atol=1e-6)


@pytest.mark.parametrize("max_captures", [8, 1], ids=["capture-per-cache", "copy-in-out"])
def test_another_kv_cache_leaves_the_first_cache_alone(monkeypatch, max_captures):
    """The first call's cache is borrowed as the replay buffer; another cache gets its own
    capture, or (beyond MAX_CAPTURES) is copied in and out with the borrowed one restored."""
    monkeypatch.setattr(units, "MAX_CAPTURES", max_captures)
    model, twin = _models()
    compiled, _ = _compile(model)
    caches = [_caches(1), _caches(2)]
    refs = [(k.clone(), v.clone()) for k, v in caches]
    with capture_mode("emulate"), torch.no_grad():
        for step, (lens, pos) in enumerate(_steps(6)):
            which = step % 2  # two sequences decoding in turns, each with its own cache
            (kc, vc), (ref_kc, ref_vc) = caches[which], refs[which]
            x, p = torch.randn(B, 1, H), torch.tensor([pos])
            _mark(x, p, kc, vc)
            out = compiled(x, p, lens, kc, vc)
            ref = twin(x, p, lens, ref_kc, ref_vc)
            torch.testing.assert_close(out, ref, msg=lambda m: f"step {step}: {m}")
            for (k, v), (rk, rv) in zip(caches, refs):
                torch.testing.assert_close(k, rk, rtol=0, atol=1e-6,
                                           msg=lambda m: f"step {step}: key cache: {m}")
                torch.testing.assert_close(v, rv, rtol=0, atol=1e-6)


@pytest.mark.parametrize("frozen", [False, True], ids=["params", "frozen-params"])
def test_two_model_instances_sharing_one_graph_keep_their_weights(frozen):
    """Two instances of one module class share Dynamo's compiled graph (parameters are graph
    inputs): each instance's weights must stay its own, frozen_parameter or not."""
    torch.manual_seed(0)
    m1, m2 = Accumulate().eval(), Accumulate().eval()
    r1, r2 = Accumulate().eval(), Accumulate().eval()
    r1.load_state_dict(m1.state_dict())
    r2.load_state_dict(m2.state_dict())
    backend = torchair.get_npu_backend(compiler_config=_config(frozen=frozen))
    c1 = torch.compile(m1, backend=backend, dynamic=True, fullgraph=True)
    c2 = torch.compile(m2, backend=backend, dynamic=True, fullgraph=True)
    k1, v1 = _caches(1)
    k2, v2 = _caches(2)
    rk1, rv1, rk2, rv2 = (t.clone() for t in (k1, v1, k2, v2))
    with capture_mode("emulate"), torch.no_grad():
        for step, (lens, pos) in enumerate(_steps(3)):
            x, p = torch.randn(B, 1, H), torch.tensor([pos])
            _mark(x, p, k1, v1, k2, v2)
            torch.testing.assert_close(c1(x, p, lens, k1, v1), r1(x, p, lens, rk1, rv1),
                                       msg=lambda m: f"step {step}, model 1: {m}")
            torch.testing.assert_close(c2(x, p, lens, k2, v2), r2(x, p, lens, rk2, rv2),
                                       msg=lambda m: f"step {step}, model 2: {m}")
            for name, param in m1.named_parameters():
                intact = torch.equal(param, r1.get_parameter(name))
                assert intact, f"step {step}: model 1's {name} was overwritten"


def test_without_capture_another_kv_cache_is_used_directly():
    """Control for the bug above: the plain CPU static unit (no capture) takes any cache."""
    model, twin = _models()
    compiled, _ = _compile(model)
    caches = [_caches(1), _caches(2)]
    refs = [(k.clone(), v.clone()) for k, v in caches]
    with torch.no_grad():
        for step, (lens, pos) in enumerate(_steps(6)):
            (kc, vc), (ref_kc, ref_vc) = caches[step % 2], refs[step % 2]
            x, p = torch.randn(B, 1, H), torch.tensor([pos])
            _mark(x, p, kc, vc)
            torch.testing.assert_close(compiled(x, p, lens, kc, vc),
                                       twin(x, p, lens, ref_kc, ref_vc))
            for (k, v), (rk, rv) in zip(caches, refs):
                torch.testing.assert_close(k, rk, rtol=0, atol=1e-6)
                torch.testing.assert_close(v, rv, rtol=0, atol=1e-6)
    assert torchair.graph_reports()[-1].launch == "one launch unit: one fixed-shape compiled call"


def test_capture_mode_is_read_at_compile_time():
    assert default_capture(torch.device("cpu")) is None
    assert default_capture(torch.device("cuda")) == "cuda"
    with capture_mode("emulate"):
        assert default_capture(torch.device("cpu")) == "emulate"
        with capture_mode(None):
            assert default_capture(torch.device("cuda")) is None
        assert default_capture(torch.device("cpu")) == "emulate"
    assert default_capture(torch.device("cpu")) is None
    with pytest.raises(ValueError, match="emulate"):
        with capture_mode("cpu"):
            pass


@pytest.mark.inductor
def test_emulated_path4_with_inductor():
    model, twin = _models()
    config = _config()
    config.debug.run_eagerly = False
    compiled, counter = _compile(model, config)
    kc, vc = _caches()
    ref_kc, ref_vc = kc.clone(), vc.clone()
    with capture_mode("emulate"), torch.no_grad():
        for lens, pos in _steps(6):
            x, p = torch.randn(B, 1, H), torch.tensor([pos])
            _mark(x, p, kc, vc)
            torch.testing.assert_close(compiled(x, p, lens, kc, vc),
                                       twin(x, p, lens, ref_kc, ref_vc), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(kc, ref_kc, atol=1e-5, rtol=0)
            torch.testing.assert_close(vc, ref_vc, atol=1e-5, rtol=0)
    assert counter.frame_count == 1
    report = torchair.graph_reports()[-1]
    assert report.engine == "inductor" and report.launch == f"one launch unit: {EMULATED}"


# ------------------------------------------------------------------------ InputStager

def test_stager_owned_inputs_get_their_own_buffers():
    x = torch.randn(4, 6).t()  # non-contiguous: the buffer keeps the strides
    stager = InputStager([x, 3], borrowed=set(), mutated=set(), names=["L_x_", "s0"])
    buf = stager.static[0]
    assert buf is not x and buf.data_ptr() != x.data_ptr()
    assert buf.stride() == x.stride() and buf.shape == x.shape and torch.equal(buf, x)
    assert stager.static[1] == 3
    y = torch.randn(4, 6).t()
    assert stager.stage([y, 5]) == []
    assert torch.equal(buf, y) and stager.copies == 1
    # passing the static buffer itself copies nothing
    assert stager.stage([buf, 5]) == []
    assert stager.copies == 1


def test_stager_borrowed_and_mutated_inputs_are_the_callers_tensors():
    w, cache = torch.randn(3), torch.randn(2, 5)
    stager = InputStager([w, cache], borrowed={0}, mutated={1}, names=["weight", "cache"])
    assert stager.static[0] is w and stager.static[1] is cache
    assert stager.stage([w, cache]) == [] and stager.copies == 0
    other, original = torch.randn(2, 5), cache.clone()
    pending = stager.stage([w, other])
    assert [i for i, _ in pending] == [1] and stager.copies == 1
    assert torch.equal(stager.static[1], other)  # the launch sees the caller's cache
    stager.static[1].add_(1)  # what the launch does to the cache
    expected = other + 1
    stager.finish([w, other], pending)
    torch.testing.assert_close(other, expected)  # the caller's cache got the update
    assert torch.equal(cache, original)  # the borrowed (first caller's) cache is restored


def test_stager_same_storage_view_is_not_copied():
    x = torch.randn(4, 4)
    stager = InputStager([x], borrowed=set(), mutated=set(), names=["L_x_"])
    buf = stager.static[0]
    view = buf.view(4, 4)  # another tensor object on the same memory and strides
    stager.stage([view])
    assert stager.copies == 0


@pytest.mark.parametrize("bad", [torch.zeros(3, 3), torch.zeros(2, 3, dtype=torch.float64)])
def test_stager_rejects_a_wrong_input_naming_it(bad):
    stager = InputStager([torch.zeros(2, 3), torch.zeros(4)], borrowed=set(), mutated=set(),
                         names=["L_kc_", "L_x_"])
    with pytest.raises(RuntimeError, match=r"input 0 \(`L_kc_`\)") as info:
        stager.stage([bad, torch.zeros(4)])
    assert "never runs other shapes" in str(info.value)


def test_stager_rejects_a_wrong_shape_of_a_borrowed_cache():
    cache = torch.zeros(2, 8)
    stager = InputStager([cache], borrowed=set(), mutated={0}, names=["L_kc_"])
    with pytest.raises(RuntimeError, match="L_kc_"):
        stager.stage([torch.zeros(2, 9)])


# ------------------------------------------------------------------------ SunkScalars

def test_sunk_scalars_reuse_one_int64_buffer():
    program = HostScalarProgram(input_indices=(1, 3), steps=((operator.add, (StepRef(0), 1), {}),),
                                slots=(StepRef(2), StepRef(1), 9), input_names=("a", "b"))
    sunk = SunkScalars(program, torch.device("cpu"))
    assert sunk.buffer.dtype == torch.int64 and sunk.buffer.shape == (3,)
    first = sunk.stage(["t", 4, "u", 6])
    assert first is sunk.buffer
    assert first.tolist() == [5, 6, 9]
    second = sunk.stage(["t", 10, "u", 0])
    assert second is first and first.tolist() == [11, 0, 9]


# ------------------------------------------------------------------------ HostScalarProgram

def test_host_scalar_program_semantics():
    program = HostScalarProgram(
        input_indices=(2, 0),
        steps=((operator.mul, (StepRef(0), 2), {}), (operator.sub, (StepRef(2), StepRef(1)), {})),
        slots=(StepRef(3), StepRef(1), -1), input_names=("L_a_", "L_b_"))
    assert len(program) == 3
    assert program([7, "x", 5]) == [3, 7, -1]  # [5*2 - 7, 7, -1]
    assert program([0, None, 0]) == [0, 0, -1]
    assert all(isinstance(v, int) for v in program([1, None, torch.tensor(4).item()]))


class Arith(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H, H)

    def forward(self, x, lens, kc, vc):
        seq = [lens[0] + 1, lens[1] * 2 - 3]
        return torch.ops.npu.npu_incre_flash_attention(
            self.q(x), kc, vc, actual_seq_lengths=seq, num_heads=HEADS, input_layout="BSH")


def _capture_aot(model, args):
    """The AOT inference graph the backend would get, its example inputs and its real args."""
    captured = {"calls": []}

    def fw(gm, example_inputs):
        captured["gm"], captured["example"] = gm, list(example_inputs)

        def run(*call_args):
            captured["calls"].append(list(call_args))
            return gm(*call_args)
        return run

    def backend(gm, example_inputs):
        captured["names"] = [str(n.target) for n in gm.graph.find_nodes(op="placeholder")]
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw,
                                     keep_inference_input_mutations=True)

    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for t in args:
            if isinstance(t, torch.Tensor):
                torch._dynamo.mark_static(t)
        compiled(*args)
    return captured


def test_sinking_produces_the_host_program_and_the_twin_op():
    model = Arith().eval()
    x, kc, vc = torch.randn(B, 1, H), torch.randn(B, S, H), torch.randn(B, S, H)
    cap = _capture_aot(model, (x, [5, 7], kc, vc))
    gm, example, names = cap["gm"], cap["example"], cap["names"]
    kinds = ["tensor" if isinstance(e, torch.Tensor) else "symint" for e in example]
    inputs = describe_inputs(example, names, kinds, set())
    analysis = analyze(gm, inputs, tiling_sink=True)
    assert analysis.build_static and analysis.sinkable and analysis.reasons == []
    sunk = sink_scalars(gm, analysis, names)
    program = sunk.program
    assert program.input_names == ("L_lens_0_", "L_lens_1_")
    assert len(program) == 2
    args = cap["calls"][0]
    symint_positions = [i for i, k in enumerate(kinds) if k == "symint"]
    assert sorted(program.input_indices) == symint_positions
    assert program(args) == [5 + 1, 7 * 2 - 3]
    other = list(args)
    other[symint_positions[0]], other[symint_positions[1]] = 10, 2
    assert program(other) == [11, 1]
    assert sunk.kept_inputs == tuple(i for i, k in enumerate(kinds) if k != "symint")
    placeholders = [n.name for n in sunk.gm.graph.find_nodes(op="placeholder")]
    assert placeholders[-1] == SUNK_INPUT_NAME
    targets = {str(n.target) for n in sunk.gm.graph.nodes if n.op == "call_function"}
    assert "npu.npu_incre_flash_attention_tensor.default" in targets
    assert "npu.npu_incre_flash_attention.default" not in targets
    # the sunk graph on (kept inputs + buffer) computes what the original graph computes
    for call in (args, other):
        expected = gm(*call)
        kept = [call[i] for i in sunk.kept_inputs]
        got = sunk.gm(*kept, torch.tensor(program(call), dtype=torch.int64))
        torch.testing.assert_close(got, expected)


def test_sinking_refuses_scalars_used_outside_the_op():
    class Outside(torch.nn.Module):
        def forward(self, x, lens, kc, vc):
            y = torch.ops.npu.npu_incre_flash_attention(
                x, kc, vc, actual_seq_lengths=lens, num_heads=HEADS, input_layout="BSH")
            return y * lens[1]

    x, kc, vc = torch.randn(B, 1, H), torch.randn(B, S, H), torch.randn(B, S, H)
    cap = _capture_aot(Outside(), (x, [5, 7], kc, vc))
    kinds = ["tensor" if isinstance(e, torch.Tensor) else "symint" for e in cap["example"]]
    inputs = describe_inputs(cap["example"], cap["names"], kinds, set())
    analysis = analyze(cap["gm"], inputs, tiling_sink=True)
    assert not analysis.sinkable and not analysis.build_static
    assert any("`L_lens_1_`" in r for r in analysis.reasons)
    with pytest.raises(RuntimeError, match="sink_scalars"):
        sink_scalars(cap["gm"], analysis, cap["names"])


def test_pipeline_stages_arithmetic_on_the_lengths():
    """Through the backend: the program computes lens[0]+1, lens[1]*2-3 on every call."""
    torch.manual_seed(0)
    model = Arith().eval()
    compiled, counter = _compile(model)
    kc, vc = torch.randn(B, S, H), torch.randn(B, S, H)
    before = len(torchair.graph_reports())
    with capture_mode("emulate"), torch.no_grad():
        for lens in ([5, 7], [0, 2], [15, 9], [3, 3], [7, 8]):
            x = torch.randn(B, 1, H)
            _mark(x, kc, vc)
            torch.testing.assert_close(compiled(x, lens, kc, vc), model(x, lens, kc, vc))
    assert counter.frame_count == 1
    (report,) = torchair.graph_reports()[before:]
    assert report.path == 4 and report.sunk_inputs == ["L_lens_0_", "L_lens_1_"], str(report)


def test_pipeline_sinks_several_ops_and_sym_max_floordiv_arithmetic():
    """Three value-dependent calls reading the same inputs through max/min/floordiv: one buffer,
    one compile, equal to eager for values that include 0 and 1."""
    def step(x, lens, kc, vc):
        a = torch.ops.npu.npu_incre_flash_attention(
            x, kc, vc, actual_seq_lengths=lens, num_heads=HEADS, input_layout="BSH")
        seq = [max(lens[0] // 2, 1), max(min(lens[1] - 1, S), 0)]
        b = torch.ops.npu.npu_incre_flash_attention(
            a, kc, vc, actual_seq_lengths=seq, num_heads=HEADS, input_layout="BSH")
        return torch.ops.npu.npu_incre_flash_attention(
            b, kc, vc, actual_seq_lengths=[lens[1], lens[1]], num_heads=HEADS,
            input_layout="BSH")

    compiled, counter = _compile(step)
    kc, vc = _caches()
    before = len(torchair.graph_reports())
    with capture_mode("emulate"), torch.no_grad():
        for lens in ([5, 7], [3, 9], [0, 1], [16, 16], [1, 0], [9, 4]):
            x = torch.randn(B, 1, H)
            _mark(x, kc, vc)
            torch.testing.assert_close(compiled(x, lens, kc, vc), step(x, lens, kc, vc),
                                       msg=lambda m: f"lens {lens}: {m}")
    assert counter.frame_count == 1
    (report,) = torchair.graph_reports()[before:]
    assert report.path == 4 and report.value_dependent_ops == [OP] * 3, str(report)
    assert report.sunk_inputs == ["L_lens_0_", "L_lens_1_"]


def test_captured_outputs_keep_their_aliasing():
    def fn(x, lens):
        y = x * 2
        return y, y.view(-1), torch.ops.npu.npu_incre_flash_attention(
            x, x, x, actual_seq_lengths=lens, num_heads=2)

    compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=_config()),
                             dynamic=True, fullgraph=True)
    x = torch.randn(2, 1, 8)
    _mark(x)
    with capture_mode("emulate"), torch.no_grad():
        for lens in ([2, 3], [1, 1]):
            y, flat, _ = compiled(x, lens)
            flat.fill_(5)
            assert torch.equal(y, torch.full_like(y, 5))  # as in eager: one storage
            assert y.data_ptr() != x.data_ptr()


def test_broadcast_input_with_zero_strides_is_staged():
    def fn(mask_bias, x, lens):
        return torch.ops.npu.npu_incre_flash_attention(
            x, x, x, actual_seq_lengths=lens, num_heads=2) + mask_bias

    compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=_config()),
                             dynamic=True, fullgraph=True)
    x = torch.randn(2, 1, 8)
    with capture_mode("emulate"), torch.no_grad():
        for step, lens in enumerate(([2, 3], [1, 4], [3, 3])):
            bias = torch.full((1, 1, 8), float(step)).expand(2, 1, 8)  # stride 0 on dim 0
            _mark(x, bias)
            torch.testing.assert_close(compiled(bias, x, lens), fn(bias, x, lens))


def test_emulated_replay_rejects_host_reads():
    from torchair.runtime.capture import capture_emulated

    def launch(args):
        (t,) = args
        return [t * t.sum().item()]

    replay, outputs, first = capture_emulated(launch, [torch.ones(3)])
    torch.testing.assert_close(first[0], torch.full((3,), 3.0))
    with pytest.raises(RuntimeError, match="CUDA graph capture"):
        replay()


# ------------------------------------------------------------------------ adopted inputs

def _spy_staging(monkeypatch):
    """Counts of the input copies and of the captures (with their adopt flag) of the units."""
    seen = {"copies": 0, "captures": []}
    copy_in, capture_one = InputStager._copy_in, units.StaticUnit._capture_one

    def counting_copy(self, i, arg):
        seen["copies"] += 1
        return copy_in(self, i, arg)

    def counting_capture(self, engine, call_args, pool, adopt):
        seen["captures"].append(adopt is None)
        return capture_one(self, engine, call_args, pool, adopt)

    monkeypatch.setattr(InputStager, "_copy_in", counting_copy)
    monkeypatch.setattr(units.StaticUnit, "_capture_one", counting_capture)
    return seen


def test_inputs_kept_in_the_same_buffers_are_never_copied(monkeypatch):
    """A serving loop that writes each step's inputs into the same buffers: the capture reads
    them there (adopted), so no call copies an input, and every result equals eager's."""
    seen = _spy_staging(monkeypatch)
    model, twin = _models()
    compiled, counter = _compile(model)
    kc, vc = _caches()
    ref_kc, ref_vc = kc.clone(), vc.clone()
    x_buf, p_buf = torch.zeros(B, 1, H), torch.zeros(1, dtype=torch.int64)
    g = torch.Generator().manual_seed(7)
    with capture_mode("emulate"), torch.no_grad():
        for step, (lens, pos) in enumerate(_steps(12)):
            x_buf.copy_(torch.randn(B, 1, H, generator=g))
            p_buf.fill_(pos)
            _mark(x_buf, p_buf, kc, vc)
            out = compiled(x_buf, p_buf, lens, kc, vc)
            ref = twin(x_buf, p_buf, lens, ref_kc, ref_vc)
            torch.testing.assert_close(out, ref, msg=lambda m: f"step {step}: {m}")
            torch.testing.assert_close(kc, ref_kc, rtol=0, atol=1e-6)
    assert counter.frame_count == 1
    assert seen == {"copies": 0, "captures": [True]}, seen


def test_inputs_in_new_buffers_are_copied_and_the_first_callers_tensor_is_never_written(
        monkeypatch):
    """A fresh ``x`` every step (``pos`` stays in its buffer): the second call captures once more
    with a buffer of its own for ``x`` (``pos`` still adopted) and later calls copy ``x`` alone
    into it; the tensors the first capture adopted are never written. Back in the adopted
    buffers, a call copies nothing again."""
    seen = _spy_staging(monkeypatch)
    model, twin = _models()
    compiled, _ = _compile(model)
    kc, vc = _caches()
    ref_kc, ref_vc = kc.clone(), vc.clone()
    first_x, first_p = torch.randn(B, 1, H), torch.tensor([3])
    kept_x, kept_p = first_x.clone(), first_p.clone()
    with capture_mode("emulate"), torch.no_grad():
        steps = _steps(10)
        for step, (lens, _) in enumerate(steps):
            p = first_p
            if step in (0, 6):  # the adopted buffers again at step 6, with their own values
                x = first_x
            else:
                x = torch.randn(B, 1, H)
            _mark(x, p, kc, vc)
            copies = seen["copies"]
            out = compiled(x, p, lens, kc, vc)
            ref = twin(x, p, lens, ref_kc, ref_vc)
            torch.testing.assert_close(out, ref, msg=lambda m: f"step {step}: {m}")
            torch.testing.assert_close(kc, ref_kc, rtol=0, atol=1e-6)
            assert torch.equal(first_x, kept_x) and torch.equal(first_p, kept_p), step
            if step >= 2:  # x copied into its owned buffer, or nothing in the adopted ones
                assert seen["copies"] - copies == (0 if step == 6 else 1), step
    assert seen["captures"] == [True, False], seen


def test_an_input_viewing_a_cache_written_in_place_is_not_adopted():
    stager = InputStager([torch.zeros(4, 8), torch.zeros(4, 8)[:, :1]], borrowed=set(),
                         mutated={0}, names=["cache", "x"], adopt={1})
    assert stager.adopted == [1]
    cache = torch.zeros(4, 8)
    view = cache[:, 2:3]
    stager = InputStager([cache, view], borrowed=set(), mutated={0}, names=["cache", "x"],
                         adopt={1})
    assert stager.adopted == [] and stager.static[1] is not view
    other = torch.zeros(4, 1)
    stager = InputStager([cache, other], borrowed=set(), mutated={0}, names=["cache", "x"],
                         adopt={1})
    assert stager.adopted == [1] and stager.static[1] is other
    assert stager.adopted_match([cache, other]) and not stager.adopted_match([cache, other + 0])
    with pytest.raises(RuntimeError, match="input 1 .`x`. is not at its adopted buffer"):
        stager.stage([cache, other.clone()])


def test_cached_step_adopts_persistent_inputs_under_the_emulation(tmp_path):
    """cache_compile + path 4 + captured replay + adopted inputs together: the CUDA test's
    check (tests/runtime/test_cuda_graph.py) on CPU through the emulation."""
    from tests.runtime.test_cuda_graph import check_adopted_inputs

    with capture_mode("emulate"):
        check_adopted_inputs(torch.device("cpu"), str(tmp_path), run_eagerly=True)
    assert "emulation" in torchair.graph_reports()[-1].launch


def test_device_scalars_copy_only_a_new_or_written_number():
    """The 0-d CPU inputs of a device unit (a norm's eps) are copied into their device tensors
    only when the call passes another tensor or one written since (here "device" is the CPU:
    the logic, not the transfer)."""
    from torchair.runtime.staging import DeviceScalars

    eps, other = torch.tensor(1e-6, dtype=torch.float64), torch.tensor(3, dtype=torch.int64)
    args = [torch.zeros(2), eps, other]
    scalars = DeviceScalars(args, [1, 2], torch.device("cpu"))
    assert DeviceScalars.positions_of(args, torch.device("cpu")) == []
    staged = list(args)
    scalars.stage(staged)
    assert staged[0] is args[0] and staged[1] is scalars.tensors[0] and scalars.copies == 2
    assert staged[1].item() == 1e-6 and staged[2].item() == 3
    for _ in range(3):  # the same tensors: nothing copied
        staged = list(args)
        scalars.stage(staged)
    assert scalars.copies == 2
    eps.fill_(2e-6)  # written in place: copied again
    staged = list(args)
    scalars.stage(staged)
    assert scalars.copies == 3 and staged[1].item() == 2e-6
    staged = [args[0], torch.tensor(5e-6, dtype=torch.float64), other]  # another tensor
    scalars.stage(staged)
    assert scalars.copies == 4 and staged[1].item() == 5e-6 and staged[2].item() == 3
    with pytest.raises(RuntimeError, match="input 1 was a 0-d tensor"):
        scalars.stage([args[0], torch.zeros(2), other])


def test_device_scalars_of_inference_tensors_compare_values_and_skip_written_inputs():
    """Inference tensors have no version counter: their value decides whether to copy. A 0-d
    input the unit writes in place is never a device scalar (its write must reach the caller)."""
    from torchair.runtime.staging import DeviceScalars

    with torch.inference_mode():
        eps = torch.tensor(1e-6, dtype=torch.float64)
        zero = torch.tensor(0.0, dtype=torch.float64)
    args = [torch.zeros(2), eps, zero]
    scalars = DeviceScalars(args, [1, 2], torch.device("cpu"))
    assert not scalars.tensors[0].is_inference()
    for _ in range(3):
        staged = list(args)
        scalars.stage(staged)
    assert scalars.copies == 2 and staged[1].item() == 1e-6
    with torch.inference_mode():
        same = torch.tensor(1e-6, dtype=torch.float64)
        negative_zero = torch.tensor(-0.0, dtype=torch.float64)
    staged = [args[0], same, negative_zero]
    scalars.stage(staged)  # the same eps value: not copied; -0.0 is not 0.0
    assert scalars.copies == 3 and str(staged[2].item()) == "-0.0"
    meta = torch.device("meta")
    assert DeviceScalars.positions_of(args, meta) == [1, 2]
    assert DeviceScalars.positions_of(args, meta, mutated={2}) == [1]


def test_an_adopted_tensor_whose_storage_was_swapped_no_longer_matches():
    """The capture read the adopted tensor's memory then: ``set_`` on the very same object moves
    it, and the stager must not serve it from the old address."""
    x = torch.randn(4, 8)
    stager = InputStager([x], borrowed=set(), mutated=set(), names=["x"], adopt={0})
    assert stager.adopted_match([x])
    x.set_(torch.zeros(4, 8))
    assert not stager.adopted_match([x])


def test_a_cpu_scalar_stays_a_host_input_when_written_or_beside_16_bit_floats():
    """Which 0-d CPU inputs a captured unit may read from a device tensor (pipeline)."""
    import torch.fx as fx

    from torchair.core.pipeline import _device_scalar_ok
    from torchair.plan.inputs import InputInfo

    graph = fx.Graph()
    x, eps, temp, count = (graph.placeholder(n) for n in ("x", "eps", "temp", "count"))
    a = graph.call_function(torch.ops.aten.add.Tensor, (x, eps))
    a.meta["val"] = torch.empty(2, dtype=torch.float32)
    b = graph.call_function(torch.ops.aten.div.Tensor, (x, temp))
    b.meta["val"] = torch.empty(2, dtype=torch.bfloat16)
    c = graph.call_function(torch.ops.aten.add_.Tensor, (count, 1))
    c.meta["val"] = torch.empty((), dtype=torch.float64)
    graph.output((a, b, c))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    inputs = [InputInfo(0, "x", "tensor", (2,), "float32", device="cuda"),
              InputInfo(1, "eps", "tensor", (), "float64"),
              InputInfo(2, "temp", "tensor", (), "float64"),
              InputInfo(3, "count", "tensor", (), "float64", mutated=True)]
    assert _device_scalar_ok(gm, (0, 1, 2, 3), inputs) == {1}
