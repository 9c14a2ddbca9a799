"""torchair.scope.npu_stream_switch / npu_wait_tensor (issue 7, item 5): the markers survive
Dynamo and AOT as node attributes, CPU results equal the plain model, the stream schedule (fork,
switch, event waits on crossing edges and npu_wait_tensor dependencies, join) is checked with the
CPU emulation of streams, stream-fusion=0 allows two streams per segment."""
from typing import ClassVar

import pytest
import torch
import torch.fx as fx

import torchair
from torchair.base.meta import PRIORITY_KEY, STREAM_KEY, WAITS_KEY
from torchair.core import recorder
from torchair.passes import StreamScopePass
from torchair.runtime import units
from torchair.scope._markers import STREAM_BEGIN, STREAM_END, WAIT
from torchair.scope._stream_runtime import EmulatedStreams, with_streams

npu = torch.ops.npu


def _config():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


def _two_streams(x, y):
    a = x.sin()
    with torchair.scope.npu_stream_switch("s1", 1):
        b = y.cos() * 2
        c = b + 1
    d = torchair.scope.npu_wait_tensor(a, c)
    e = d * 3
    return e + c, b


def _backend():
    return torchair.get_npu_backend(compiler_config=_config())


def _args():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)


def _aot_graph(fn, *args):
    """The optimized ATen graph the backend runs, and the backend's output."""
    graphs = []
    compiler = torchair.get_compiler(_config())

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def fw(aot_gm, aot_inputs):
            out = compiler(aot_gm, aot_inputs)
            graphs.append(aot_gm)
            return out
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return graphs[-1], out


# ------------------------------------------------------------------------------ API, eager

def test_public_names():
    assert torchair.scope.npu_stream_switch is not None
    assert torchair.scope.npu_wait_tensor is not None
    assert {"npu_stream_switch", "npu_wait_tensor", "super_kernel"} <= set(torchair.scope.__all__)


def test_eager_is_a_no_op():
    x, y = _args()
    t = torch.randn(3)
    assert torchair.scope.npu_wait_tensor(t, x) is t
    _, b = _two_streams(x, y)
    assert torch.equal(b, y.cos() * 2)


