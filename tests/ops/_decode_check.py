"""Shared check of the CPU decode kernel (either implementation) against the reference."""
import torch

from torchair.ops.attention.cpu.decode import decode_attention_cpu
from torchair.ops.attention.decode import decode_attention_reference

TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.float16: {"atol": 2e-3, "rtol": 2e-3},
       torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2}}


def check_cpu_kernel(q, k, v, **kw):
    """``decode_attention_cpu`` equals ``decode_attention_reference`` within TOL; returns its
    output."""
    out = decode_attention_cpu(q, k, v, **kw)
    expected = decode_attention_reference(q, k, v, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected.float(), **TOL[q.dtype])
    return out
