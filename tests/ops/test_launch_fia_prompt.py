"""``npu_fused_infer_attention_score`` prompt calls (any number of query tokens) in a CPU static
unit run on the C++ launch kernel ``torchair_native::fia_prompt``: each query token is a row of
the decode kernel with its own window of KV positions (the sparse mode's band, the lengths). The
op against eager FIA over layouts, caches, sparse modes, lengths and dtypes (NaN in every slot no
window reaches); in a unit: no Python op call per step, and FIA's own ValueError texts, in its
order, for bad lengths and block ids. atten_masks of sparse modes 0/1 that are the same for
every head are bound too (the kernel's per-row mask). Calls it does not compute exactly (a
per-head mask, an lse output) stay FIA calls."""
import itertools

import pytest
import torch

import torchair
from tests.ops._paging import block_table
from tests.ops._units import compile_static as _compile, op_calls as _op_calls, same_error
from torchair.ops.attention.cpu import launch_fakes as _fakes, launch_library as _launch

pytestmark = pytest.mark.skipif(not _launch.available(),
                                reason="needs the launch kernels (a C and a C++ compiler)")
FIA = torch.ops.npu.npu_fused_infer_attention_score
FIA_TWIN = torch.ops.npu.npu_fused_infer_attention_score_tensor
INT_MAX = 2**31 - 1
B, N, NKV, D, SQ, S, BS = 2, 8, 2, 32, 5, 48, 16


def _to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``[B, S, N, D]`` -> the layout's tensor (contiguous)."""
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], -1).contiguous()
    if layout == "BNSD":
        return x.transpose(1, 2).contiguous()
    return x.contiguous()


def _paged(cache: torch.Tensor, layout: str, table: torch.Tensor) -> torch.Tensor:
    """``[B, S, Nkv, D]`` into NaN-filled blocks named by ``table``: ``[blocks, BS, H]`` (BSH)
    or ``[blocks, Nkv, BS, D]`` (BNSD)."""
    blocks = torch.full((table.numel() + 3, BS, NKV, D), float("nan"), dtype=cache.dtype)
    for b in range(table.shape[0]):
        for c in range(table.shape[1]):
            blocks[int(table[b, c])] = cache[b, c * BS:(c + 1) * BS]
    if layout == "BSH":
        return blocks.reshape(blocks.shape[0], BS, -1)
    return blocks.transpose(1, 2).contiguous()


