"""Ascend device arguments, streams, events and torch.npu functions under the emulation.

Each CPU test would fail without the emulation's piece it names: "npu" device strings are not
devices to torch, torch.npu has no Stream, Tensor.record_stream rejects CPU tensors.
"""
import logging
import pickle
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.overrides import TorchFunctionMode

import torchair
from torchair import compat

REAL_DEVICE = torch._C.device
CPU = REAL_DEVICE("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def cpu_npu():
    with compat.emulate_npu("cpu"):
        import torch_npu

        yield torch_npu


def _mode_stack_len() -> int:
    return torch._C._len_torch_function_stack()


# --- device arguments --------------------------------------------------------------------------

NPU_SPECS = ["npu", "npu:0", ("npu", 0), "device:npu:0"]


def _spec(spec):
    """("npu", 0) -> torch.device("npu", 0); "device:npu:0" -> torch.device("npu:0")."""
    if isinstance(spec, tuple):
        return torch.device(*spec)
    if spec.startswith("device:"):
        return torch.device(spec[len("device:"):])
    return spec


@pytest.mark.parametrize("spec", NPU_SPECS, ids=str)
def test_factories_take_npu_devices(cpu_npu, spec):
    device = _spec(spec)
    made = [torch.randn(2, 3, device=device), torch.empty(2, device=device),
            torch.zeros(2, device=device), torch.ones(2, device=device),
            torch.full((2,), 3.0, device=device), torch.arange(3, device=device),
            torch.tensor([1.0, 2.0], device=device), torch.as_tensor([1, 2], device=device),
            torch.zeros_like(torch.ones(2), device=device),
            torch.ones(1).new_zeros(2, device=device)]
    assert all(t.device == CPU for t in made)
    assert torch.equal(made[4], torch.full((2,), 3.0)) and torch.equal(made[5], torch.arange(3))


@pytest.mark.parametrize("spec", NPU_SPECS, ids=str)
def test_tensor_and_module_to_take_npu_devices(cpu_npu, spec):
    device = _spec(spec)
    t = torch.arange(4.0)
    for moved in (t.to(device), t.to(device=device), t.to(device, torch.float64),
                  t.to(device=device, dtype=torch.float16), t.npu(), t.npu(0)):
        assert moved.device == CPU and torch.equal(moved.double(), t.double())
    assert t.to(device, torch.float64).dtype == torch.float64
    model = torch.nn.Linear(2, 3)
    assert model.to(device) is model and model.weight.device == CPU
    model.to(device, torch.float64)  # Module.to parses its arguments with _parse_to
    assert model.weight.dtype == torch.float64


def test_other_devices_and_strings_are_left_alone(cpu_npu):
    assert torch.empty(2, device="meta").device.type == "meta"
    assert torch.zeros(2, device="cpu").device == CPU
    x = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(torch.einsum("ij->ji", x), x.T)  # strings that are not devices
    with pytest.raises(RuntimeError, match="npux"):  # not "npu[:i]": torch's own error
        torch.zeros(1, device="npux")


def test_torch_device_stand_in(cpu_npu):
    for made in (torch.device("npu"), torch.device("npu:0"), torch.device("npu", 0),
                 torch.device(type="npu", index=0), torch.device("npu", index=0)):
        assert type(made) is REAL_DEVICE and made == CPU
    # every other form is the real constructor's
    assert torch.device("cuda", 1) == REAL_DEVICE("cuda", 1)
    assert torch.device("cpu") == CPU and torch.device(CPU) == CPU
    assert isinstance(torch.zeros(1).device, torch.device)
    assert issubclass(REAL_DEVICE, torch.device) and torch.device == REAL_DEVICE
    assert hash(torch.device) == hash(REAL_DEVICE)
    assert REAL_DEVICE in {torch.device} and torch.device in {REAL_DEVICE}
    assert pickle.loads(pickle.dumps(torch.device("npu"))) == CPU
    for bad in ("npu:x", "npu:-1"):
        with pytest.raises(RuntimeError, match=f"torch.device\\('{bad}'\\): not an NPU device"):
            torch.device(bad)
    with pytest.raises(RuntimeError, match="not an NPU device"):
        torch.device("npu:0", 1)  # index given twice, as torch refuses for "cuda:0", 1


def test_int_only_device_is_the_npu(cpu_npu):
    # torch.device(i) is the accelerator's device i; on torch_npu the accelerator is the NPU
    assert torch.device(0) == CPU and torch.device(3) == CPU
    with pytest.raises(RuntimeError):
        torch.device(-1)


def test_restore_removes_mode_and_device_class():
    assert _mode_stack_len() == 0 and torch.device is REAL_DEVICE
    emulation = compat.emulate_npu("cpu")
    assert torch.device is not REAL_DEVICE and _mode_stack_len() == 1
    assert torch.ones(1, device="npu:0").device == CPU
    emulation.restore()
    assert torch.device is REAL_DEVICE and _mode_stack_len() == 0
    with pytest.raises(RuntimeError):
        torch.ones(1, device="npu")
    with pytest.raises(RuntimeError):
        torch.device("npu")


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen += 1
        return func(*args, **(kwargs or {}))


def test_restore_keeps_modes_pushed_above_the_emulation():
    emulation = compat.emulate_npu("cpu")
    recorder = _Recorder()
    recorder.__enter__()  # a mode the script left on the stack
    try:
        emulation.restore()
        assert _mode_stack_len() == 1  # the emulation's mode went, the script's stayed
        torch.ones(1)
        assert recorder.seen == 1
    finally:
        recorder.__exit__(None, None, None)
    assert _mode_stack_len() == 0


def test_restore_warns_when_its_mode_was_popped_by_other_code(torchair_log):
    emulation = compat.emulate_npu("cpu")
    torch._C._pop_torch_function_stack()  # what a careless script could do
    emulation.restore()
    assert torch.device is REAL_DEVICE and _mode_stack_len() == 0
    assert any("no longer on the torch-function mode stack" in r.getMessage()
               for r in torchair_log if r.levelno == logging.WARNING)


def test_npu_devices_inside_fullgraph_compile():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    backend = torchair.get_npu_backend(compiler_config=config)

    def fn(x):
        a = torch.ones(2, device=torch.device("npu", 0)) + torch.zeros(2, device="npu")
        b = torch.full((2,), 2.0, device="npu:0") * torch.arange(2, device=torch.device("npu:0"))
        assert isinstance(a.device, torch.device)
        return x.to("npu:0") + x.to(device="npu") + x.npu() + a + b

    x = torch.tensor([1.0, 2.0])
    for _ in range(2):  # a second emulation: Dynamo cached the first one's torch.device
        with compat.emulate_npu("cpu"):
            out = torch.compile(fn, backend=backend, fullgraph=True)(x)
        torch.testing.assert_close(out, 3 * x + 1 + torch.tensor([0.0, 2.0]))
        torch._dynamo.reset()


def test_traced_factories_reach_the_mode_where_dynamo_leaves_them_out(monkeypatch):
    """torch 2.11's Dynamo routes calls through torch-function modes only for its own set of
    overridable functions, which there lacks arange, tensor, randn, ... (eager calls the mode for
    them): the emulation adds them. Here 2.11's set is simulated on any PyTorch."""
    from torch._dynamo.variables import torch as dynamo_torch

    lacking = {torch.arange, torch.randn, torch.tensor, torch.linspace}
    as_in_211 = {f for f in dynamo_torch.get_overridable_functions() if f not in lacking}
    monkeypatch.setattr(dynamo_torch, "get_overridable_functions", lambda: as_in_211)

    def fn(x):
        return x + torch.arange(2, device="npu") + torch.tensor([1.0, 2.0], device="npu:0") \
            + torch.linspace(0, 1, 2, device="npu") + 0 * torch.randn(2, device="npu")

    with compat.emulate_npu("cpu"):
        out = torch.compile(fn, backend="eager", fullgraph=True)(torch.zeros(2))
        assert lacking <= as_in_211
    torch.testing.assert_close(out, torch.tensor([1.0, 4.0]))
    assert not lacking & as_in_211  # restore() takes out what the emulation added


def test_emulation_routes_factories_once_torch_compile_imports_dynamo():
    """The emulation does not import Dynamo (1.6 s); it wraps torch.compile until restored."""
    script = textwrap.dedent("""
        import sys, torch
        from torchair import compat
        from torchair.compat import _mode
        calls = []
        real_route = _mode.route_factories
        _mode.route_factories = lambda: calls.append(1) or real_route()
        real = torch.compile
        emulation = compat.emulate_npu("cpu")
        assert "torch._dynamo" not in sys.modules and torch.compile is not real
        fn = torch.compile(lambda x: x + torch.arange(2, device="npu"), backend="eager",
                           fullgraph=True)
        assert calls == [1]
        from torch._dynamo.variables.torch import get_overridable_functions
        assert torch.arange in get_overridable_functions()
        assert fn(torch.zeros(2)).tolist() == [0.0, 1.0]
        emulation.restore()
        assert torch.compile is real
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_dynamo_marker_the_device_class_relies_on():
    # _mode._mark_constant sets this marker itself when Dynamo is not imported yet
    assert torch._dynamo.assume_constant_result(lambda: 0)._dynamo_marked_constant is True


# --- streams and events on the CPU --------------------------------------------------------------

def test_cpu_streams(cpu_npu):
    npu = torch.npu
    default = npu.current_stream()
    assert default is npu.default_stream() and default.stream_id == 0
    s = npu.Stream()
    # not a torch.Stream: Dynamo would trace one as a device stream (test_streams_in_graphs.py)
    assert not isinstance(s, torch.Stream) and s.stream_id > 0 and s != default
    assert npu.Stream(device="npu:0", priority=-1).priority == -1
    with npu.stream(s):
        assert npu.current_stream() is s
        with npu.stream(None):
            assert npu.current_stream() is s
    assert npu.current_stream() is default
    npu.set_stream(s)
    assert npu.current_stream("npu:0") is s
    npu.set_stream(default)
    assert s.query() is True and s.synchronize() is None
    s.wait_stream(default)
    event = s.record_event()
    default.wait_event(event)
    torch.ones(2).record_stream(s)  # a no-op: the torch op refuses CPU tensors
    with pytest.raises(TypeError, match="must be a torch.npu.Event"):
        s.wait_event(s)
    with pytest.raises(ValueError, match="'tpu'"):
        npu.Stream(device="tpu")


def test_cpu_events_time_the_host(cpu_npu):
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record(torch.npu.current_stream())
    assert 15.0 <= start.elapsed_time(end) < 2000.0
    assert start.query() and end.synchronize() is None and end.wait() is None
    plain = torch.npu.Event(blocking=True, interprocess=False)
    plain.record()
    with pytest.raises(ValueError, match=r"created with argument 'enable_timing=True'"):
        start.elapsed_time(plain)
    with pytest.raises(ValueError, match="must be recorded before calculating elapsed time"):
        torch.npu.Event(enable_timing=True).elapsed_time(end)


# --- torch.npu functions, torch_npu.npu.utils, the Ascend switches -----------------------------

def test_cpu_device_functions(cpu_npu):
    npu = torch.npu
    assert npu.is_available() and npu.is_initialized() and npu.device_count() == 1
    npu.set_device("npu:0")
    assert npu.current_device() == 0
    with npu.device(0):
        pass
    npu.manual_seed(5)
    a = torch.randn(3, device="npu")
    npu.manual_seed_all(5)
    assert torch.equal(a, torch.randn(3)) and npu.initial_seed() == 5
    assert isinstance(npu.seed(), int)
    state = npu.get_rng_state()
    b = torch.rand(2)
    npu.set_rng_state(state)
    assert torch.equal(b, torch.rand(2))
    assert [npu.memory_allocated(), npu.max_memory_allocated(0), npu.memory_reserved("npu:0"),
            npu.max_memory_reserved()] == [0, 0, 0, 0]
    npu.reset_peak_memory_stats()
    npu.empty_cache()
    npu.synchronize()
    props = npu.get_device_properties(0)
    assert props.total_memory > 0 and props.multi_processor_count >= 1
    assert props.name == npu.get_device_name() and "emulated" in props.name
    with pytest.raises(ValueError, match="'tpu:0'"):
        npu.memory_allocated("tpu:0")


def test_utils_module(cpu_npu):
    import torch_npu.npu.utils as utils
    from torch_npu.npu import utils as same

    assert utils is same is torch.npu.utils
    assert utils.synchronize is torch.npu.synchronize and utils.stream is torch.npu.stream
    assert utils.current_stream() is torch.npu.current_stream()
    assert utils.get_cann_version() == "" and utils._is_gte_cann_version("8.0.RC1") is False
    with pytest.raises(compat.NotEmulatedError, match=r"torch_npu\.npu\.utils\.npu_check_overflow"):
        utils.npu_check_overflow(1.0)


def test_ascend_switches_are_stored_and_reported_once(cpu_npu, torchair_log):
    npu = torch.npu
    assert npu.config.allow_internal_format is False
    npu.config.allow_internal_format = True
    npu.config.allow_internal_format = True
    assert npu.config.allow_internal_format is True
    assert npu.matmul.allow_hf32 is False and npu.conv.allow_hf32 is True
    npu.matmul.allow_hf32 = True
    npu.set_option({"ACL_PRECISION_MODE": "must_keep_origin_dtype"})
    assert npu.is_jit_compile_false()
    npu.set_compile_mode(jit_compile=True)
    assert not npu.is_jit_compile_false()
    npu.set_mm_bmm_format_nd(False)
    assert npu.get_mm_bmm_format_nd() is False
    infos = [r.getMessage() for r in torchair_log if r.levelno == logging.INFO
             and "no effect off Ascend" in r.getMessage()]
    assert sum("allow_internal_format" in m for m in infos) == 1, infos  # once, not twice
    assert any("allow_hf32" in m for m in infos) and any("jit_compile" in m for m in infos)
    with pytest.raises(TypeError, match="option must be a dict"):
        npu.set_option("ACL_PRECISION_MODE")
    with pytest.raises(compat.NotEmulatedError, match=r"torch\.npu\.config\.nope"):
        _ = npu.config.nope
    assert not hasattr(npu.config, "nope")


# --- CUDA: torch.npu is torch.cuda ----------------------------------------------------------------

@pytest.mark.cuda
@needs_cuda
def test_cuda_devices_streams_events_memory():
    with compat.emulate_npu("cuda"):
        npu = torch.npu
        assert torch.ones(2, device="npu:0").device == REAL_DEVICE("cuda", 0)
        assert torch.device("npu", 0) == REAL_DEVICE("cuda", 0)
        assert torch.nn.Linear(2, 2).to(torch.device("npu", 0)).weight.is_cuda
        s = npu.Stream(device="npu:0")
        assert isinstance(s, torch.cuda.Stream)
        start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
        with npu.stream(s):
            assert torch.cuda.current_stream() == s
            start.record()
            x = torch.randn(256, 256, device="npu") @ torch.randn(256, 256, device="npu")
            end.record()
        npu.current_stream().wait_stream(s)
        x.record_stream(npu.current_stream())
        npu.synchronize()
        assert start.elapsed_time(end) >= 0.0
        assert npu.memory_allocated("npu:0") == torch.cuda.memory_allocated(0) > 0
        assert npu.get_device_name() == torch.cuda.get_device_name()
        with pytest.raises(ValueError, match="enable_timing=True"):
            npu.Event().elapsed_time(end)

        def fn(y):
            return y.to("npu:0") + torch.ones(2, device=torch.device("npu", 0))

        out = torch.compile(fn, backend="eager", fullgraph=True)(torch.zeros(2))
        assert out.is_cuda and torch.equal(out.cpu(), torch.ones(2))
