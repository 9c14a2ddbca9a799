"""The backend's public entry points: argument checks, config copying, get_compiler, reports."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch._functorch.aot_autograd import aot_module_simplified

import torchair

B, S, H = 2, 16, 32


class Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H, H)

    def forward(self, x, lens, kc, vc):
        y = torch.ops.npu.npu_incre_flash_attention(
            self.q(x), kc, vc, actual_seq_lengths=lens, num_heads=4, input_layout="BSH",
            scale_value=0.25)
        return torch.relu(y) + x


def _inputs():
    return torch.randn(B, 1, H), torch.randn(B, S, H), torch.randn(B, S, H)


def _run_path4_setup(backend, length_sets=([5, 7], [3, 9], [1, 12])):
    """dynamic=True + mark_static on every tensor: path 3 or 4 depending on the config."""
    torch.manual_seed(0)
    model = Attn().eval()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for lens in length_sets:
            x, kc, vc = _inputs()
            for t in (x, kc, vc):
                torch._dynamo.mark_static(t)
            torch.testing.assert_close(compiled(x, list(lens), kc, vc),
                                       model(x, list(lens), kc, vc))
    return torchair.graph_reports()[before:]


def _config(*, tiling=False, eager=True):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = eager
    config.experimental_config.tiling_schedule_optimize = tiling
    return config


# ------------------------------------------------------------------------- argument checks

@pytest.mark.parametrize("bad", ["x", 1, {"mode": "max-autotune"}])
def test_compiler_config_must_be_a_compiler_config(bad):
    with pytest.raises(TypeError, match=r"compiler_config must be a torchair\.CompilerConfig"):
        torchair.get_npu_backend(compiler_config=bad)


def test_compiler_config_type_error_names_the_type_and_the_fix():
    with pytest.raises(TypeError) as info:
        torchair.get_npu_backend(compiler_config="x")
    assert "str" in str(info.value)
    assert "torchair.CompilerConfig()" in str(info.value)


def test_get_compiler_checks_its_config_too():
    with pytest.raises(TypeError, match="compiler_config"):
        torchair.get_compiler("x")


def test_backend_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        torchair.get_npu_backend(torchair.CompilerConfig())  # type: ignore[misc]


@pytest.mark.parametrize("bad", [[(torch.ops.aten.relu.default, torch.relu)], "relu", 3])
def test_custom_decompositions_must_be_a_dict(bad):
    with pytest.raises(TypeError, match="custom_decompositions must be a dict"):
        torchair.get_npu_backend(custom_decompositions=bad)


def test_default_config_when_none():
    backend = torchair.get_npu_backend()
    assert isinstance(backend.compiler_config, torchair.CompilerConfig)
    assert backend.compiler_config.experimental_config.tiling_schedule_optimize.value == "0"


# ------------------------------------------------------------------------- config is copied

def test_config_is_copied_at_get_npu_backend():
    config = _config(tiling=False)
    backend = torchair.get_npu_backend(compiler_config=config)
    assert backend.compiler_config is not config
    # changed after the backend was made: must not reach it
    config.experimental_config.tiling_schedule_optimize = True
    config.debug.run_eagerly = False
    assert backend.compiler_config.experimental_config.tiling_schedule_optimize.value == "0"
    assert backend.compiler_config.debug.run_eagerly.value == "1"
    reports = _run_path4_setup(backend)
    assert len(reports) == 1
    report = reports[0]
    assert report.path == 3 and not report.build_static, str(report)  # tiling sink stayed off
    assert report.engine == "fx"  # run_eagerly stayed on
    assert any("tiling_schedule_optimize" in r for r in report.reasons)


def test_backend_config_copy_is_not_shared_with_later_backends():
    config = _config(tiling=True)
    first = torchair.get_npu_backend(compiler_config=config)
    config.experimental_config.tiling_schedule_optimize = False
    second = torchair.get_npu_backend(compiler_config=config)
    assert first.compiler_config.experimental_config.tiling_schedule_optimize.value == "1"
    assert second.compiler_config.experimental_config.tiling_schedule_optimize.value == "0"
    reports = _run_path4_setup(first)
    assert [r.path for r in reports] == [4]


# ------------------------------------------------------------------------- custom decompositions

def test_custom_decompositions_are_applied():
    calls = []

    def relu_decomp(x):
        calls.append(1)
        return torch.clamp_min(x, 0.0)

    backend = torchair.get_npu_backend(
        compiler_config=_config(tiling=True),
        custom_decompositions={torch.ops.aten.relu.default: relu_decomp})
    reports = _run_path4_setup(backend)
    assert len(reports) == 1 and reports[0].path == 4
    assert calls, "the custom decomposition was never traced"


# ------------------------------------------------------------------------- get_compiler

def test_get_compiler_works_with_aot_module_simplified():
    compiler = torchair.get_compiler(_config(tiling=True))

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler,
                                     keep_inference_input_mutations=True)

    counter = CompileCounterWithBackend(backend)
    reports = _run_path4_setup(counter, length_sets=([5, 7], [3, 9], [1, 12], [16, 0]))
    assert counter.frame_count == 1
    assert len(reports) == 1
    report = reports[0]
    assert report.path == 4 and report.build_static and report.reasons == [], str(report)
    # without the backend's signature the inputs still get their kinds from the example values
    kinds = sorted(i.kind for i in report.inputs)
    assert kinds.count("symint") == 2, str(report)
    assert len(report.sunk_inputs) == 2


def test_get_compiler_with_input_mutation():
    compiler = torchair.get_compiler(_config(tiling=True))

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler,
                                     keep_inference_input_mutations=True)

    def step(x, pos, lens, kc):
        kc.index_copy_(1, pos, x)
        return torch.ops.npu.npu_incre_flash_attention(
            x, kc, kc, actual_seq_lengths=lens, num_heads=4, input_layout="BSH")

    compiled = torch.compile(step, backend=backend, dynamic=True, fullgraph=True)
    kc = torch.randn(B, S, H)
    ref_kc = kc.clone()
    with torch.no_grad():
        for i, lens in enumerate([[5, 7], [3, 9], [8, 16]]):
            x, pos = torch.randn(B, 1, H), torch.tensor([i])
            for t in (x, pos, kc):
                torch._dynamo.mark_static(t)
            torch.testing.assert_close(compiled(x, pos, lens, kc), step(x, pos, lens, ref_kc))
            assert torch.equal(kc, ref_kc)


# ------------------------------------------------------------------------- graph_reports

def test_graph_reports_is_a_copy_oldest_first():
    backend1 = torchair.get_npu_backend(compiler_config=_config(tiling=False))
    first = _run_path4_setup(backend1)
    torch._dynamo.reset()
    backend2 = torchair.get_npu_backend(compiler_config=_config(tiling=True))
    second = _run_path4_setup(backend2)
    reports = torchair.graph_reports()
    assert reports[-2:] == first + second
    assert [r.path for r in reports[-2:]] == [3, 4]
    ids = [r.graph_id for r in reports]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # the returned list is a copy: changing it does not change the registry
    n = len(reports)
    reports.clear()
    assert len(torchair.graph_reports()) == n
    assert torchair.graph_reports() is not torchair.graph_reports()


def test_str_report_is_a_readable_summary():
    backend = torchair.get_npu_backend(compiler_config=_config(tiling=True))
    (report,) = _run_path4_setup(backend)
    text = str(report)
    assert "path 4" in text
    assert "FX dynamic, IR static, build static" in text
    assert f"graph {report.graph_id}" in text
    assert "npu_incre_flash_attention" in text
    assert "L_lens_0_" in text and "L_lens_1_" in text
    assert "sunk into the device scalar buffer" in text
    assert "why not static" not in text
    for info in report.inputs:
        assert info.name in text

    backend3 = torchair.get_npu_backend(compiler_config=_config(tiling=False))
    torch._dynamo.reset()
    (report3,) = _run_path4_setup(backend3)
    text3 = str(report3)
    assert "path 3" in text3 and "build dynamic" in text3
    assert "why not static" in text3 and "tiling_schedule_optimize" in text3


def test_reports_are_graph_reports():
    backend = torchair.get_npu_backend(compiler_config=_config(tiling=True))
    (report,) = _run_path4_setup(backend)
    assert isinstance(report, torchair.GraphReport)
    assert torchair.graph_reports()[-1] is report


# ---- a failing custom pass is named -------------------------------------------------------

def _bad_pre_pass(gm, example_inputs, config):
    return {}["missing"]


class _Passes:
    @staticmethod
    def bad_post_pass(gm, example_inputs, config):
        raise ValueError("no such node")


@pytest.mark.parametrize("hook, fn, cls, text, qualname", [
    ("post_grad_custom_pre_pass", _bad_pre_pass, KeyError, "KeyError: 'missing'",
     "_bad_pre_pass"),
    ("post_grad_custom_post_pass", _Passes.bad_post_pass, ValueError, "ValueError: no such node",
     "_Passes.bad_post_pass"),
])
def test_a_failing_custom_pass_is_named(hook, fn, cls, text, qualname):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    setattr(config, hook, fn)
    expected = (f"custom pass {__name__}.{qualname} (config.{hook}) raised {text}. The error is "
                f"in this pass")
    # called directly: the original type, the original exception as __cause__
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(cls) as info:
        torchair.get_compiler(config)(gm, [torch.ones(2)])
    assert str(info.value).startswith(expected), str(info.value)
    assert f"set config.{hook} = None" in str(info.value)
    assert type(info.value.__cause__) is cls and info.value.__cause__ is not info.value
    # through torch.compile: the message the user sees names the pass and the hook
    compiled = torch.compile(lambda x: x * 2, backend=torchair.get_npu_backend(
        compiler_config=config))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(torch.ones(2))
    assert f"{cls.__name__}: {expected}" in str(info.value), str(info.value)
    assert isinstance(info.value.inner_exception, cls)