def _case(layout, paged_cache, dtype, kv_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = _to_layout(torch.randn(B, SQ, N, D, generator=g).to(dtype), layout)
    k, v = (torch.randn(B, S, NKV, D, generator=g).to(dtype) for _ in range(2))
    for b, n in enumerate(kv_lens):  # NaN past each length: never read
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    table = None
    if paged_cache:
        table = block_table(B, S, BS, torch.Generator().manual_seed(seed + 1))
        k, v = _paged(k, layout, table), _paged(v, layout, table)
    else:
        k, v = _to_layout(k, layout), _to_layout(v, layout)
    return q, k, v, table


def _kwargs(layout, table, mode, pre, nxt, q_lens, kv_lens):
    kw = dict(num_heads=N, num_key_value_heads=NKV, input_layout=layout, scale=0.17,
              sparse_mode=mode, pre_tokens=pre, next_tokens=nxt,
              actual_seq_lengths=torch.tensor(q_lens), actual_seq_lengths_kv=torch.tensor(kv_lens))
    if table is not None:
        kw.update(block_table=table, block_size=BS)
    return kw


def _op(q, k, v, kw, defer=False, mask=None):
    # the kernel applies the band it is given; mode 0 without a mask has none (the unit's binder
    # passes INT_MAX there, as FIA ignores pre/next then)
    band = (kw["pre_tokens"], kw["next_tokens"])
    if kw["sparse_mode"] == 0 and mask is None:
        band = (INT_MAX, INT_MAX)
    return _fakes.fia_prompt()(
        q, k, v, kw["actual_seq_lengths"], kw["actual_seq_lengths_kv"], kw.get("block_table"),
        N, NKV, _launch.LAYOUTS[kw["input_layout"]], kw.get("block_size", 0), kw["scale"],
        kw["sparse_mode"], *band, 0, 0, defer, mask)


_BANDS = {0: [(INT_MAX, INT_MAX), (2, 1), (0, 0), (-1, 3)], 2: [(INT_MAX, INT_MAX)],
          3: [(INT_MAX, INT_MAX)], 4: [(2, 0), (1, 3), (4, -2)]}
_LENGTHS = [([5, 3], [48, 20]), ([2, 7], [0, 33]), ([0, 5], [5, 60])]  # incl. q > S_q, kv > S


@pytest.mark.parametrize("layout,paged_cache", [("BSH", False), ("BNSD", False), ("BSND", False),
                                                ("BSH", True), ("BNSD", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_op_matches_eager_fia(layout, paged_cache, dtype):
    checked = 0
    for (mode, bands), (q_lens, kv_lens) in itertools.product(_BANDS.items(), _LENGTHS):
        q, k, v, table = _case(layout, paged_cache, dtype, [min(n, S) for n in kv_lens])
        for pre, nxt in bands:
            kw = _kwargs(layout, table, mode, pre, nxt, q_lens, kv_lens)
            want = FIA_TWIN(q, k, v, **kw)[0]
            got = _op(q, k, v, kw)
            assert got.shape == want.shape and got.dtype == want.dtype
            assert not got.isnan().any(), (mode, pre, nxt, q_lens, kv_lens)
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol,
                                       msg=lambda m: f"{mode} {pre} {nxt} {q_lens} {kv_lens}: {m}")
            checked += 1
    assert checked == 3 * (4 + 1 + 1 + 3)


def _assert_loop(got, q, k, v, keep_of):
    """``got`` (BSH, q/k/v of :func:`_case`, lengths [5, 3] / [48, 20]) against a per-token,
    per-head loop over plain softmax in float64 on the positions ``keep_of(b, i, sq, skv)``
    lists (none kept: zeros)."""
    got = got.view(B, SQ, N, D)
    qs, ks, vs = q.view(B, SQ, N, D), k.view(B, S, NKV, D), v.view(B, S, NKV, D)
    for b, (sq, skv) in enumerate(((5, 48), (3, 20))):
        for i in range(SQ):
            keep = keep_of(b, i, sq, skv) if i < sq else []
            for h in range(N):
                if not keep:
                    assert torch.equal(got[b, i, h], torch.zeros(D))
                    continue
                kk, vv = ks[b, keep, h // (N // NKV)], vs[b, keep, h // (N // NKV)]
                p = torch.softmax(kk.double() @ qs[b, i, h].double() * 0.17, dim=0)
                torch.testing.assert_close(got[b, i, h].double(), p @ vv.double(),
                                           atol=1e-5, rtol=1e-5)


def test_op_against_an_independent_loop():
    """The op's windows against a per-token loop over plain softmax (modes 3 and 4, BSH)."""
    q, k, v, _ = _case("BSH", False, torch.float32, [48, 20])
    for mode, pre, nxt in ((3, INT_MAX, INT_MAX), (4, 2, 1)):
        kw = _kwargs("BSH", None, mode, pre, nxt, [5, 3], [48, 20])

        def keep_of(b, i, sq, skv, mode=mode, pre=pre, nxt=nxt):
            diag = i + skv - sq
            return [j for j in range(skv) if j <= diag + (0 if mode == 3 else nxt)
                    and (mode == 3 or j >= diag - pre)]

        _assert_loop(_op(q, k, v, kw), q, k, v, keep_of)


def _mask(shape, dtype, seed, dropped=()):
    """A random atten_mask (about a third of the positions masked) of ``shape``; the KV positions
    in ``dropped`` masked in every row."""
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.35
    if dropped:
        m[..., list(dropped)] = True
    return m.to(dtype) if dtype != torch.bool else m


# the head-independent mask shapes FIA takes for a prompt (S_q > 1) call
_MASK_SHAPES = {"SqS": (SQ, S), "BSqS": (B, SQ, S), "1SqS": (1, SQ, S), "B1SqS": (B, 1, SQ, S),
                "11SqS": (1, 1, SQ, S), "B11S": (B, 1, 1, S), "B1S": (B, 1, S)}


@pytest.mark.parametrize("shape", list(_MASK_SHAPES), ids=list(_MASK_SHAPES))
@pytest.mark.parametrize("layout,paged_cache", [("BSH", False), ("BNSD", True)])
def test_op_with_a_mask_matches_eager_fia(shape, layout, paged_cache):
    """Modes 0 (with and without a band) and 1 with a mask that does not vary over heads, bool /
    uint8 / int8, float32 and bfloat16. The positions every row masks hold NaN in K and V; rows
    the mask drops entirely give zeros, as eager."""
    dropped = (7, 8, 30)
    checked = 0
    for dtype, mdtype in ((torch.float32, torch.bool), (torch.bfloat16, torch.uint8),
                          (torch.float32, torch.int8)):
        q, k, v, table = _case(layout, False, dtype, [S, S])
        if layout == "BNSD":
            q4, kk, vv = q, k.transpose(1, 2).clone(), v.transpose(1, 2).clone()
        else:
            q4, kk, vv = q, k.view(B, S, NKV, D).clone(), v.view(B, S, NKV, D).clone()
        kk[:, list(dropped)] = float("nan")
        vv[:, list(dropped)] = float("nan")
        if paged_cache:
            table = block_table(B, S, BS, torch.Generator().manual_seed(5))
            k, v = _paged(kk, layout, table), _paged(vv, layout, table)
        else:
            k, v = _to_layout(kk, layout), _to_layout(vv, layout)
        mask = _mask(_MASK_SHAPES[shape], mdtype, seed=checked, dropped=dropped)
        if shape == "SqS":
            mask[1] = True  # query row 1 attends to nothing: zeros
        for mode, pre, nxt in ((0, INT_MAX, INT_MAX), (0, 3, 1), (1, INT_MAX, INT_MAX)):
            for q_lens, kv_lens in (([5, 3], [48, 20]), ([2, 5], [31, 60])):
                kw = _kwargs(layout, table, mode, pre, nxt, q_lens, kv_lens)
                kw["atten_mask"] = mask
                want = FIA_TWIN(q4, k, v, **kw)[0]
                got = _op(q4, k, v, kw, mask=mask)
                assert not got.isnan().any(), (shape, mode, pre, nxt)
                tol = 1e-5 if dtype == torch.float32 else 1e-2
                torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol,
                                           msg=lambda m: f"{mode} {pre} {nxt} {q_lens}: {m}")
                checked += 1
    assert checked == 3 * 3 * 2


@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 1), (16, 1), (6, 2)],
                         ids=["G1", "G8", "G16", "G3"])