@pytest.mark.parametrize("call, error, match", [
    (lambda: torchair.scope.npu_stream_switch(1), TypeError, "stream_tag must be a str"),
    (lambda: torchair.scope.npu_stream_switch(""), ValueError, "1 to 255 characters"),
    (lambda: torchair.scope.npu_stream_switch("s", "0"), TypeError, "stream_priority must be"),
    (lambda: torchair.scope.npu_wait_tensor(1, torch.ones(1)), TypeError, "two tensors"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------------------------------------ through the backend

def test_markers_become_attributes_and_cpu_results_equal_eager():
    x, y = _args()
    gm, (e, b) = _aot_graph(_two_streams, x, y)
    ref_e, ref_b = _two_streams(x, y)
    assert torch.equal(e, ref_e) and torch.equal(b, ref_b)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert not [n for n in nodes.values() if n.target in (STREAM_BEGIN, STREAM_END, WAIT)]
    assert nodes["cos"].meta[STREAM_KEY] == "s1" and nodes["cos"].meta[PRIORITY_KEY] == 1
    assert nodes["add"].meta[STREAM_KEY] == "s1"
    assert STREAM_KEY not in nodes["sin"].meta and STREAM_KEY not in nodes["mul_1"].meta
    assert nodes["mul_1"].meta[WAITS_KEY] == [nodes["add"]]  # d * 3 waits for c
    report = torchair.graph_reports()[-1]
    # the stream pass reports its markers; the super_kernel pass found none, so is not listed
    assert report.passes["stream_scope"] == 3 and "super_kernel_scope" not in report.passes
    assert "stream_scope x3" in str(report) and "super_kernel_scope" not in str(report)
    assert report.launch == "one launch unit: one fixed-shape compiled call"  # CPU: unchanged


def _hand_graph(*items):
    graph = fx.Graph()
    value = graph.placeholder("x")
    for item in items:
        if item == "op":
            value = graph.call_function(torch.ops.aten.relu.default, (value,))
        elif item[0] == "b":
            graph.call_function(STREAM_BEGIN, (item[1], item[2] if len(item) > 2 else 0))
        else:
            graph.call_function(STREAM_END, (item[1],))
    graph.output(value)
    return fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("items, match", [
    ((("b", "s1"), "op"), r"npu_stream_switch 's1' is unpaired: its begin marker"),
    (("op", ("e", "s1")), r"npu_stream_switch 's1' is unpaired: its end marker .* no begin"),
    ((("b", "a"), ("b", "b"), "op", ("e", "a"), ("e", "b")), r"'a' is unpaired: .* 'b'"),
    ((("b", "s", 0), "op", ("e", "s"), ("b", "s", 2), "op", ("e", "s")),
     r"'s' is used with priority 0 .* and priority 2"),
], ids=["begin-without-end", "end-without-begin", "crossed", "two-priorities"])
def test_bad_stream_markers(items, match):
    with pytest.raises(ValueError, match=match):
        StreamScopePass()(_hand_graph(*items))


def test_nested_regions_innermost_wins():
    gm = _hand_graph(("b", "s1"), "op", ("b", "s2", 3), "op", ("e", "s2"), "op", ("e", "s1"),
                     "op")
    StreamScopePass()(gm)
    tags = [(n.meta.get(STREAM_KEY), n.meta.get(PRIORITY_KEY)) for n in gm.graph.nodes
            if n.op == "call_function"]
    assert tags == [("s1", 0), ("s2", 3), ("s1", 0), (None, None)]


# ------------------------------------------------------------------------------ stream-fusion

def _three_streams(options):
    def fn(x):
        with torchair.scope.super_kernel("sk", options):
            a = x.sin()
            with torchair.scope.npu_stream_switch("s1"):
                b = x.cos()
            with torchair.scope.npu_stream_switch("s2"):
                c = x.exp()
            return a + b + c
    return fn


def test_stream_fusion_0_allows_at_most_two_streams_per_segment():
    x = torch.randn(4)
    backend = torchair.get_npu_backend(compiler_config=_config())
    with pytest.raises(Exception, match=r"super_kernel scope 'sk': segment 1 .* runs on 3 streams "
                                        r"\(main, 's1', 's2'\).*'stream-fusion=1'"):
        torch.compile(_three_streams(""), backend=backend, fullgraph=True)(x)
    torch._dynamo.reset()
    out = torch.compile(_three_streams("stream-fusion=1"), backend=backend, fullgraph=True)(x)
    assert torch.equal(out, _three_streams("")(x))


def test_two_streams_are_fine_with_the_default():
    def fn(x):
        with torchair.scope.super_kernel("sk"):
            a = x.sin()
            with torchair.scope.npu_stream_switch("s1"):
                b = x.cos()
            return a * b

    x = torch.randn(4)
    out = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=_config()),
                        fullgraph=True)(x)
    assert torch.equal(out, fn(x))


# ------------------------------------------------------------------------------ the schedule

def test_schedule_on_emulated_streams():
    x, y = _args()
    gm, _ = _aot_graph(_two_streams, x, y)
    backend = EmulatedStreams()
    out = with_streams(gm, backend)(x, y)
    ref = _two_streams(x, y)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    log = backend.log
    assert log[0] == ("wait_stream", "s1", "main")  # fork
    assert log[-1] == ("wait_stream", "main", "s1")  # join
    ops = {entry[2]: entry[1] for entry in log if entry[0] == "op"}
    assert ops == {"sin": "main", "cos": "s1", "mul": "s1", "add": "s1", "mul_1": "main",
                   "add_1": "main"}
    # mul_1 (d * 3, npu_wait_tensor) waits for add's event before it runs, once
    record = log.index(next(e for e in log if e[0] == "record"))
    wait = log.index(next(e for e in log if e[0] == "wait"))
    assert log[record] == ("record", "s1", 1) and log[wait] == ("wait", "main", 1)
    assert record < wait < log.index(("op", "main", "mul_1"))
    assert sum(1 for e in log if e[0] == "wait") == 1
    assert backend.priorities == {"s1": 1}


def test_a_graph_without_streams_is_unchanged():
    gm = _hand_graph("op")
    assert with_streams(gm, EmulatedStreams()) is gm


def test_static_graph_with_streams_is_one_multi_stream_capture_emulated():
    x, y = _args()
    with units.capture_mode("emulate"), recorder.recording() as records:
        fn = torch.compile(_two_streams, backend=_backend(), fullgraph=True, dynamic=False)
        for _ in range(3):
            e, b = fn(x, y)
            ref_e, ref_b = _two_streams(x, y)
            assert torch.equal(e, ref_e) and torch.equal(b, ref_b)
    report = records[0].report
    assert report.launch == "one launch unit: captured replay (CPU emulation) on 2 streams"
    assert report.launches_per_step == 1
    unit = records[0].launch_unit
    (launcher,) = unit.launchers.values()
    assert len(launcher._captures) == 1
    ops = [e for e in unit.streams.log if e[0] == "op"]
    assert len(ops) == 6 * 3  # first run + two replays


def test_host_scheduled_segments_with_streams_emulated():
    def fn(x, k_cache, v_cache, lengths: list):
        with torchair.scope.super_kernel("sk"):
            q = x.sin()
            with torchair.scope.npu_stream_switch("side"):
                k = k_cache * 0.5
            attn = npu.npu_incre_flash_attention(q, k, v_cache, actual_seq_lengths=lengths,
                                                 num_heads=2, input_layout="BSH")
            out = attn.relu()
        return out + 1

    g = torch.Generator().manual_seed(2)
    args = [torch.randn(2, 1, 32, generator=g), torch.randn(2, 16, 32, generator=g),
            torch.randn(2, 16, 32, generator=g)]
    for t in args:
        torch._dynamo.mark_static(t)
    with units.capture_mode("emulate"), recorder.recording() as records:
        compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=_config()),
                                 fullgraph=True, dynamic=True)
        for lengths in ([3, 9], [16, 4]):
            torch.testing.assert_close(compiled(*args, lengths), fn(*args, lengths))
    report = records[0].report
    assert report.segments["sk"]["launch"] == [
        "one launch unit: captured replay (CPU emulation)"] * 2
    assert report.launch.endswith("on 2 streams")
    log = records[0].launch_unit.streams.log
    # the segment with the side-stream op forks and joins inside its capture
    assert ("wait_stream", "side", "main") in log and ("wait_stream", "main", "side") in log


