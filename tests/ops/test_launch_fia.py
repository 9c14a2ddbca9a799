"""A CPU static unit binds ``npu_fused_infer_attention_score`` decode calls (one query token, no
mask, quantization, prefixes or lse output) to the C++ launch kernel: bit-identical to eager FIA,
no Python op call per step, and FIA's own ValueError texts for bad lengths and block ids. Calls
the kernel does not serve (an lse output, a mask) stay FIA calls; in a unit that also calls IFA
they go to ``torchair_native::fia_prompt`` (tests/ops/test_launch_fia_prompt.py)."""
import pytest
import torch

import torchair
from tests.ops._paging import paged
from tests.ops._units import compile_static as _compile, op_calls as _op_calls, same_error
from torchair.ops.attention.cpu import launch_library as _launch

pytestmark = pytest.mark.skipif(not _launch.available(),
                                reason="needs the launch kernels (a C and a C++ compiler)")
FIA = torch.ops.npu.npu_fused_infer_attention_score
IFA = torch.ops.npu.npu_incre_flash_attention


class _Step(torch.nn.Module):
    def __init__(self, lse=False, with_ifa=False, paged_cache=False):
        super().__init__()
        self.lse, self.with_ifa, self.paged = lse, with_ifa, paged_cache

    def forward(self, q, k, v, lens, table):
        kw = dict(num_heads=8, num_key_value_heads=2, input_layout="BSH", scale=0.125,
                  actual_seq_lengths_kv=lens)
        if self.paged:
            kw.update(block_table=table, block_size=16)
        out, lse = FIA(q, k, v, softmax_lse_flag=self.lse, **kw)
        if self.with_ifa:
            out = out + IFA(q, k, v, actual_seq_lengths=lens, num_heads=8, num_key_value_heads=2,
                            input_layout="BSH", scale_value=0.125,
                            **({"block_table": table, "block_size": 16} if self.paged else {}))
        return (out * 2, lse) if self.lse else out * 2


def _inputs(paged_cache, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 1, 512, generator=g)
    k = torch.randn(3, 2, 64, 64, generator=g)
    v = torch.randn(3, 2, 64, 64, generator=g)
    table = None
    if paged_cache:
        kb, table = paged(k, 16, torch.Generator().manual_seed(1))
        vb = paged(v, 16, torch.Generator().manual_seed(1))[0]
        k = kb.permute(0, 2, 1, 3).reshape(kb.shape[0], 16, -1)
        v = vb.permute(0, 2, 1, 3).reshape(vb.shape[0], 16, -1)
    else:
        k = k.transpose(1, 2).reshape(3, 64, -1).contiguous()
        v = v.transpose(1, 2).reshape(3, 64, -1).contiguous()
    return q, k, v, table


@pytest.mark.parametrize("paged_cache", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("run_eagerly", [True, pytest.param(False, marks=pytest.mark.inductor)],
                         ids=["fx", "inductor"])
def test_fia_decode_binds_the_launch_kernel(paged_cache, run_eagerly):
    q, k, v, table = _inputs(paged_cache)
    module = _Step(paged_cache=paged_cache)
    compiled = _compile(module, (q, k, v, table), run_eagerly)
    with torch.no_grad():
        for lens in ([40, 3, 17], [41, 4, 18], [64, 64, 1]):
            assert torch.equal(compiled(q, k, v, lens, table), module(q, k, v, lens, table))
        report = torchair.graph_reports()[-1]
        assert report.path == 4 and report.launch_kernels == 1, str(report)
        assert _op_calls(compiled, q, k, v, [40, 3, 17], table) == {"torchair_native::ifa_decode"}
        text = same_error(module, compiled, q, k, v, [40, 3, -1], table)
        assert "npu_fused_infer_attention_score" in text
        assert "actual_seq_lengths_kv[2]" in text
        if paged_cache:
            bad = table.clone()
            bad[1, 0] = 10**6
            same_error(module, compiled, q, k, v, [40, 3, 17], bad)
        assert torch.equal(compiled(q, k, v, [40, 3, 17], table),
                           module(q, k, v, [40, 3, 17], table))


@pytest.mark.parametrize("case", ["lse", "with-ifa"])
def test_calls_beside_ifa_or_with_lse(case):
    q, k, v, table = _inputs(False)
    module = _Step(lse=case == "lse", with_ifa=case == "with-ifa")
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        got, want = compiled(q, k, v, [40, 3, 17], None), module(q, k, v, [40, 3, 17], None)
        if case == "lse":
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        else:
            assert torch.equal(got, want)
        report = torchair.graph_reports()[-1]
        calls = _op_calls(compiled, q, k, v, [40, 3, 17], None)
    if case == "lse":
        assert "npu::npu_fused_infer_attention_score_tensor" in calls
        assert report.launch_kernels == 0, str(report)
    else:  # beside IFA, the FIA call goes to fia_prompt (worded as FIA itself), still exact
        assert calls == {"torchair_native::ifa_decode", "torchair_native::fia_prompt"}, calls
        assert report.launch_kernels == 2, str(report)


@pytest.mark.parametrize("op", ["ifa", "fia"])
def test_host_lengths_are_checked_against_the_block_table(op):
    """Host lengths longer than the block table, or needing more blocks than the cache has: eager
    raises (page attention's checks of host lengths); the unit raised nothing and attended a
    clamped window until the launch kernel learned which lengths were host lists."""
    q, k, v, table = _inputs(True)
    module = _Step(paged_cache=True, with_ifa=False) if op == "fia" else _IfaStep()
    in_order = torch.arange(12, dtype=torch.int32).view(3, 4)
    cases = [(k, v, table, [40, 3, 17], [40, 3, 65], "block_table second dim 4"),
             # 11 blocks, 3 sequences x 4 columns: the lengths need 12 blocks
             (k[:11], v[:11], in_order, [40, 3, 5], [64, 64, 64], "KV cache blocknum 11")]
    for kc, vc, tab, lens_ok, bad, text in cases:
        compiled = _compile(module, (q, kc, vc, tab), True)
        with torch.no_grad():
            assert torch.equal(compiled(q, kc, vc, lens_ok, tab), module(q, kc, vc, lens_ok, tab))
            assert torchair.graph_reports()[-1].launch_kernels == 1
            got = same_error(module, compiled, q, kc, vc, bad, tab)
        assert text in got
        assert ("actual_seq_lengths_kv" in got) == (op == "fia")


class _IfaStep(torch.nn.Module):
    def forward(self, q, k, v, lens, table):
        return IFA(q, k, v, actual_seq_lengths=lens, num_heads=8, num_key_value_heads=2,
                   input_layout="BSH", scale_value=0.125, block_table=table, block_size=16) * 2


def test_a_kv_list_of_another_count_raises_fias_error():
    """FIA decode calls bound as IFA: a list of neither B nor 1 entries stays FIA's call, so the
    error names FIA and actual_seq_lengths_kv (the IFA kernel's fallback named IFA)."""
    q, k, v, table = _inputs(False)
    module = _Step()
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        text = same_error(module, compiled, q, k, v, [40, 3], None)
    assert text.startswith("npu_fused_infer_attention_score: actual_seq_lengths_kv")
