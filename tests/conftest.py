"""Shared test setup.

- Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors: TRITON_INTERPRET=1
  must be set before triton is first imported, so it is set here, before any test module loads.
- Every test starts and ends with a fresh Dynamo cache.
- Native CPU kernels are built into a private temporary directory (not the user's cache).
- ``torchair_log`` collects the torchair logger's records (it does not propagate to pytest).
"""
import os
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TORCHAIR_KERNEL_CACHE", tempfile.mkdtemp(prefix="torchair-kernels-"))

import torch._dynamo  # noqa: E402

from torchair.core.utils import logger as _torchair_logger  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def torchair_log():
    """Records of the torchair logger at DEBUG and above (it does not propagate to pytest)."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    _torchair_logger.addHandler(handler)
    old = _torchair_logger.level
    _torchair_logger.setLevel(logging.DEBUG)
    yield records
    _torchair_logger.removeHandler(handler)
    _torchair_logger.setLevel(old)