@pytest.mark.parametrize("sq", [1, 2, 7, 17, 33])
def test_group_sizes_and_token_counts_match_eager_fia(heads, kv_heads, sq):
    """Query heads per kv head from 1 to 16 and 1 to 33 query tokens, every sparse mode (masks
    in modes 0/1), against eager FIA (BSH, dense cache, NaN past each KV length and, for the
    masked calls, at a position the mask drops in every row)."""
    g = torch.Generator().manual_seed(sq * 31 + heads + kv_heads)
    s_kv, dim = 40, 32
    q = torch.randn(B, sq, heads * dim, generator=g)
    k, v = (torch.randn(B, s_kv, kv_heads * dim, generator=g) for _ in range(2))
    kv_lens, q_lens = [40, 23], [sq, max(sq - 2, 0)]
    for b, n in enumerate(kv_lens):
        k[b, n:] = v[b, n:] = float("nan")
    mask = _mask((sq, s_kv) if sq > 1 else (B, s_kv), torch.bool, seed=sq, dropped=(3,))
    k_dropped, v_dropped = k.clone(), v.clone()  # for the masked calls: NaN where all rows drop
    k_dropped[:, 3] = v_dropped[:, 3] = float("nan")
    for mode, pre, nxt, masked in ((3, INT_MAX, INT_MAX, False), (4, 3, 0, False),
                                   (0, 2, 5, True), (1, INT_MAX, INT_MAX, True),
                                   (2, INT_MAX, INT_MAX, False)):
        kw = dict(num_heads=heads, num_key_value_heads=kv_heads, input_layout="BSH", scale=0.2,
                  sparse_mode=mode, pre_tokens=pre, next_tokens=nxt,
                  actual_seq_lengths=torch.tensor(q_lens),
                  actual_seq_lengths_kv=torch.tensor(kv_lens))
        kk, vv = (k_dropped, v_dropped) if masked else (k, v)
        if masked:
            kw["atten_mask"] = mask
        want = FIA_TWIN(q, kk, vv, **kw)[0]
        got = _fakes.fia_prompt()(q, kk, vv, kw["actual_seq_lengths"], kw["actual_seq_lengths_kv"],
                                  None, heads, kv_heads, 0, 0, 0.2, mode, pre, nxt, 0, 0, False,
                                  mask if masked else None)
        assert got.is_contiguous() and got.shape == want.shape
        assert not got.isnan().any(), mode
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{mode}: {m}")