# ------------------------------------------------------------------------------ CUDA

@pytest.mark.cuda
def test_cuda_streams_results_and_stream_pool():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torchair.scope._stream_runtime import CudaStreams

    x, y = (t.cuda() for t in _args())
    with recorder.recording() as records:
        fn = torch.compile(_two_streams, backend=_backend(), fullgraph=True, dynamic=False)
        for _ in range(3):
            e, b = fn(x, y)
            ref_e, ref_b = _two_streams(x, y)
            torch.testing.assert_close(e, ref_e)
            torch.testing.assert_close(b, ref_b)
    assert records[0].report.launch == "one launch unit: CUDA graph replay on 2 streams"
    stream = CudaStreams(x.device).stream("s1", 1)
    assert stream is CudaStreams(x.device).stream("s1", 1)  # one stream per tag
    assert stream != torch.cuda.current_stream()


@pytest.mark.cuda
def test_cuda_side_stream_ops_run_on_their_stream():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchair.scope._stream_runtime import CudaStreams

    class Spy(TorchDispatchMode):
        seen: ClassVar[list] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append((func.__name__, torch.cuda.current_stream().stream_id))
            return func(*args, **(kwargs or {}))

    x, y = (t.cuda() for t in _args())
    gm, _ = _aot_graph(_two_streams, *_args())
    streams = CudaStreams(x.device)
    main = torch.cuda.current_stream().stream_id
    with Spy():
        out = with_streams(gm, streams)(x, y)
    torch.cuda.synchronize()
    ref = _two_streams(x, y)
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1])
    where = dict(Spy.seen)
    side = streams.stream("s1", 1).stream_id
    assert where["cos.default"] == side and where["sin.default"] == main
    assert torch.cuda.current_stream().stream_id == main  # joined back
