"""``torch.npu`` streams and events inside compiled code: traced without graph breaks, ordering
no-ops on a CPU emulation (real CUDA streams and events on a CUDA one), results equal eager."""
from __future__ import annotations

import pytest
import torch

import torchair
from torchair import compat

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _step(side, outer_event, context_class=True):
    """A decode-style step that overlaps work on a side stream, as Ascend scripts write it.

    ``context_class=False`` leaves out ``torch.npu.StreamContext(s)``: on a CUDA emulation that is
    ``torch.cuda.StreamContext``, whose constructor Dynamo refuses to trace (PyTorch 2.11 marks it
    skipped); ``with torch.npu.stream(s)`` is the traceable spelling there."""
    def step(x, w):
        npu = torch.npu
        main = npu.current_stream()
        side.wait_stream(main)
        with npu.stream(side):
            h = torch.relu(x @ w)
            done = npu.Event()
            done.record()
        with (npu.StreamContext(side) if context_class else npu.stream(side)):
            h = h + 1
        main.wait_event(done)
        done.wait(main)
        outer_event.record(side)
        side.record_event()
        npu.current_stream().wait_stream(side)
        h.record_stream(side)
        return h * 2 + x.sum()
    return step


def _backend():
    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True
    return torchair.get_npu_backend(compiler_config=cfg)


def test_cpu_streams_and_events_trace_without_breaks():
    with compat.emulate_npu("cpu"):
        import torch_npu  # noqa: F401

        side, outer = torch.npu.Stream(), torch.npu.Event(enable_timing=True)
        step = _step(side, outer)
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(step)(x, w)
        assert explained.graph_count == 1 and explained.graph_break_count == 0, \
            [b.reason for b in explained.break_reasons]
        torch._dynamo.reset()
        compiled = torch.compile(step, backend=_backend(), fullgraph=True)
        for _ in range(2):
            x = torch.randn(4, 8)
            torch.testing.assert_close(compiled(x, w), step(x, w), rtol=0, atol=0)
        # the compiled call left the current stream as it found it
        assert torch.npu.current_stream() is torch.npu.default_stream()


def test_cpu_event_recorded_in_a_graph_has_no_timestamp():
    with compat.emulate_npu("cpu"):
        import torch_npu  # noqa: F401

        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)

        def f(x):
            start.record()
            y = x * 3
            end.record()
            return y

        torch._dynamo.reset()
        compiled = torch.compile(f, backend=_backend(), fullgraph=True)
        torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 3.0))
        with pytest.raises(ValueError, match="must be recorded"):
            start.elapsed_time(end)
        f(torch.ones(3))  # eagerly, the same events time the host
        assert start.elapsed_time(end) >= 0.0


def test_cpu_stream_checks_still_run_eagerly():
    with compat.emulate_npu("cpu"):
        import torch_npu  # noqa: F401

        with pytest.raises(TypeError, match="must be a torch.npu.Stream"):
            torch.npu.stream("side")
        with pytest.raises(TypeError, match="must be a torch.npu.Event"):
            torch.npu.current_stream().wait_event(torch.npu.current_stream())
        with pytest.raises(RuntimeError):  # torch's own method for a non-npu stream argument
            torch.ones(2).record_stream(object())


def test_cpu_streams_on_path_4_stay_one_static_unit():
    with compat.emulate_npu("cpu"):
        import torch_npu  # noqa: F401

        side = torch.npu.Stream()
        step = _step(side, torch.npu.Event())
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        torch._dynamo.reset()
        for t in (x, w):
            torch._dynamo.mark_static(t)
        cfg = torchair.CompilerConfig()
        cfg.debug.run_eagerly = True
        cfg.experimental_config.tiling_schedule_optimize = True
        before = len(torchair.graph_reports())
        compiled = torch.compile(step, backend=torchair.get_npu_backend(compiler_config=cfg),
                                 dynamic=True, fullgraph=True)
        torch.testing.assert_close(compiled(x, w), step(x, w), rtol=0, atol=0)
        reports = torchair.graph_reports()[before:]
        assert len(reports) == 1 and reports[0].build_static, str(reports[-1])


@needs_cuda
@pytest.mark.cuda
def test_cuda_streams_and_events_in_graphs():
    with compat.emulate_npu("cuda"):
        import torch_npu  # noqa: F401

        side, outer = torch.npu.Stream(), torch.npu.Event()
        step = _step(side, outer, context_class=False)
        x, w = torch.randn(64, 64, device="npu"), torch.randn(64, 64, device="npu")
        want = step(x, w)
        torch.cuda.synchronize()
        torch._dynamo.reset()
        compiled = torch.compile(step, backend=_backend(), fullgraph=True)
        got = compiled(x, w)
        torch.cuda.synchronize()
        torch.testing.assert_close(got, want)
        assert outer.query()