@pytest.mark.parametrize("bad", ["float", "batch", "rows", "last", "per-head"])
def test_the_op_refuses_a_mask_no_unit_binds(bad):
    """Called directly with a mask the AttentionBinder never passes (its FIA checks keep such calls
    on the general op, which raises eager's error), the op raises rather than guess."""
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    kw = _kwargs("BSH", None, 0, INT_MAX, INT_MAX, [5, 3], [48, 20])
    mask = {"float": torch.zeros(B, SQ, S), "batch": torch.zeros(B + 1, SQ, S, dtype=torch.bool),
            "rows": torch.zeros(B, SQ - 1, S, dtype=torch.bool),
            "last": torch.zeros(B, SQ, S + 1, dtype=torch.bool),
            "per-head": torch.zeros(B, N, SQ, S, dtype=torch.bool)}[bad]
    with pytest.raises(RuntimeError, match="torchair_native::fia_prompt: .*atten_mask"):
        _op(q, k, v, kw, mask=mask)


def test_op_with_a_mask_against_an_independent_loop():
    """Mode 1 (the mask alone) and mode 0 with a band, against a per-token loop over plain
    softmax in float64 (BSH, a [B, S_q, S] mask)."""
    q, k, v, _ = _case("BSH", False, torch.float32, [48, 20])
    mask = _mask((B, SQ, S), torch.bool, seed=11)
    for mode, pre, nxt in ((1, INT_MAX, INT_MAX), (0, 2, 4)):
        kw = _kwargs("BSH", None, mode, pre, nxt, [5, 3], [48, 20])

        def keep_of(b, i, sq, skv, mode=mode, pre=pre, nxt=nxt):
            return [j for j in range(skv) if not mask[b, i, j]
                    and (mode == 1 or i - pre <= j <= i + nxt)]

        _assert_loop(_op(q, k, v, kw, mask=mask), q, k, v, keep_of)


class _Prefill(torch.nn.Module):
    def __init__(self, paged_cache=False, mode=3, lse=False, mask=None):
        super().__init__()
        self.paged, self.mode, self.lse, self.mask = paged_cache, mode, lse, mask

    def forward(self, q, k, v, q_lens, kv_lens, table):
        kw = dict(num_heads=N, num_key_value_heads=NKV, input_layout="BSH", scale=0.17,
                  sparse_mode=self.mode, actual_seq_lengths=q_lens,
                  actual_seq_lengths_kv=kv_lens, softmax_lse_flag=self.lse)
        if self.mask is not None:
            kw["atten_mask"] = self.mask
        if self.paged:
            kw.update(block_table=table, block_size=BS)
        out, lse = FIA(q, k, v, **kw)
        return (out * 2, lse) if self.lse else out * 2


def _same_error(eager, compiled, *args):
    text = same_error(eager, compiled, *args)
    assert text.startswith("npu_fused_infer_attention_score: ")
    return text


