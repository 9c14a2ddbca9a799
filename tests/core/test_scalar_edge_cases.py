"""Host scalars in odd shapes: sums, torch._check, lengths read from tensor data."""
import torch
import torch._dynamo

import torchair
from torchair.ops.attention.incre_flash_attention import incre_flash_attention_reference

B, S, H = 2, 16, 8


def _backend(tiling=True):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = tiling
    return torchair.get_npu_backend(compiler_config=config)


def _qkv():
    q, k, v = torch.randn(B, 1, H), torch.randn(B, S, H), torch.randn(B, S, H)
    for t in (q, k, v):
        torch._dynamo.mark_static(t)
    return q, k, v


def _attn(q, k, v, lengths):
    return torch.ops.npu.npu_incre_flash_attention(q, k, v, actual_seq_lengths=lengths,
                                                   num_heads=2)


def _run(fn, lengths_seq, expected):
    before = len(torchair.graph_reports())
    compiled = torch.compile(fn, backend=_backend(), dynamic=True, fullgraph=True)
    q, k, v = _qkv()
    with torch.no_grad():
        for lens in lengths_seq:
            torch.testing.assert_close(compiled(q, k, v, lens), expected(q, k, v, lens))
    return torchair.graph_reports()[before:]


def test_sum_of_lengths_is_sunk_and_evaluated_on_the_host():
    def fn(q, k, v, lens):
        return _attn(q, k, v, [min(sum(lens) + 1, S), lens[1]])

    def expected(q, k, v, lens):
        return incre_flash_attention_reference(q, k, v, num_heads=2,
                                               actual_seq_lengths=[min(sum(lens) + 1, S), lens[1]])

    reports = _run(fn, [[3, 5], [1, 2], [7, 9], [4, 4]], expected)
    assert len(reports) == 1 and reports[0].path == 4 and reports[0].build_static


def test_torch_check_on_a_length_keeps_path_4():
    def fn(q, k, v, lens):
        torch._check(lens[0] <= S)
        return _attn(q, k, v, lens)

    def expected(q, k, v, lens):
        return incre_flash_attention_reference(q, k, v, num_heads=2, actual_seq_lengths=lens)

    reports = _run(fn, [[3, 5], [6, 2], [16, 9]], expected)
    assert len(reports) == 1 and reports[0].build_static, reports[0].reasons


@torch._dynamo.config.patch(capture_scalar_outputs=True)
def test_lengths_read_from_a_tensor_in_the_graph_are_not_static():
    # (config.patch, not monkeypatch: undoing a monkeypatch of a torch config module deletes
    # the option on some pytest / torch versions, and every later compile then fails)
    def fn(q, k, v, lens_t):
        return _attn(q, k, v, lens_t.tolist())

    compiled = torch.compile(fn, backend=_backend(), dynamic=True, fullgraph=True)
    q, k, v = _qkv()
    lens_t = torch.tensor([3, 7])
    torch._dynamo.mark_static(lens_t)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        out = compiled(q, k, v, lens_t)
    torch.testing.assert_close(out, incre_flash_attention_reference(
        q, k, v, num_heads=2, actual_seq_lengths=[3, 7]))
    report = torchair.graph_reports()[before]
    assert not report.build_static
    assert any("reads tensor data on the host" in r for r in report.reasons), report.reasons
