"""Lengths that were host lists and were sunk into a static unit's buffer are checked as eager
checks host lists, also where the unit calls the op's tensor twin (CUDA units, no C++ compiler,
``TORCHAIR_NATIVE_KERNELS=0``): a paged block table too narrow or a cache with too few blocks
for the lengths, and FIA's query lengths above S_q, raise eager's ValueError (before, the twin
clamped the lengths and returned a result). Calls bound to a launch kernel check them in C++,
and the unit then runs no Python check for them."""
import pytest
import torch

import torchair
from tests.ops._paging import paged
from tests.ops._units import compile_static, same_error as _same_error
from torchair.runtime import staging

IFA = torch.ops.npu.npu_incre_flash_attention
FIA = torch.ops.npu.npu_fused_infer_attention_score
FIA_V2 = torch.ops.npu.npu_fused_infer_attention_score_v2


class _Step(torch.nn.Module):
    """One attention call of ``op``: paged (``table`` given, blocks of 16) or dense."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, q, k, v, q_lens, kv_lens, table=None):
        common = dict(num_key_value_heads=2, input_layout="BSH")
        if table is not None:
            common.update(block_table=table, block_size=16)
        if self.op == "ifa":
            return IFA(q, k, v, actual_seq_lengths=kv_lens, num_heads=8, scale_value=0.125,
                       **common) * 2
        if self.op == "fia":
            return FIA(q, k, v, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens,
                       num_heads=8, scale=0.125, sparse_mode=3, **common)[0] * 2
        return FIA_V2(q, k, v, actual_seq_qlen=q_lens, actual_seq_kvlen=kv_lens,
                      num_query_heads=8, softmax_scale=0.125, sparse_mode=3, **common)[0] * 2


def _inputs(sq):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, sq, 512, generator=g)
    k, v = torch.randn(3, 2, 64, 64, generator=g), torch.randn(3, 2, 64, 64, generator=g)
    kb, table = paged(k, 16, torch.Generator().manual_seed(1))
    vb = paged(v, 16, torch.Generator().manual_seed(1))[0]
    k = kb.permute(0, 2, 1, 3).reshape(kb.shape[0], 16, -1)
    v = vb.permute(0, 2, 1, 3).reshape(vb.shape[0], 16, -1)
    return q, k, v, table


@pytest.mark.parametrize("op", ["ifa", "fia", "v2"])
def test_the_twin_path_checks_host_lengths_as_eager(op, monkeypatch):
    monkeypatch.setenv("TORCHAIR_NATIVE_KERNELS", "0")  # the units call the tensor twins
    sq = 1 if op == "ifa" else 3
    q, k, v, table = _inputs(sq)
    module = _Step(op)
    compiled = compile_static(module, (q, k, v, table), True)
    q_ok = [sq] * 3
    with torch.no_grad():
        for kv in ([40, 3, 17], [41, 4, 18]):
            torch.testing.assert_close(compiled(q, k, v, q_ok, kv, table),
                                       module(q, k, v, q_ok, kv, table))
        assert torchair.graph_reports()[-1].launch_kernels == 0
        kv_name = {"ifa": "actual_seq_lengths", "fia": "actual_seq_lengths_kv",
                   "v2": "actual_seq_kvlen"}[op]
        text = _same_error(module, compiled, q, k, v, q_ok, [40, 3, 65], table)
        assert "block_table second dim 4" in text and f"max({kv_name})=65" in text
        text = _same_error(module, compiled, q, k, v, q_ok, [40, -3, 65], table)  # order
        assert f"{kv_name}[1]=-3" in text
        wide = torch.cat([table, table[:, :2]], dim=1)  # 6 columns; the cache has 15 blocks
        text = _same_error(module, compiled, q, k, v, q_ok, [96, 96, 64], wide)  # needs 16
        assert "KV cache blocknum 15" in text
        if op != "ifa":
            q_name = "actual_seq_lengths" if op == "fia" else "actual_seq_qlen"
            text = _same_error(module, compiled, q, k, v, [sq, sq + 1, sq], [40, 3, 17], table)
            assert f"{q_name}[1]={sq + 1} must be in [0, S_q={sq}]" in text
        torch.testing.assert_close(compiled(q, k, v, q_ok, [40, 3, 17], table),
                                   module(q, k, v, q_ok, [40, 3, 17], table))


def test_bound_calls_leave_no_python_check(monkeypatch):
    from torchair.ops.attention.cpu import launch_library as _launch

    if not _launch.available():
        pytest.skip("needs the launch kernels (a C and a C++ compiler)")
    seen = []
    stage = staging.SunkScalars.stage

    def counting(self, args):
        seen.append(len(self.checks))
        return stage(self, args)

    monkeypatch.setattr(staging.SunkScalars, "stage", counting)
    q, k, v, table = _inputs(3)
    module = _Step("fia")
    compiled = compile_static(module, (q, k, v, table), True)
    with torch.no_grad():
        for kv in ([40, 3, 17], [41, 4, 18], [42, 5, 19]):
            compiled(q, k, v, [3, 3, 3], kv, table)
    assert torchair.graph_reports()[-1].launch_kernels == 1
    assert seen[0] == 1 and seen[-1] == 0, seen  # the call's check until bound, then none


@pytest.mark.parametrize("op", ["ifa", "fia", "v2"])
def test_a_captured_unit_checks_sunk_lengths_on_the_host_with_eagers_text(op, monkeypatch):
    """A unit that captures its launch (here the CPU emulation of a CUDA graph) checks the sunk
    lengths on the host before each launch, negative ones too, with eager's text, and its replay
    captures no device flag for them (on a GPU: no device-to-host read after each replay)."""
    from torchair.ops import _device_checks
    from torchair.ops.attention import ifa_fast
    from torchair.runtime.units import capture_mode

    monkeypatch.setattr(ifa_fast, "ENABLED", False)  # IFA's general path, as on a GPU
    captured = []
    require_none = _device_checks.require_none

    def spy(bad, error):
        if _device_checks._capturing(bad):
            captured.append(bad.shape)
        return require_none(bad, error)

    monkeypatch.setattr(_device_checks, "require_none", spy)
    sq = 1 if op == "ifa" else 3
    q = _inputs(sq)[0]
    g = torch.Generator().manual_seed(2)
    dense_k, dense_v = torch.randn(3, 64, 128, generator=g), torch.randn(3, 64, 128, generator=g)
    module = _Step(op)
    q_ok = [sq] * 3
    kv_name = {"ifa": "actual_seq_lengths", "fia": "actual_seq_lengths_kv",
               "v2": "actual_seq_kvlen"}[op]
    with capture_mode("emulate"), torch.no_grad():
        compiled = compile_static(module, (q, dense_k, dense_v), True)
        for kv in ([40, 3, 17], [41, 4, 18], [42, 5, 19]):
            torch.testing.assert_close(compiled(q, dense_k, dense_v, q_ok, kv),
                                       module(q, dense_k, dense_v, q_ok, kv))
        assert "emulation" in torchair.graph_reports()[-1].launch
        assert captured == [], captured  # nothing captured for the host-checked lengths
        text = _same_error(module, compiled, q, dense_k, dense_v, q_ok, [40, -3, 17])
        assert text.endswith(f"{kv_name}[1]=-3 must be >= 0"), text
        if op != "ifa":
            q_name = "actual_seq_lengths" if op == "fia" else "actual_seq_qlen"
            text = _same_error(module, compiled, q, dense_k, dense_v, [sq, -1, sq], [40, 3, 17])
            assert f"{q_name}[1]=-1 must be in [0, S_q={sq}]" in text
        torch.testing.assert_close(compiled(q, dense_k, dense_v, q_ok, [43, 6, 20]),
                                   module(q, dense_k, dense_v, q_ok, [43, 6, 20]))
    assert captured == [], captured


def test_captured_checks_are_read_in_one_piece_in_their_order():
    """A capture concatenates its checks' summaries; one read raises the first failing check's
    error with its index, as reading them one by one does."""
    from torchair.ops import _device_checks

    with _device_checks.collect() as checks, _device_checks.emulating_capture():
        _device_checks.require_none(torch.tensor([False, False]), lambda i: ValueError(f"a{i}"))
        _device_checks.require_none(torch.tensor([False, False, True]),
                                    lambda i: ValueError(f"b{i}"))
        _device_checks.require_none(torch.tensor([True]), lambda i: ValueError(f"c{i}"))
    assert len(checks) == 3
    summaries = torch.cat([c.summary for c in checks])
    for how in ({}, {"summaries": summaries}):
        with pytest.raises(ValueError, match="^b2$"):
            _device_checks.raise_captured_errors(checks, **how)
    _device_checks.raise_captured_errors(checks[:1], summaries=summaries[:2])  # nothing bad