@pytest.mark.parametrize("paged_cache", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("run_eagerly", [True, pytest.param(False, marks=pytest.mark.inductor)],
                         ids=["fx", "inductor"])
def test_prefill_unit_binds_the_launch_kernel(paged_cache, run_eagerly):
    q, k, v, table = _case("BSH", paged_cache, torch.float32, [S, S])
    module = _Prefill(paged_cache=paged_cache)
    compiled = _compile(module, (q, k, v, table), run_eagerly)
    with torch.no_grad():
        for q_lens, kv_lens in (([5, 3], [40, 17]), ([4, 5], [41, 18]), ([5, 5], [48, 1])):
            torch.testing.assert_close(compiled(q, k, v, q_lens, kv_lens, table),
                                       module(q, k, v, q_lens, kv_lens, table),
                                       atol=1e-5, rtol=1e-5)
        report = torchair.graph_reports()[-1]
        assert report.path == 4 and report.launch_kernels == 1, str(report)
        assert _op_calls(compiled, q, k, v, [5, 3], [40, 17], table) == {
            "torchair_native::fia_prompt"}
        text = _same_error(module, compiled, q, k, v, [5, 3], [40, -2], table)
        assert "actual_seq_lengths_kv[1]=-2" in text
        text = _same_error(module, compiled, q, k, v, [5, -1], [40, 17], table)
        assert "actual_seq_lengths[1]=-1" in text
        text = _same_error(module, compiled, q, k, v, [6, 3], [40, 17], table)  # > S_q
        assert "actual_seq_lengths[0]=6" in text
        # both bad: the general op names the KV lengths first
        text = _same_error(module, compiled, q, k, v, [-1, 3], [-3, 17], table)
        assert "actual_seq_lengths_kv[0]=-3" in text
        if paged_cache:
            bad = table.clone()
            bad[1, 0] = 10**6
            text = _same_error(module, compiled, q, k, v, [5, 3], [40, 17], bad)
            assert "block_table[1, 0] = 1000000" in text
            # longer than the block table (eager checks host lengths against it)
            text = _same_error(module, compiled, q, k, v, [5, 3], [40, S + 1], table)
            assert "block_table second dim" in text
            bad[1, 0], bad[1, 2] = table[1, 0], -1  # a column no window reaches: fine
            torch.testing.assert_close(compiled(q, k, v, [5, 3], [40, 17], bad),
                                       module(q, k, v, [5, 3], [40, 17], bad),
                                       atol=1e-5, rtol=1e-5)
        # after the errors, the unit serves again
        torch.testing.assert_close(compiled(q, k, v, [5, 3], [40, 17], table),
                                   module(q, k, v, [5, 3], [40, 17], table),
                                   atol=1e-5, rtol=1e-5)


class _MaskedPrefill(torch.nn.Module):
    """A prefill whose atten_mask is a call argument (a graph input of the unit)."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def forward(self, q, k, v, mask, q_lens, kv_lens):
        out = FIA(q, k, v, num_heads=N, num_key_value_heads=NKV, input_layout="BSH", scale=0.17,
                  sparse_mode=self.mode, atten_mask=mask, actual_seq_lengths=q_lens,
                  actual_seq_lengths_kv=kv_lens)[0]
        return out * 2


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("run_eagerly", [True, pytest.param(False, marks=pytest.mark.inductor)],
                         ids=["fx", "inductor"])
def test_prefill_unit_with_a_mask_binds_the_launch_kernel(mode, run_eagerly):
    """The mask's values change from call to call (same shape): each call uses its own (no value
    is baked into the unit), with NaN in K/V at the positions every row masks."""
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    kk, vv = k.view(B, S, NKV, D), v.view(B, S, NKV, D)
    kk[:, 9] = vv[:, 9] = float("nan")
    masks = [_mask((SQ, S), torch.bool, seed=s, dropped=(9,)) for s in range(3)]
    module = _MaskedPrefill(mode)
    compiled = _compile(module, (q, k, v, masks[0]), run_eagerly)
    with torch.no_grad():
        results = []
        for mask, (q_lens, kv_lens) in zip(masks, (([5, 3], [40, 17]), ([4, 5], [41, 18]),
                                                   ([5, 5], [48, 30]))):
            got = compiled(q, k, v, mask, q_lens, kv_lens)
            torch.testing.assert_close(got, module(q, k, v, mask, q_lens, kv_lens),
                                       atol=1e-5, rtol=1e-5)
            assert not got.isnan().any()
            results.append(got)
        # same lengths, another mask: another result (the unit reads the mask it is given)
        other = compiled(q, k, v, masks[1], [5, 3], [40, 17])
        assert not torch.allclose(other, results[0])
        torch.testing.assert_close(other, module(q, k, v, masks[1], [5, 3], [40, 17]),
                                   atol=1e-5, rtol=1e-5)
        report = torchair.graph_reports()[-1]
        assert report.path == 4 and report.launch_kernels == 1, str(report)
        assert _op_calls(compiled, q, k, v, masks[0], [5, 3], [40, 17]) == {
            "torchair_native::fia_prompt"}
        text = _same_error(module, compiled, q, k, v, masks[0], [5, 3], [40, -2])
        assert "actual_seq_lengths_kv[1]=-2" in text


@pytest.mark.parametrize("case", ["lse", "per-head-mask"])
def test_calls_the_kernel_does_not_compute_stay_fia(case):
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    mask = torch.rand(B, N, SQ, S, generator=torch.Generator().manual_seed(3)) < 0.3
    module = (_Prefill(lse=True) if case == "lse" else _Prefill(mode=0, mask=mask))
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        got, want = (compiled(q, k, v, [5, 3], [40, 17], None),
                     module(q, k, v, [5, 3], [40, 17], None))
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
            torch.testing.assert_close(a, b)
        report = torchair.graph_reports()[-1]
        calls = _op_calls(compiled, q, k, v, [5, 3], [40, 17], None)
    assert calls & {"npu::npu_fused_infer_attention_score_tensor",
                    "npu::npu_fused_infer_attention_score"}, calls
    assert "torchair_native::fia_prompt" not in calls
    assert report.launch_kernels == 0, str(report)


FIA_V2 = torch.ops.npu.npu_fused_infer_attention_score_v2


class _PrefillV2(torch.nn.Module):
    def __init__(self, layout="BSH", paged_cache=False):
        super().__init__()
        self.layout, self.paged = layout, paged_cache

    def forward(self, q, k, v, q_lens, kv_lens, table):
        kw = dict(num_query_heads=N, num_key_value_heads=NKV, input_layout=self.layout,
                  softmax_scale=0.17, sparse_mode=3, actual_seq_qlen=q_lens,
                  actual_seq_kvlen=kv_lens)
        if self.paged:
            kw.update(block_table=table, block_size=BS)
        return FIA_V2(q, k, v, **kw)[0] + 1


@pytest.mark.parametrize("paged_cache", [False, True], ids=["dense", "paged"])
def test_v2_prefill_binds_the_launch_kernel_with_v2_names(paged_cache):
    q, k, v, table = _case("BSH", paged_cache, torch.float32, [S, S])
    module = _PrefillV2(paged_cache=paged_cache)
    compiled = _compile(module, (q, k, v, table), True)
    with torch.no_grad():
        for q_lens, kv_lens in (([5, 3], [40, 17]), ([4, 5], [41, 18])):
            torch.testing.assert_close(compiled(q, k, v, q_lens, kv_lens, table),
                                       module(q, k, v, q_lens, kv_lens, table),
                                       atol=1e-5, rtol=1e-5)
        assert torchair.graph_reports()[-1].launch_kernels == 1
        assert _op_calls(compiled, q, k, v, [5, 3], [40, 17], table) == {
            "torchair_native::fia_prompt"}
        for q_lens, kv_lens, text in (([5, 3], [40, -2], "actual_seq_kvlen[1]=-2"),
                                      ([5, 6], [40, 17], "actual_seq_qlen[1]=6")):
            got = same_error(module, compiled, q, k, v, q_lens, kv_lens, table)
            assert got.startswith("npu_fused_infer_attention_score_v2: ") and text in got
        if paged_cache:
            got = same_error(module, compiled, q, k, v, [5, 3], [40, S + 1], table)
            assert "actual_seq_kvlen" in got


def test_v2_with_another_output_layout_stays_v2():
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    module = _PrefillV2(layout="BSH_BNSD")
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v, [5, 3], [40, 17], None),
                                   module(q, k, v, [5, 3], [40, 17], None))
        assert torchair.graph_reports()[-1].launch_kernels == 0
        calls = _op_calls(compiled, q, k, v, [5, 3], [40, 17], None)
    assert "torchair_native::fia_prompt" not in calls


class _TwoCalls(torch.nn.Module):
    """A bound FIA call, then one left to FIA's Python op (its lse is used)."""

    def forward(self, q, k, v, kv1, kv2):
        kw = dict(num_heads=N, num_key_value_heads=NKV, scale=0.3, sparse_mode=3)
        a = FIA(q, k, v, actual_seq_lengths_kv=kv1, **kw)[0]
        b, lse = FIA(q, k, v, actual_seq_lengths_kv=kv2, softmax_lse_flag=True, **kw)
        return a.sum() + b.sum() + lse.sum()


