"""Under the torch_npu emulation, scripts call the rope / SwiGLU / MLA-cache ops as on Ascend."""
import torch
import torch.nn.functional as F

from torchair import compat


def test_torch_npu_swiglu_rope_and_mla_cache_ops():
    with compat.emulate_npu("cpu"):
        import torch_npu

        x = torch.randn(4, 2 * 24).npu()
        a, b = torch.chunk(x, 2, dim=-1)
        torch.testing.assert_close(torch_npu.npu_swiglu(x), F.silu(a) * b)
        assert torch_npu.npu_swiglu is torch.ops.npu.npu_swiglu

        # vllm-ascend's TorchAir decode rope: [T, 1, N, D] with cos / sin [T, 1, 1, D]
        q, k = torch.randn(3, 1, 4, 16).npu(), torch.randn(3, 1, 2, 16).npu()
        cos, sin = torch.randn(3, 1, 1, 16).npu(), torch.randn(3, 1, 1, 16).npu()
        q0 = q.clone()
        q_embed, k_embed = torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)
        assert q_embed is q and k_embed is k
        h1, h2 = torch.chunk(q0, 2, dim=-1)
        torch.testing.assert_close(q, q0 * cos + torch.cat((-h2, h1), dim=-1) * sin)
        torch.testing.assert_close(torch_npu.npu_rotary_mul(q0, cos, sin), q)

        kv = torch.randn(2, 1, 1, 32 + 8).npu()
        k_cache, ckv_cache = torch.zeros(2, 4, 1, 8).npu(), torch.zeros(2, 4, 1, 32).npu()
        k_pe, k_nope, _, _ = torch_npu.npu_kv_rmsnorm_rope_cache(
            kv, torch.ones(32).npu(), torch.ones(2, 1, 1, 8).npu(), torch.zeros(2, 1, 1, 8).npu(),
            torch.tensor([5, 2]).npu(), k_cache, ckv_cache, epsilon=1e-6, cache_mode="PA")
        assert k_pe is k_cache and k_nope is ckv_cache
        r = kv[0, 0, 0, 32:]
        torch.testing.assert_close(k_cache[1, 1, 0], torch.cat((r[0::2], r[1::2])))  # slot 5
        c = kv[1, 0, 0, :32]
        torch.testing.assert_close(ckv_cache[0, 2, 0], c * torch.rsqrt(c.square().mean() + 1e-6))
