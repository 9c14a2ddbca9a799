"""TorchAir's graph utilities in torchair.ops (issue 17, item 2): npu_print (TorchAir's output
format, eagerly and inside compiled graphs), tagged events and streams, record / wait, with
TorchAir's error types and texts."""
import pytest
import torch

import torchair
from torchair import ops

npu = torch.ops.npu


def _backend():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return torchair.get_npu_backend(compiler_config=config)


def _compile(fn):
    return torch.compile(fn, backend=_backend(), fullgraph=True)


# ------------------------------------------------------------------------------ npu_print

def test_print_doc_examples(capsys):
    v = torch.arange(10)
    out = ops.npu_print("hello, tensor:", v)
    assert out[0] is v and len(out) == 1
    ops.npu_print("hello, tensor_detail:", v, tensor_detail=True)
    assert capsys.readouterr().out.splitlines() == [
        "hello, tensor: [0 1 2 ... 7 8 9]",
        "hello, tensor_detail: tensor([0 1 2 ... 7 8 9], shape=[10], dtype=torch.int64)"]


def test_print_summaries(capsys):
    ops.npu_print("m", torch.arange(100).view(10, 10), summarize_size=2)
    ops.npu_print("all", torch.arange(7), summarize_size=-1)
    ops.npu_print("short", torch.arange(6))  # 6 <= 2 * 3: every entry
    ops.npu_print("f", torch.tensor([1.0, 0.5, -2.25, 0.1]), "h", torch.tensor([0.1]).half())
    ops.npu_print("bf16", torch.tensor([1.5, 3.0], dtype=torch.bfloat16), "b",
                  torch.tensor([True, False]), "n", 3, 2.5, True)
    ops.npu_print("0-d", torch.tensor(4.0), "empty", torch.zeros(0))
    assert capsys.readouterr().out == (
        "m [[0 1 ... 8 9]\n [10 11 ... 18 19]\n ...\n [80 81 ... 88 89]\n [90 91 ... 98 99]]\n"
        "all [0 1 2 3 4 5 6]\n"
        "short [0 1 2 3 4 5]\n"
        "f [1 0.5 -2.25 0.1] h [0.1]\n"
        "bf16 [1.5 3] b [True False] n 3 2.5 True\n"
        "0-d 4 empty []\n")


def test_print_placeholder_text_is_kept(capsys):
    ops.npu_print("a {} b {0}", torch.tensor([1]), "c", torch.tensor([2]))
    assert capsys.readouterr().out == "a {} b {0} [1] c [2]\n"


def test_print_errors():
    x = torch.ones(2)
    for bad in (0, -2):
        with pytest.raises(ValueError, match=f"summarize_size must be positive or -1 for all "
                                             f"elements, got {bad}"):
            ops.npu_print(x, summarize_size=bad)
    with pytest.raises(RuntimeError, match="print op requires at least one tensor"):
        ops.npu_print("no tensor", 1)
    with pytest.raises(TypeError, match="complex64 tensor, which cannot be printed"):
        ops.npu_print(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="argument 1 is a list"):
        ops.npu_print(x, [1])
    with pytest.raises(TypeError, match="tensor_detail must be a bool"):
        ops.npu_print(x, tensor_detail=1)


def test_print_in_a_compiled_graph_prints_every_call(capsys):
    def step(x, y):
        z = x * 2
        z, _ = ops.npu_print("z:", z, "y:", y, summarize_size=1)
        return z + y

    compiled = _compile(step)
    x, y = torch.ones(4), torch.arange(4.0)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, y), step(x, y))
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["z: [2 ... 2] y: [0 ... 3]"] * 4  # 2 compiled calls + 2 eager references
    report = torchair.graph_reports()[-1]
    assert not report.build_static
    assert any("npu.npu_print" in r and "reads tensor data on the host" in r
               for r in report.reasons)


# ------------------------------------------------------------------------------ tagged events

@pytest.fixture
def tag(request):
    name = f"test_{request.node.name}"
    yield name
    from torchair.ops import _events

    _events._events.pop(name, None)


def test_tagged_event_create_errors(tag):
    event = ops.npu_create_tagged_event(tag)
    assert isinstance(event, ops.TaggedEvent) and event.tag == tag and event.query()
    with pytest.raises(ValueError, match=f"tagged event tag {tag} is already in use"):
        ops.npu_create_tagged_event(tag)
    with pytest.raises(TypeError, match="the tag must be a str"):
        ops.npu_create_tagged_event(1)
    with pytest.raises(ValueError, match="tagged event .* is not in use"):
        ops.npu_tagged_event_record(ops.TaggedEvent("never_created"))
    with pytest.raises(ValueError, match="tagged event object is not in use"):
        ops.npu_tagged_event_wait("object")
    with pytest.raises(AssertionError, match="tagged event is None while tag is nope"):
        npu.npu_tagged_event_record("nope")


def test_tagged_events_eager_and_compiled(tag):
    event = ops.npu_create_tagged_event(tag)

    def fn(x):
        y = x + 1
        ops.npu_tagged_event_record(event)
        ops.npu_tagged_event_wait(event)
        ops.npu_record_tagged_stream(y, "s1")
        ops.npu_record_tagged_stream(y, "default")
        return y * 2

    x = torch.randn(3)
    torch.testing.assert_close(fn(x), (x + 1) * 2)
    assert event.recorded == 1
    compiled = _compile(fn)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), (x + 1) * 2)
    assert event.recorded == 3  # the graph records on every call
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        ops.npu_record_tagged_stream([1], "s1")
    with pytest.raises(ValueError, match="the tag must be a non-empty str"):
        ops.npu_record_tagged_stream(x, "")


def test_create_inside_a_compiled_function_is_refused(tag):
    def fn(x):
        ops.npu_create_tagged_event(tag)
        return x + 1

    with pytest.raises(Exception, match="create the event once outside it"):
        _compile(fn)(torch.ones(2))


# ------------------------------------------------------------------------------ record / wait

def test_record_wait_errors_and_eager():
    rec = ops.record()
    assert isinstance(rec, torch.Tensor) and rec.numel() == 0
    assert ops.wait([rec]) is None
    for bad in (None, []):
        with pytest.raises(ValueError, match=r"torchair.ops.wait\(\) requires at least one "
                                             r"tensor input"):
            ops.wait(bad)
    with pytest.raises(ValueError, match=r"arguments of torchair.ops.wait\(\) must be "
                                         r"torch.Tensor"):
        ops.wait([rec, 1])


def test_record_wait_across_a_stream_switch_in_a_graph():
    def fn(x):
        with torchair.scope.npu_stream_switch("1"):
            y = x.sin()
            rec = ops.record()
        ops.wait([rec])
        return y + x

    x = torch.randn(5)
    torch.testing.assert_close(_compile(fn)(x), x.sin() + x)