def test_a_deferred_error_comes_before_a_later_calls_error():
    """Eager raises at the first bad call; the unit must not let the later Python op's error
    (raised while the run goes on) replace the error the launch kernel kept."""
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    module = _TwoCalls()
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v, [20, 7], [30, 6]),
                                   module(q, k, v, [20, 7], [30, 6]))
        assert torchair.graph_reports()[-1].launch_kernels == 1
        text = _same_error(module, compiled, q, k, v, [20, -7], [-5, 6])
        assert "actual_seq_lengths_kv[1]=-7" in text
        # and the unit serves again (nothing kept for the next run)
        torch.testing.assert_close(compiled(q, k, v, [20, 7], [30, 6]),
                                   module(q, k, v, [20, 7], [30, 6]))


@pytest.mark.parametrize("which", ["q", "kv"])
def test_a_host_list_of_another_count_stays_the_general_ops(which):
    """A length list of neither B nor 1 entries: eager's ValueError, from the general op (the
    unit does not bind a call whose list count the op refuses)."""
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    q_lens, kv_lens = ([3, 2, 1], [20, 7]) if which == "q" else ([3, 2], [20, 7, 1])
    module = _Prefill()
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        text = _same_error(module, compiled, q, k, v, q_lens, kv_lens, None)
    assert "has 3 entries; expected B=2" in text
    assert torchair.graph_reports()[-1].launch_kernels == 0


