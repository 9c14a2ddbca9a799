"""npu_kv_rmsnorm_rope_cache (DeepSeek MLA): the reference against independent formulas (RMS
norm in float64, the rope part as complex multiplication), the eager kernel (no host reads)
against the reference in the Norm and paged modes, in-place aliasing, fake shapes, errors, and a
compiled run through torchair's backend."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.rope.kv_rmsnorm_rope_cache import kv_rmsnorm_rope_cache_reference

OP = torch.ops.npu.npu_kv_rmsnorm_rope_cache
FUNCTIONAL = torch.ops.npu.npu_kv_rmsnorm_rope_cache_functional
DV, DK, EPS = 32, 16, 1e-5


def _inputs(b, s, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(b, 1, s, DV + DK, generator=g).to(dtype)
    gamma = (torch.rand(DV, generator=g) + 0.5).to(dtype)
    theta = torch.rand(b, 1, s, DK // 2, generator=g, dtype=torch.float64) * 6
    cos = torch.cat((theta.cos(), theta.cos()), -1).to(dtype)
    sin = torch.cat((theta.sin(), theta.sin()), -1).to(dtype)
    return kv, gamma, cos, sin, theta


def _paged_caches(dtype, blocks=4, block_size=8):
    return (torch.randn(blocks, block_size, 1, DK).to(dtype),
            torch.randn(blocks, block_size, 1, DV).to(dtype))


def _formula(kv, gamma, theta):
    """float64: RMS norm of kv[..., :Dv]; kv[..., Dv:] as complex pairs (even + i odd) times
    e^(i theta), stored as [real parts, imaginary parts]."""
    x = kv.double()
    c = x[..., :DV]
    c_kv = c / torch.sqrt((c * c).mean(-1, keepdim=True) + EPS) * gamma.double()
    z = torch.view_as_complex(x[..., DV:].reshape(*x.shape[:-1], DK // 2, 2).contiguous())
    rot = z * torch.polar(torch.ones_like(theta), theta)
    return torch.cat((rot.real, rot.imag), -1), c_kv


@pytest.mark.parametrize("mode", ["PA", "PA_BNSD"])
def test_reference_paged_matches_formula_and_slots(mode):
    kv, gamma, cos, sin, theta = _inputs(3, 2)
    k_cache, ckv_cache = _paged_caches(torch.float32)
    index = torch.tensor([5, -1, 17, 8, 31, 0])  # token 1 is not written
    kc, cc, k_rope, c_kv = kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, index, k_cache,
                                                           ckv_cache, cache_mode=mode)
    want_rope, want_ckv = _formula(kv, gamma, theta)
    torch.testing.assert_close(k_rope.double(), want_rope, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_kv.double(), want_ckv, rtol=1e-5, atol=1e-5)
    flat_k, flat_c = kc.reshape(-1, DK), cc.reshape(-1, DV)
    written = set()
    for t, slot in enumerate(index.tolist()):
        if slot >= 0:
            assert torch.equal(flat_k[slot], k_rope.reshape(-1, DK)[t])
            assert torch.equal(flat_c[slot], c_kv.reshape(-1, DV)[t])
            written.add(slot)
    keep = [i for i in range(flat_k.shape[0]) if i not in written]
    assert torch.equal(flat_k[keep], k_cache.reshape(-1, DK)[keep])
    assert torch.equal(flat_c[keep], ckv_cache.reshape(-1, DV)[keep])


def test_reference_norm_mode_writes_per_batch_positions():
    kv, gamma, cos, sin, _ = _inputs(2, 3, seed=1)
    k_cache, ckv_cache = torch.zeros(2, 1, 6, DK), torch.zeros(2, 1, 6, DV)
    index = torch.tensor([[0, 4, -1], [4, 1, 5]])  # the same position in two batches is fine
    kc, cc, k_rope, c_kv = kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, index, k_cache,
                                                           ckv_cache, cache_mode="Norm")
    for bi in range(2):
        for si in range(3):
            pos = int(index[bi, si])
            if pos >= 0:
                assert torch.equal(kc[bi, 0, pos], k_rope[bi, 0, si])
                assert torch.equal(cc[bi, 0, pos], c_kv[bi, 0, si])
    assert int((kc.abs().sum(-1) > 0).sum()) == 5 and float(k_cache.abs().sum()) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode,index", [
    ("PA", [3, 30, -1, 12, 7, 0]), ("PA_BNSD", [-1, -1, -1, -1, -1, -1]),
    ("Norm", [[2, -1, 0], [1, 5, 3]])])
def test_eager_in_place_matches_reference(dtype, mode, index):
    kv, gamma, cos, sin, _ = _inputs(2, 3, dtype, seed=2)
    index = torch.tensor(index)
    if mode == "Norm":
        k_cache, ckv_cache = torch.randn(2, 1, 6, DK).to(dtype), torch.randn(2, 1, 6, DV).to(dtype)
    else:
        k_cache, ckv_cache = _paged_caches(dtype)
    want = kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                           epsilon=EPS, cache_mode=mode)
    f_out = FUNCTIONAL(kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode=mode)
    out = OP(kv, gamma, cos, sin, index, k_cache, ckv_cache, epsilon=EPS, cache_mode=mode,
             is_output_kv=True)
    assert out[0] is k_cache and out[1] is ckv_cache  # the caches, written in place
    tol = dict(rtol=2 ** -22 if dtype == torch.float32 else 2 ** -7, atol=1e-6)
    for got, ref, f in zip(out, want, f_out):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        torch.testing.assert_close(got.float(), ref.float(), **tol)
        assert torch.equal(f, got)


def test_fake_kernel_shapes():
    with FakeTensorMode():
        kv = torch.empty(8, 1, 1, 576, dtype=torch.bfloat16)
        gamma = torch.empty(512, dtype=torch.bfloat16)
        cos = torch.empty(8, 1, 1, 64, dtype=torch.bfloat16)
        k_cache = torch.empty(16, 128, 1, 64, dtype=torch.bfloat16)
        ckv_cache = torch.empty(16, 128, 1, 512, dtype=torch.bfloat16)
        index = torch.empty(8, dtype=torch.int64)
        kc, cc, k_rope, c_kv = OP(kv, gamma, cos, cos, index, k_cache, ckv_cache, cache_mode="PA")
        assert kc.shape == k_cache.shape and cc.shape == ckv_cache.shape
        assert k_rope.shape == (8, 1, 1, 64) and c_kv.shape == (8, 1, 1, 512)
        f = FUNCTIONAL(kv, gamma, cos, cos, index, k_cache, ckv_cache, cache_mode="PA")
        assert f[0].shape == k_cache.shape and f[1].shape == ckv_cache.shape


def _call(**over):
    kv, gamma, cos, sin, _ = _inputs(2, 3)
    k_cache, ckv_cache = _paged_caches(torch.float32)
    args = dict(kv=kv, gamma=gamma, cos=cos, sin=sin, index=torch.arange(6), k_cache=k_cache,
                ckv_cache=ckv_cache, cache_mode="PA")
    args.update(over)
    pos = [args.pop(k) for k in ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")]
    return OP(*pos, **args)


@pytest.mark.parametrize("over,exc,match", [
    (dict(cache_mode="PA_NZ"), NotImplementedError, "cache_mode='PA_NZ' is not implemented"),
    (dict(cache_mode="PA_BLK_BNSD"), NotImplementedError, "cache_mode='PA_BLK_BNSD'"),
    (dict(cache_mode="paged"), ValueError, "cache_mode='paged' is unknown"),
    (dict(k_rope_scale=torch.ones(1)), NotImplementedError, "k_rope_scale is not supported"),
    (dict(c_kv_offset=torch.ones(1)), NotImplementedError, "c_kv_offset is not supported"),
    (dict(v=torch.ones(2, 1, 3, 8)), NotImplementedError, "v is not supported"),
    (dict(k_cache=torch.zeros(4, 8, 1, DK, dtype=torch.int8)), NotImplementedError,
     "k_cache is int8"),
    (dict(kv=torch.randn(2, 2, 3, DV + DK)), ValueError, r"kv has shape \[2, 2, 3, 48\]"),
    (dict(gamma=torch.ones(DV + DK)), ValueError, "gamma has shape"),
    (dict(gamma=torch.ones(DV + 1)), ValueError, "Dk = D - Dv = 48 - 33 = 15"),
    (dict(cos=torch.randn(2, 1, 3, 8), sin=torch.randn(2, 1, 3, 8)), ValueError,
     "cos has shape"),
    (dict(index=torch.arange(5)), ValueError, r"index has shape \[5\]"),
    (dict(index=torch.arange(6.0)), TypeError, "index has dtype"),
    (dict(ckv_cache=torch.randn(4, 8, 1, DK)), ValueError, "ckv_cache has shape"),
    (dict(k_cache=torch.randn(4, 8, 1, DK, dtype=torch.float16)), TypeError,
     "k_cache has dtype"),
    (dict(cache_mode="Norm"), ValueError, "k_cache has shape .* cache_mode='Norm'"),
])
def test_errors_name_the_argument(over, exc, match):
    with pytest.raises(exc, match=match):
        _call(**over)


class _ExecKv(torch.nn.Module):
    """vllm-ascend's TorchAir MLA exec_kv: project, view [B, 1, 1, D], normalize / rotate and
    write into paged caches (graph inputs), then read the caches."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(24, DV + DK, bias=False)
        self.gamma = torch.nn.Parameter(torch.rand(DV) + 0.5)

    def forward(self, h, cos, sin, slots, k_cache, ckv_cache):
        kv = self.proj(h).view(h.shape[0], 1, 1, DV + DK)
        k_pe, k_nope, _, _ = OP(kv, self.gamma, cos, sin, slots, k_cache, ckv_cache,
                                epsilon=EPS, cache_mode="PA")
        return k_pe.sum() + k_nope.sum()


def test_compiled_fx_engine_equals_eager_and_writes_the_caches():
    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True
    model = _ExecKv()
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=cfg),
                             fullgraph=True)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for step in range(2):
            h = torch.randn(3, 24, generator=g)
            theta = torch.rand(3, 1, 1, DK // 2, generator=g)
            cos = torch.cat((theta.cos(), theta.cos()), -1)
            sin = torch.cat((theta.sin(), theta.sin()), -1)
            slots = torch.tensor([step, 9 + step, 20 + step])
            caches = _paged_caches(torch.float32)
            eager_caches = [c.clone() for c in caches]
            got = compiled(h, cos, sin, slots, *caches)
            want = model(h, cos, sin, slots, *eager_caches)
            assert torch.equal(got, want)
            assert torch.equal(caches[0], eager_caches[0])
            assert torch.equal(caches[1], eager_caches[1])
            assert not torch.equal(caches[0], _paged_caches(torch.float32)[0])
