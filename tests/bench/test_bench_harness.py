"""bench._harness's GPU timer (device time of a CUDA-graph replay)."""
from __future__ import annotations

import pytest
import torch

from bench import _harness as H


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_time_is_the_gpus_own_time_per_call():
    a = torch.randn(4096, 4096, device="cuda")
    small = H.device_time_us(lambda _: a[:256, :256] @ a[:256, :256])
    large = H.device_time_us(lambda _: a @ a)
    assert small is not None and large is not None and 0 < small < large
    assert 2 * 4096 ** 3 / (large * 1e-6) < 5e15  # below any GPU's fp32 peak: real time
    assert H.device_time_us(lambda _: a.sum().item()) is None  # a host sync cannot be captured
    assert H.device_time_us(lambda _: a @ a) is not None  # and CUDA is usable afterwards