@pytest.mark.parametrize("pre,nxt", [(0, 2**63 - 1), (2**63 - 1, 5), (-(2**62), 2**62)])
def test_bands_beyond_int32_do_not_overflow(pre, nxt):
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    kw = _kwargs("BSH", None, 4, pre, nxt, [5, 3], [48, 2])
    want = FIA_TWIN(q, k, v, **kw)[0]
    torch.testing.assert_close(_op(q, k, v, kw), want, atol=1e-5, rtol=1e-5)


def test_empty_query_or_kv_stays_the_general_ops():
    """S_q = 0 or S_kv = 0: whatever the general op does (here it raises), the unit does too."""
    g = torch.Generator().manual_seed(0)
    for sq, s in ((0, S), (SQ, 0)):
        q = torch.randn(B, sq, N * D, generator=g)
        k, v = torch.randn(B, s, NKV * D, generator=g), torch.randn(B, s, NKV * D, generator=g)
        module = _Prefill()
        compiled = _compile(module, (q, k, v), True)
        with torch.no_grad():
            try:
                want = module(q, k, v, [min(sq, 1)] * B, [0] * B, None)
            except Exception as exc:  # noqa: BLE001 - compared below
                with pytest.raises(type(exc)):
                    compiled(q, k, v, [min(sq, 1)] * B, [0] * B, None)
            else:
                torch.testing.assert_close(compiled(q, k, v, [min(sq, 1)] * B, [0] * B, None),
                                           want)
        reports = torchair.graph_reports()
        assert not reports or reports[-1].launch_kernels == 0


class _GeneralFirst(torch.nn.Module):
    """A FIA call left to FIA's Python op (its lse is used), then a bound one."""

    def forward(self, q, k, v, kv1, kv2):
        kw = dict(num_heads=N, num_key_value_heads=NKV, scale=0.3, sparse_mode=3)
        b, lse = FIA(q, k, v, actual_seq_lengths_kv=kv2, softmax_lse_flag=True, **kw)
        a = FIA(q, k, v, actual_seq_lengths_kv=kv1, **kw)[0]
        return a.sum() + b.sum() + lse.sum()


@pytest.mark.inductor
def test_inductor_units_raise_the_python_ops_error_as_eager():
    """Inductor's C++ wrapper turns a Python op's ValueError into a RuntimeError: the unit
    raises eager's ValueError. Inductor may run the bound call before an earlier op (it did
    here), so an error it kept does not replace the error the run raised."""
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    module = _GeneralFirst()
    compiled = _compile(module, (q, k, v), False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v, [20, 7], [30, 6]),
                                   module(q, k, v, [20, 7], [30, 6]))
        assert torchair.graph_reports()[-1].launch_kernels == 1
        text = _same_error(module, compiled, q, k, v, [20, 7], [-5, 6])  # the Python op's
        assert "actual_seq_lengths_kv[0]=-5" in text
        text = _same_error(module, compiled, q, k, v, [20, -7], [-5, 6])  # both: the first
        assert "actual_seq_lengths_kv[0]=-5" in text
        text = _same_error(module, compiled, q, k, v, [20, -7], [30, 6])  # the bound call's
        assert "actual_seq_lengths_kv[1]=-7" in text


def test_an_error_kept_outside_a_run_does_not_reach_the_next_run():
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    module = _Prefill()
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        want = module(q, k, v, [5, 3], [40, 17], None)
        torch.testing.assert_close(compiled(q, k, v, [5, 3], [40, 17], None), want,
                                   atol=1e-5, rtol=1e-5)
        kw = _kwargs("BSH", None, 3, INT_MAX, INT_MAX, [5, 3], [40, -1])
        _op(q, k, v, kw, defer=True)  # by hand, outside any unit: keeps an error
        assert _launch.pending().value
        torch.testing.assert_close(compiled(q, k, v, [5, 3], [40, 17], None), want,
                                   atol=1e-5, rtol=1e-5)
    assert _launch.take() is None


def test_threads_sharing_one_compiled_unit_get_their_own_results_and_errors():
    """A unit stages each call's lengths into its one sunk-scalar buffer: calls from several
    threads at once are serialized, so no thread reads another's lengths (before, about one
    run in five came back with the other thread's result or error)."""
    import threading

    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    module = _Prefill()
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        compiled(q, k, v, [5, 3], [40, 17], None)
        cases = {"a": ([5, 3], [40, 17]), "b": ([2, 5], [11, 30]), "bad": ([5, 3], [40, -2])}
        wants = {name: module(q, k, v, *lens, None) for name, lens in cases.items()
                 if name != "bad"}
    wrong = []

    def worker(name):
        with torch.no_grad():
            for _ in range(60):
                try:
                    got = compiled(q, k, v, *cases[name], None)
                except ValueError as exc:
                    if name != "bad" or "actual_seq_lengths_kv[1]=-2" not in str(exc):
                        wrong.append((name, str(exc)))
                    continue
                if name == "bad" or not torch.allclose(got, wants[name], atol=1e-5):
                    wrong.append((name, "result"))

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b", "bad", "a")]
    # each call of a torch.compile(dynamic=True) function sets Dynamo's process-wide
    # dynamic-shape options and puts back what it found; on torch 2.11 calls from several
    # threads at once can leave them set for the rest of the process (every later compile then
    # dynamic): the options are put back here after the threads
    dynamo = torch._dynamo.config
    with dynamo.patch(assume_static_by_default=dynamo.assume_static_by_default,
                      automatic_dynamic_shapes=dynamo.automatic_dynamic_shapes):
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not wrong, wrong[:5]


def test_an_empty_length_list_raises_eagers_error():
    """A constant length list (here empty) beside a symbolic one goes into the sunk buffer too:
    the twin takes tensors, and the unit raises eager's count error (before, a TypeError-like
    RuntimeError about a list where a tensor was expected)."""
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    module = _Prefill()
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        text = _same_error(module, compiled, q, k, v, [], [40, 17], None)
    assert "actual_seq_lengths has 0 entries" in text


def test_a_specialized_length_list_beside_a_symbolic_one():
    """Dynamo makes 0 and 1 constants: a query-length list of ones beside symbolic KV lengths
    (a decode-like first call) goes into the buffer as constants and the unit serves it."""
    q, k, v, _ = _case("BSH", False, torch.float32, [S, S])
    module = _Prefill()
    compiled = _compile(module, (q, k, v), True)
    with torch.no_grad():
        for kv_lens in ([40, 17], [41, 18]):
            torch.testing.assert_close(compiled(q, k, v, [1, 1], kv_lens, None),
                                       module(q, k, v, [1, 1], kv_lens, None),
                                       atol=1e-5, rtol=1e-5)
    assert torchair.graph_reports()[-1].launch_kernels == 1


@pytest.mark.inductor
def test_units_name_the_kernels_schema_in_inductors_code():
    """A unit's launch-kernel call carries a number naming the op's schema (launch_fakes.abi), so
    Inductor's cache key changes with the schema: code it cached for another argument count is
    never found again (the dispatcher would read past its arguments: a crash)."""
    from torch._inductor.utils import run_and_get_code

    q, k, v, table = _case("BSH", False, torch.float32, [S, S])
    compiled = _compile(_Prefill(), (q, k, v, table), False)
    with torch.no_grad():
        _, codes = run_and_get_code(lambda: compiled(q, k, v, [5, 3], [40, 17], table))
    abi = _fakes.abi(_fakes.fia_prompt())
    assert abi != 0 and abi != _fakes.abi(_fakes.ifa_decode())
    assert len(codes) == 1 and str(abi) in codes[0]
